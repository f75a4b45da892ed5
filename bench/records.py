"""Where a benchmark's JSON record says it came from, and how a run joins a results file.

`bench/results/` keeps one current file per suite (its README names each); a run that
measures part of a suite, or one more run of a tool whose file keeps several, joins that
file instead of adding one beside it. Git keeps the older versions.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def stamp() -> dict[str, str | None]:
    """The commit the run measured (None outside a git checkout) and when it ran (UTC)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return {"commit": commit or None, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def append_run(path: Path, record: dict[str, Any]) -> dict[str, Any]:
    """`path`'s record (`{"runs": [...]}`, other keys kept) with `record` added as its last run."""
    folded = json.loads(path.read_text()) if path.exists() else {"runs": []}
    if "runs" not in folded:
        raise ValueError(f"{path} is not a file of runs (no 'runs' list): pass --out for a new file")
    folded["runs"].append(record)
    return folded
