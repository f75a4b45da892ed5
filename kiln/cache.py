"""Local disk cache of schedules, keyed by tuning key (`KILN_CACHE_DIR`).

Several ranks of one job on one node compile the same graphs at the same moment and share
this directory, so:
- a write goes to a temporary file in the same directory, then `os.replace` puts it in
  place atomically: a reader sees the old entry or the new one, never half of one;
- a read checks the content (format, key, status, and a sha256 of the schedule recorded
  beside it), so a truncated or foreign file is a miss, never a crash;
- a heuristic entry never replaces a tuned one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("kiln")

FORMAT = "kiln.cache/1"
STATUSES = ("heuristic", "tuned")
MAX_ENTRY_BYTES = 16 * 1024 * 1024


@dataclass(frozen=True)
class CachedSchedule:
    """One cache entry: the schedule as JSON (`Schedule.to_json()`) and its status."""

    key: str
    status: str
    schedule: dict[str, Any]


def _digest(schedule: dict[str, Any]) -> str:
    canonical = json.dumps(schedule, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _valid_key(key: str) -> bool:
    return isinstance(key, str) and len(key) == 64 and all(c in "0123456789abcdef" for c in key)


class ScheduleCache:
    """Schedules on disk under `root`, one JSON file per tuning key."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def path(self, key: str) -> Path:
        """Where the entry for `key` lives (two-level fan-out keeps directories small)."""
        if not _valid_key(key):
            raise ValueError(f"not a tuning key (64 lowercase hex digits): {key!r}")
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> CachedSchedule | None:
        """The entry for `key`, or None when absent, unreadable or not what it claims."""
        path = self.path(key)
        try:
            with open(path, "rb") as f:
                raw = f.read(MAX_ENTRY_BYTES + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.debug("kiln cache: cannot read %s: %s", path, exc)
            return None
        if len(raw) > MAX_ENTRY_BYTES:
            log.warning("kiln cache: ignoring oversized entry %s", path)
            return None
        try:
            doc = json.loads(raw)
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
        path = self.path(key)
        if status != "tuned":
            existing = self.get(key)
            if existing is not None and existing.status == "tuned":
                return False
        doc = {"format": FORMAT, "key": key, "status": status, "schedule": schedule,
               "sha256": _digest(schedule)}
        data = json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)
        path.parent.mkdir(parents=True, exist_ok=True)
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
        return True

    def discard(self, key: str) -> None:
        """Remove the entry for `key` (one that could not be used), if present."""
        with contextlib.suppress(FileNotFoundError):
            self.path(key).unlink()
