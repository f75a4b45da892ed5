"""`kiln cache` and `kiln cache prune`, run as the real command on a real cache directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from kiln.cache import PlanCache, ScheduleCache

ROOT = Path(__file__).resolve().parents[2]
KEYS = [f"{i:02x}" * 32 for i in range(1, 5)]


def kiln(*args: str, cache_dir: Path, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("KILN_")}
    environ.update(KILN_CACHE_DIR=str(cache_dir), PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-m", "kiln.cli", *args], capture_output=True,
                          text=True, env=environ, cwd=ROOT, timeout=120)


def _fill(root: Path) -> int:
    """Four entries used 40, 20, 10 and 0 days ago (the first tuned); returns one's size."""
    cache = ScheduleCache(root)
    for days, key in zip((40, 20, 10, 0), KEYS, strict=True):
        cache.put(key, "tuned" if key == KEYS[0] else "heuristic", {"pad": "x" * 1000})
        at = time.time() - days * 86400
        os.utime(cache.path(key), (at, at))
    return cache.path(KEYS[1]).stat().st_size


def test_cache_shows_entries_and_size(tmp_path: Path) -> None:
    size = _fill(tmp_path)
    shown = kiln("cache", "--json", cache_dir=tmp_path, KILN_CACHE_MAX_BYTES="1M")
    assert shown.returncode == 0, shown.stderr
    summary = json.loads(shown.stdout)
    assert (summary["entries"], summary["tuned"], summary["heuristic"]) == (4, 1, 3)
    assert summary["bytes"] == sum(f.size for f in ScheduleCache(tmp_path).scan())
    assert summary["bytes"] >= 4 * size - 8 and summary["max_bytes"] == 1 << 20
    text = kiln("cache", cache_dir=tmp_path, KILN_CACHE_MAX_BYTES="1M")
    assert text.returncode == 0, text.stderr
    assert f"kiln schedule cache  {tmp_path}" in text.stdout
    assert "4 (tuned 1, heuristic 3)" in text.stdout and "of 1.0 MiB" in text.stdout
    assert "(40.0d ago)" in text.stdout  # the least recently used entry
    # Listing is not using: the oldest entry is still the oldest.
    assert min(ScheduleCache(tmp_path).scan(), key=lambda f: f.used).key == KEYS[0]


def test_prune_by_age_then_by_size_keeps_the_most_recently_used(tmp_path: Path) -> None:
    size = _fill(tmp_path)
    dry = kiln("cache", "prune", "--older-than", "30d", "--dry-run", cache_dir=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "would remove 1 entries" in dry.stdout and len(list(ScheduleCache(tmp_path).scan())) == 4
    aged = kiln("cache", "prune", "--older-than", "30d", cache_dir=tmp_path)
    assert "removed 1 entries" in aged.stdout and "3 entries" in aged.stdout
    sized = kiln("cache", "prune", "--max-size", str(size + 10), cache_dir=tmp_path)
    assert sized.returncode == 0, sized.stderr
    assert [f.key for f in ScheduleCache(tmp_path).scan()] == [KEYS[3]]
    # With no option, prune enforces the configured cap.
    capped = kiln("cache", "prune", cache_dir=tmp_path, KILN_CACHE_MAX_BYTES="0")
    assert "removed 1 entries" in capped.stdout and not list(ScheduleCache(tmp_path).scan())


def test_bad_values_are_one_line_errors(tmp_path: Path) -> None:
    for args, env, needle in (
            (("cache", "prune", "--older-than", "soon"), {}, "'soon' is not an age"),
            (("cache", "prune", "--max-size", "big"), {}, "'big' is not a size"),
            (("cache",), {"KILN_CACHE_MAX_BYTES": "big"}, "KILN_CACHE_MAX_BYTES='big'")):
        done = kiln(*args, cache_dir=tmp_path, **env)
        assert done.returncode in (1, 2) and needle in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) <= 2


def test_cache_counts_and_prunes_plans_beside_schedules(tmp_path: Path) -> None:
    _fill(tmp_path)
    plans = PlanCache(tmp_path / "plans")
    for days, key in ((40, KEYS[0]), (0, KEYS[1])):
        plans.write(key, '{"format": "kiln.plan/1"}')
        at = time.time() - days * 86400
        os.utime(plans.path(key), (at, at))
    shown = json.loads(kiln("cache", "--json", cache_dir=tmp_path).stdout)
    assert shown["entries"] == 4  # the plans are not schedule entries
    assert shown["plans"]["entries"] == 2 and shown["plans"]["bytes"] > 0
    (line,) = [ln for ln in kiln("cache", cache_dir=tmp_path).stdout.splitlines()
               if ln.startswith("plans ")]
    assert line.split()[1] == "2" and str(tmp_path / "plans") in line
    aged = kiln("cache", "prune", "--older-than", "30d", cache_dir=tmp_path)
    assert aged.returncode == 0, aged.stderr
    assert "removed 1 plans" in aged.stdout and "removed 1 entries" in aged.stdout
    assert [f.key for f in plans.scan()] == [KEYS[1]]
