"""Compiled kernel binaries: what the worker that compiled a kernel for a CUDA target stores
(`add_binaries`), and what clients fetch by Triton cache key (`binaries_by_keys`).

A binary is opaque bytes here, never loaded or executed: a Triton cache entry (its metadata
JSON and cubin) under the key Triton computes from its version, the kernel's source and
specialisation, the target and the compile options. Workers write through this module
directly (no HTTP upload exists); each file keeps the sha256 computed when it was stored,
and clients check the bytes they receive against it.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import KernelBinaryFileRow, KernelBinaryRow

MAX_FILE_BYTES = 16 << 20  # one cubin or metadata file
MAX_BINARY_BYTES = 24 << 20  # all files of one binary
MAX_FILES = 4
MAX_KEYS = 256  # keys in one lookup
MAX_ANSWER_BYTES = 20 << 20  # file bytes in one lookup answer (base64 adds a third)
KEY_RE = re.compile(r"[0-9a-f]{64}\Z")
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,150}\.(json|cubin)\Z")


class BinaryRefused(ValueError):
    """A binary record the store does not keep (malformed, too large)."""


def _check(record: dict[str, Any]) -> dict[str, bytes]:
    key, files = record.get("key"), record.get("files")
    if not isinstance(key, str) or not KEY_RE.match(key):
        raise BinaryRefused("a binary's key is 64 lowercase hex digits")
    if not isinstance(record.get("source_hash"), str) or not KEY_RE.match(record["source_hash"]):
        raise BinaryRefused(f"binary {key[:12]}: source_hash is 64 lowercase hex digits")
    if not isinstance(files, dict) or not 0 < len(files) <= MAX_FILES:
        raise BinaryRefused(f"binary {key[:12]}: 1 to {MAX_FILES} files")
    total = 0
    for name, data in files.items():
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise BinaryRefused(f"binary {key[:12]}: file name {str(name)[:60]!r} refused")
        if not isinstance(data, bytes) or len(data) > MAX_FILE_BYTES:
            raise BinaryRefused(f"binary {key[:12]}: file {name} is not bytes of at most "
                                f"{MAX_FILE_BYTES}")
        total += len(data)
    if total > MAX_BINARY_BYTES:
        raise BinaryRefused(f"binary {key[:12]}: {total} bytes > {MAX_BINARY_BYTES}")
    return files


def add_binaries(session: Session, records: list[dict[str, Any]], worker: str | None) -> int:
    """Store the binaries a worker compiled (`service.target_compile.TargetCompile.binaries`:
    `key`, `source_hash`, `arch`, `kernel`, `files` {name: bytes}), each file with its
    sha256; a key already stored is kept as it is (content-addressed: same key, same
    binary). Raises BinaryRefused for a malformed or oversized record, before writing any.
    Returns how many were new."""
    checked = [(record, _check(record)) for record in records]
    keys = [record["key"] for record, _ in checked]
    known = set(session.scalars(select(KernelBinaryRow.key).where(KernelBinaryRow.key.in_(keys))))
    added = 0
    for record, files in checked:
        if record["key"] in known:
            continue
        known.add(record["key"])
        session.add(KernelBinaryRow(key=record["key"], source_hash=record["source_hash"],
                                    arch=str(record.get("arch", ""))[:32],
                                    kernel=str(record.get("kernel", ""))[:200],
                                    size=sum(len(d) for d in files.values()),
                                    worker=worker[:200] if worker else None))
        session.flush()  # the parent row first: the files' foreign key names it
        for name, data in sorted(files.items()):
            session.add(KernelBinaryFileRow(key=record["key"], name=name,
                                            sha256=hashlib.sha256(data).hexdigest(), data=data))
        added += 1
    return added


def binaries_by_keys(session: Session, keys: list[str],
                     max_bytes: int = MAX_ANSWER_BYTES) -> tuple[list[dict[str, Any]], list[str]]:
    """The stored binaries among `keys` (`{"key", "source_hash", "arch", "files": [{"name",
    "sha256", "data": bytes}]}`), up to `max_bytes` of file data (at least one binary), and
    the keys found but left out to stay under it (asked for again)."""
    keys = list(dict.fromkeys(keys))
    rows = session.scalars(select(KernelBinaryRow).where(KernelBinaryRow.key.in_(keys))).all()
    by_key = {row.key: row for row in rows}
    chosen, left_out, total = [], [], 0
    for key in keys:
        row = by_key.get(key)
        if row is None:
            continue
        if chosen and total + row.size > max_bytes:
            left_out.append(key)
            continue
        total += row.size
        chosen.append(row)
    files: dict[str, list[dict[str, Any]]] = {row.key: [] for row in chosen}
    if chosen:  # every chosen binary's files in one query
        for f in session.scalars(select(KernelBinaryFileRow)
                                 .where(KernelBinaryFileRow.key.in_(list(files)))
                                 .order_by(KernelBinaryFileRow.key, KernelBinaryFileRow.name)):
            files[f.key].append({"name": f.name, "sha256": f.sha256, "data": bytes(f.data)})
    found = [{"key": row.key, "source_hash": row.source_hash, "arch": row.arch,
              "files": files[row.key]} for row in chosen]
    return found, left_out
