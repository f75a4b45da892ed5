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
    assert {"device", "torch", "triton", "command", "cases"} <= result.keys()
    (row,) = result["cases"]
    assert REQUIRED <= row.keys()
    assert not row.get("errors"), row.get("errors")
    assert row["kiln_heuristic_ms"] and row["kiln_tuned_ms"]  # both verified against eager
    assert 1 <= row["trials"] <= 2
    printed = capsys.readouterr().out
    assert printed.rstrip().splitlines()[-1].startswith("JSON:")
    assert "geomean" in printed


def test_bench_rejects_unknown_cases() -> None:
    with pytest.raises(SystemExit):
        suite.main(["--device", "cpu", "--cases", "nope"])
