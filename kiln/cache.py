"""Local disk cache of schedules, keyed by tuning key (`KILN_CACHE_DIR`).

Several ranks of one job on one node compile the same graphs at the same moment and share
this directory, so:
- a write goes to a temporary file in the same directory, then `os.replace` puts it in
  place atomically: a reader sees the old entry or the new one, never half of one;
- a read checks the content (format, key, status, and a sha256 of the schedule recorded
  beside it) after decoding it within bounds (`kiln.bounded_json`: size, containers,
  nesting), so a truncated, foreign or hostile file is a miss, never a crash;
- a heuristic entry never replaces a tuned one;
- the directory has a size cap (`KILN_CACHE_MAX_BYTES`): a write that takes it past the cap
  evicts the least recently used entries (a read marks an entry used by touching its mtime,
  since atime is often off) down to 90% of it, so the next writes do not each pay a scan.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln import bounded_json

log = logging.getLogger("kiln")

FORMAT = "kiln.cache/1"
STATUSES = ("heuristic", "tuned")
MAX_ENTRY_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_BYTES = 1 << 30  # schedules are kilobytes: a gigabyte holds many thousands
EVICT_TO = 0.9  # an eviction frees down to this share of the cap
STALE_TMP_S = 3600.0  # a temporary file this old is left over from a crashed writer


@dataclass(frozen=True)
class CachedSchedule:
    """One cache entry: the schedule as JSON (`Schedule.to_json()`) and its status."""

    key: str
    status: str
    schedule: dict[str, Any]


@dataclass(frozen=True)
class EntryFile:
    """One file in the cache as `scan()` finds it; `used` is its mtime (last write or read)."""

    key: str
    path: Path
    size: int
    used: float


@dataclass(frozen=True)
class PruneResult:
    """What `prune()` removed (or, with `dry_run`, would remove) and what stays."""

    removed: int
    freed_bytes: int
    kept: int
    kept_bytes: int


def _digest(schedule: dict[str, Any]) -> str:
    canonical = json.dumps(schedule, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _valid_key(key: str) -> bool:
    return isinstance(key, str) and len(key) == 64 and all(c in "0123456789abcdef" for c in key)


class FileCache:
    """JSON files on disk under `root`, one per 64-hex key, at most `max_bytes` of them
    (None: no cap): atomic writes, least recently used evicted. Subclasses say what a file
    holds and how to check it."""

    def __init__(self, root: str | os.PathLike[str],
                 max_bytes: int | None = DEFAULT_MAX_BYTES) -> None:
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"cache size cap must be >= 0 bytes, not {max_bytes}")
        self.root = Path(root)
        self.max_bytes = max_bytes
        # This process's running total of the bytes under root: scanned on the first write,
        # then added to; other processes' writes are seen at the next scan (over the cap).
        self._usage: int | None = None

    def path(self, key: str) -> Path:
        """Where the entry for `key` lives (two-level fan-out keeps directories small)."""
        if not _valid_key(key):
            raise ValueError(f"not a tuning key (64 lowercase hex digits): {key!r}")
        return self.root / key[:2] / f"{key}.json"

    def read(self, key: str, max_bytes: int = MAX_ENTRY_BYTES) -> bytes | None:
        """The file for `key` as it is on disk; None when absent, unreadable or oversized."""
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                raw = f.read(max_bytes + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.debug("kiln cache: cannot read %s: %s", path, exc)
            return None
        if len(raw) > max_bytes:
            log.warning("kiln cache: ignoring oversized entry %s", path)
            return None
        return raw

    def touch(self, key: str) -> None:
        """Mark the entry used now: last in line for eviction."""
        with contextlib.suppress(OSError):
            os.utime(self.path(key))

    def write(self, key: str, data: str) -> None:
        """Put `data` in place for `key` atomically, then evict past the cap."""
        path = self.path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            replaced = path.stat().st_size
        except FileNotFoundError:
            replaced = 0
        fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self._account(len(data.encode()) - replaced, keep=key)



    def _account(self, added: int, keep: str) -> None:
        """Add a write to the running total; past the cap, evict the least recently used."""
        if self.max_bytes is None:
            return
        if self._usage is None:
            self._usage = sum(f.size for f in self.scan())
        else:
            self._usage += added
        if self._usage > self.max_bytes:
            result = self.prune(max_bytes=int(self.max_bytes * EVICT_TO), keep=keep)
            self._usage = result.kept_bytes
            if result.removed:
                log.debug("kiln cache: evicted %d entries (%d bytes) to stay under %d bytes",
                          result.removed, result.freed_bytes, self.max_bytes)

    def scan(self) -> Iterator[EntryFile]:
        """Every entry file under root (valid or not), in no particular order."""
        try:
            shards = [d for d in os.scandir(self.root) if len(d.name) == 2 and d.is_dir()]
        except FileNotFoundError:
            return
        for shard in shards:
            try:
                files = list(os.scandir(shard.path))
            except OSError:  # removed meanwhile, or unreadable
                continue
            for f in files:
                key = f.name.removesuffix(".json")
                if not f.name.endswith(".json") or not _valid_key(key):
                    continue
                try:
                    st = f.stat()
                except FileNotFoundError:
                    continue
                yield EntryFile(key=key, path=Path(f.path), size=st.st_size, used=st.st_mtime)

    def prune(self, max_bytes: int | None = None, older_than_s: float | None = None,
              keep: str | None = None, dry_run: bool = False) -> PruneResult:
        """Remove entries unused for `older_than_s` seconds, then the least recently used
        until at most `max_bytes` remain (the entry `keep` stays regardless), and
        temporary files that crashed writers left. Safe beside concurrent readers and
        writers: a reader that loses its entry sees a miss."""
        now = time.time()
        cutoff = None if older_than_s is None else now - older_than_s
        drop: list[EntryFile] = []
        kept: list[EntryFile] = []
        for f in sorted(self.scan(), key=lambda f: (f.used, f.key)):  # oldest first
            unused = cutoff is not None and f.used < cutoff and f.key != keep
            (drop if unused else kept).append(f)
        total = sum(f.size for f in kept)
        if max_bytes is not None and total > max_bytes:
            survivors = []
            for f in kept:
                if total > max_bytes and f.key != keep:
                    drop.append(f)
                    total -= f.size
                else:
                    survivors.append(f)
            kept = survivors
        removed = freed = 0
        for f in drop:
            if not dry_run:
                try:
                    f.path.unlink()
                except FileNotFoundError:
                    continue
            removed += 1
            freed += f.size
        if not dry_run:
            self._remove_stale_temporaries(now)
        return PruneResult(removed=removed, freed_bytes=freed, kept=len(kept), kept_bytes=total)

    def _remove_stale_temporaries(self, now: float) -> None:
        for tmp in self.root.glob("*/.*.tmp"):
            with contextlib.suppress(OSError):
                if tmp.stat().st_mtime < now - STALE_TMP_S:
                    tmp.unlink()

    def discard(self, key: str) -> None:
        """Remove the entry for `key` (one that could not be used), if present."""
        with contextlib.suppress(FileNotFoundError):
            self.path(key).unlink()


class ScheduleCache(FileCache):
    """Schedules, one file per tuning key."""

    def get(self, key: str) -> CachedSchedule | None:
        """The entry for `key`, or None when absent, unreadable or not what it claims; a
        hit marks the entry used."""
        entry = self.peek(key)
        if entry is not None:
            self.touch(key)
        return entry

    def peek(self, key: str) -> CachedSchedule | None:
        """`get` without marking the entry used (listing the cache is not using it)."""
        raw = self.read(key)
        if raw is None:
            return None
        path = self.path(key)
        try:
            doc = bounded_json.loads(raw, max_bytes=MAX_ENTRY_BYTES)
            ok = (
                isinstance(doc, dict)
                and doc.get("format") == FORMAT
                and doc.get("key") == key
                and doc.get("status") in STATUSES
                and isinstance(doc.get("schedule"), dict)
                and doc.get("sha256") == _digest(doc["schedule"])
            )
        except (ValueError, TypeError):
            ok = False
        if not ok:
            log.warning("kiln cache: ignoring corrupt or foreign entry %s", path)
            return None
        return CachedSchedule(key=key, status=doc["status"], schedule=doc["schedule"])

    def put(self, key: str, status: str, schedule: dict[str, Any]) -> bool:
        """Store `schedule` for `key` atomically. A heuristic entry does not replace a
        tuned one. Returns whether the entry was written."""
        if status not in STATUSES:
            raise ValueError(f"cache status must be one of {STATUSES}, not {status!r}")
        if status != "tuned":
            existing = self.peek(key)
            if existing is not None and existing.status == "tuned":
                return False
        doc = {"format": FORMAT, "key": key, "status": status, "schedule": schedule,
               "sha256": _digest(schedule)}
        self.write(key, json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False))
        return True


class PlanCache(FileCache):
    """Plans (kiln.plan/1 JSON text), one file per plan key, under the schedule cache's
    `plans/` (`kiln.plans`); the reader parses and checks what it reads."""

    def get(self, key: str, max_bytes: int) -> bytes | None:
        raw = self.read(key, max_bytes)
        if raw is not None:
            self.touch(key)
        return raw
