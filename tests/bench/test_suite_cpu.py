"""`python -m bench.suite --device cpu` end to end on one small case (interpreter)."""

from __future__ import annotations

import json

import pytest

from bench import suite

pytestmark = pytest.mark.xdist_group("tuner_runner")

REQUIRED = {
    "case",
    "eager_ms",
    "inductor_ms",
    "inductor_max_autotune_ms",
    "kiln_heuristic_ms",
    "kiln_tuned_ms",
    "roofline_fraction",
    "tuning_s",
    "trials",
}


def test_bench_cpu_checks_kiln_against_eager_and_writes_json(tmp_path, capsys) -> None:
    out = tmp_path / "cpu.json"
    code = suite.main(
        ["--device", "cpu", "--cases", "rmsnorm", "--tune-trials", "2", "--out", str(out)]
    )
    assert code == 0
    result = json.loads(out.read_text())
    (run,) = result["runs"]
    assert {"device", "torch", "triton", "command", "commit", "when"} <= run.keys()
    (row,) = result["cases"]
    assert row["run"] == 0
    assert REQUIRED <= row.keys()
    assert not row.get("errors"), row.get("errors")
    assert row["kiln_heuristic_ms"] and row["kiln_tuned_ms"]  # both verified against eager
    assert 1 <= row["trials"] <= 2
    printed = capsys.readouterr().out
    assert printed.rstrip().splitlines()[-1].startswith("JSON:")
    assert "geomean" in printed


def _record(command: str, cases: list[str]) -> dict:
    return {"notes": {}, "runs": [{"command": command}],
            "cases": [{"case": c, "eager_ms": 1.0, "run": 0} for c in cases]}


def test_merge_replaces_the_rows_measured_again_and_drops_runs_left_without_rows() -> None:
    first = _record("first", ["a", "b"])
    second = suite.merged(first, _record("second", ["b", "c"]))
    assert [(r["case"], second["runs"][r["run"]]["command"]) for r in second["cases"]] == [
        ("a", "first"), ("b", "second"), ("c", "second")]
    third = suite.merged(second, _record("third", ["a"]))
    assert [run["command"] for run in third["runs"]] == ["second", "third"]
    assert [(r["case"], third["runs"][r["run"]]["command"]) for r in third["cases"]] == [
        ("a", "third"), ("b", "second"), ("c", "second")]


def test_bench_rejects_unknown_cases() -> None:
    with pytest.raises(SystemExit):
        suite.main(["--device", "cpu", "--cases", "nope"])
