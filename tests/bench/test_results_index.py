"""bench/results keeps one current file per suite, each explained once in its README."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench.records import append_run

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results"
MOST_FILES = 8


def _files() -> set[str]:
    return {p.name for p in RESULTS.glob("*.json")}


def test_results_hold_at_most_eight_files_each_valid_json() -> None:
    files = _files()
    assert 0 < len(files) <= MOST_FILES, sorted(files)
    for name in files:
        json.loads((RESULTS / name).read_text())


def test_the_readme_names_each_file_once_under_its_heading_and_no_other() -> None:
    readme = (RESULTS / "README.md").read_text()
    headings = re.findall(r"^## `([^`]+)`$", readme, flags=re.MULTILINE)
    assert sorted(headings) == sorted(_files())
    named = re.findall(r"[\w.-]+\.json\b", readme)
    assert sorted(named) == sorted(headings), "a file named in the README outside its heading"


def test_a_run_joins_the_runs_of_its_file_and_a_file_without_runs_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "flow.json"
    assert append_run(path, {"command": "first"}) == {"runs": [{"command": "first"}]}
    path.write_text(json.dumps({"what": "w", "runs": [{"command": "first"}]}))
    assert append_run(path, {"command": "second"}) == {
        "what": "w", "runs": [{"command": "first"}, {"command": "second"}]}
    path.write_text(json.dumps({"command": "a single record"}))
    with pytest.raises(ValueError, match="not a file of runs"):
        append_run(path, {"command": "third"})
