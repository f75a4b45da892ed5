"""Client configuration (environment and kiln.configure), the local schedule cache (atomic,
content-validated, safe with concurrent writers) and the once-per-cause warnings."""

from __future__ import annotations

import json
import multiprocessing
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest

import kiln
from kiln import config as kiln_config
from kiln import degrade
from kiln.cache import ScheduleCache

KEY = "0f" * 32


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    for var in list(kiln_config._ENV):
        monkeypatch.delenv(var, raising=False)
    kiln.configure(reset=True)
    degrade.reset()
    yield
    kiln.configure(reset=True)
    degrade.reset()


def test_environment_sets_the_config(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_URL", "http://kiln.internal:9000")
    monkeypatch.setenv("KILN_TOKEN", "t0k")
    monkeypatch.setenv("KILN_MODE", "ASYNC")
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KILN_TIMEOUT", "3.5")
    monkeypatch.setenv("KILN_WAIT_TIMEOUT", "7")
    c = kiln_config.current()
    assert (c.url, c.token, c.mode, c.schedule_dir) == ("http://kiln.internal:9000", "t0k",
                                                        "async", tmp_path)
    assert (c.request_timeout, c.wait_timeout) == (3.5, 7.0)


def test_configure_wins_over_the_environment_until_reset(monkeypatch):
    monkeypatch.setenv("KILN_MODE", "async")
    assert kiln.configure(mode="wait", wait_timeout=1).mode == "wait"
    assert kiln_config.current().mode == "wait"
    assert kiln_config.current().wait_timeout == 1
    kiln.configure(reset=True)
    assert kiln_config.current().mode == "async"


def test_url_off_means_no_service(monkeypatch):
    monkeypatch.setenv("KILN_URL", "off")
    assert kiln_config.current().url is None


@pytest.mark.parametrize(("var", "value"), [("KILN_MODE", "sometimes"),
                                            ("KILN_TIMEOUT", "soon"),
                                            ("KILN_RETRIES", "-1")])
def test_bad_environment_values_are_clear_errors(monkeypatch, var, value):
    monkeypatch.setenv(var, value)
    with pytest.raises(ValueError, match="KILN_|mode|retries"):
        kiln_config.current()


def test_configure_rejects_unknown_options_and_keeps_the_old_config():
    kiln.configure(mode="async")
    with pytest.raises(TypeError, match="unknown option"):
        kiln.configure(modd="wait")
    with pytest.raises(ValueError, match="mode"):
        kiln.configure(mode="later")
    assert kiln_config.current().mode == "async"


def test_import_kiln_is_light():
    code = ("import sys, kiln; heavy = [m for m in ('torch', 'triton', 'compiler', 'fastapi') "
            "if m in sys.modules]; print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=Path(__file__).parents[2])
    assert out.stdout.strip() == "[]"


# -- cache -------------------------------------------------------------------------------


def test_cache_round_trip_and_tuned_is_never_replaced_by_heuristic(tmp_path):
    cache = ScheduleCache(tmp_path)
    assert cache.get(KEY) is None
    assert cache.put(KEY, "heuristic", {"v": 1})
    assert cache.get(KEY).schedule == {"v": 1}
    assert cache.put(KEY, "tuned", {"v": 2})
    assert not cache.put(KEY, "heuristic", {"v": 3})
    entry = cache.get(KEY)
    assert (entry.status, entry.schedule) == ("tuned", {"v": 2})
    assert not list(cache.path(KEY).parent.glob("*.tmp"))  # no temporary left behind


@pytest.mark.parametrize("damage", ["truncate", "tamper", "other_key", "not_json"])
def test_corrupt_cache_entries_are_misses(tmp_path, damage):
    cache = ScheduleCache(tmp_path)
    cache.put(KEY, "tuned", {"kernels": [1, 2, 3]})
    path = cache.path(KEY)
    text = path.read_text()
    if damage == "truncate":
        path.write_text(text[: len(text) // 2])
    elif damage == "tamper":
        doc = json.loads(text)
        doc["schedule"]["kernels"] = [9]
        path.write_text(json.dumps(doc))
    elif damage == "other_key":
        doc = json.loads(text)
        doc["key"] = "1" * 64
        path.write_text(json.dumps(doc))
    else:
        path.write_bytes(b"\x00\xff garbage")
    assert cache.get(KEY) is None


def test_cache_rejects_keys_that_are_not_tuning_keys(tmp_path):
    with pytest.raises(ValueError, match="tuning key"):
        ScheduleCache(tmp_path).path("../../etc/passwd")


def _hammer(root: str, worker: int, rounds: int) -> int:
    cache = ScheduleCache(root)
    bad = 0
    for i in range(rounds):
        cache.put(KEY, "heuristic", {"worker": worker, "i": i, "pad": "x" * 20000})
        entry = cache.get(KEY)
        if entry is None or set(entry.schedule) != {"worker", "i", "pad"}:
            bad += 1
    return bad


def test_concurrent_writers_on_one_node_never_expose_a_partial_entry(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        bad = pool.starmap(_hammer, [(str(tmp_path), w, 40) for w in range(4)])
    assert bad == [0, 0, 0, 0]
    assert ScheduleCache(tmp_path).get(KEY) is not None


def _keys(n: int) -> list[str]:
    return [f"{i:02x}" * 32 for i in range(1, n + 1)]


def test_cache_size_cap_evicts_the_least_recently_used_on_write(tmp_path):
    """Writes past the cap evict down to 90% of it, oldest use first; a read counts as a
    use (mtime, since atime is often off), so a schedule read every run stays."""
    pad = {"pad": "x" * 4000}
    keys = _keys(6)
    cache = ScheduleCache(tmp_path, max_bytes=10**9)
    cache.put(keys[0], "tuned", pad)
    size = cache.path(keys[0]).stat().st_size
    capped = ScheduleCache(tmp_path, max_bytes=int(size * 3.5))
    for key in keys[1:3]:
        capped.put(key, "heuristic", pad)
    for age, key in zip((300, 200, 100), keys[:3], strict=True):  # keys[0] used longest ago
        os.utime(capped.path(key), (time.time() - age, time.time() - age))
    assert capped.get(keys[0]) is not None  # read now: most recently used
    capped.put(keys[3], "heuristic", pad)  # 4 entries > 3.5: evict to <= 3.15 entries
    left = {f.key for f in capped.scan()}
    assert left == {keys[0], keys[2], keys[3]}, "keys[1] was the least recently used"
    assert sum(f.size for f in capped.scan()) <= capped.max_bytes
    # Another process's writes are seen when the running total passes the cap.
    other = ScheduleCache(tmp_path, max_bytes=None)
    other.put(keys[4], "heuristic", pad)
    capped.put(keys[5], "heuristic", pad)
    assert sum(f.size for f in capped.scan()) <= capped.max_bytes
    assert capped.get(keys[5]) is not None  # the entry just written always stays


def test_cache_prune_by_age_and_size_and_stale_temporaries(tmp_path):
    cache = ScheduleCache(tmp_path, max_bytes=None)
    keys = _keys(3)
    for age, key in zip((40, 20, 0), keys, strict=True):
        cache.put(key, "tuned", {"k": key})
        days = time.time() - age * 86400
        os.utime(cache.path(key), (days, days))
    stale = cache.path(keys[0]).parent / ".0101010101010101.x.tmp"
    stale.write_text("half")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    dry = cache.prune(older_than_s=30 * 86400, dry_run=True)
    assert (dry.removed, dry.kept) == (1, 2) and cache.peek(keys[0]) is not None
    assert stale.exists()
    first = cache.prune(older_than_s=30 * 86400)
    assert first.removed == 1 and {f.key for f in cache.scan()} == {keys[1], keys[2]}
    assert not stale.exists()
    size = cache.path(keys[2]).stat().st_size
    second = cache.prune(max_bytes=size)
    assert (second.removed, second.kept, second.kept_bytes) == (1, 1, size)
    assert [f.key for f in cache.scan()] == [keys[2]]
    assert cache.prune(max_bytes=0).kept == 0


def test_cache_cap_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_CACHE_MAX_BYTES", "512M")
    assert kiln_config.current().cache_max_bytes == 512 << 20
    monkeypatch.setenv("KILN_CACHE_MAX_BYTES", "lots")
    with pytest.raises(ValueError, match="KILN_CACHE_MAX_BYTES='lots' is not valid"):
        kiln_config.current()
    monkeypatch.delenv("KILN_CACHE_MAX_BYTES")
    assert kiln_config.current().cache_max_bytes == 1 << 30


# -- warnings ----------------------------------------------------------------------------


def test_one_warning_per_cause_and_every_occurrence_counted():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(5):
            degrade.warn_once("unreachable", url="http://x")
        degrade.warn_once("timeout", url="http://x")
    messages = [str(w.message) for w in caught if issubclass(w.category, kiln.KilnWarning)]
    assert len(messages) == 2
    assert "cannot be reached" in messages[0] and "http://x" in messages[0]
    stats = kiln.stats()
    assert stats["fallback:unreachable"] == 5 and stats["fallback:timeout"] == 1


def test_a_warning_from_a_script_read_from_stdin_is_given_not_raised(tmp_path):
    """User code with no source (`python - < script.py`): `warnings` cannot load its lines
    (ImportError: '__main__' is not a built-in module), and the warning still shows."""
    import subprocess
    import sys

    script = ("import warnings\nwarnings.simplefilter('always')\n"
              "from kiln import degrade\n"
              "degrade.warn_once('unreachable', url='http://x')\nprint('done')\n")
    run = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr
    assert "done" in run.stdout and "cannot be reached" in run.stderr
    assert "ImportError" not in run.stderr
