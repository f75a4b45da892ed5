"""Compiled kernels from the service (docs/client.md, same title; issue 14): the CPU worker's
target compile stores each distinct kernel's binary under the Triton cache key a client's
JIT computes; a fresh client fetches them, checks them, writes them into its Triton cache
and its JIT loads them without compiling; a tampered binary is refused and compiled there."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from service import store
from service.context import ServiceContext
from service.store.binaries import MAX_BINARY_BYTES, BinaryRefused
from tests.dashboard.live import LiveService, wait_for
from tests.service.helpers import gpu_target, wire_body

ROOT = Path(__file__).resolve().parents[2]


def _client_run(tmp: Path, url: str, graph: dict, schedule: dict) -> dict[str, Any]:
    """tests.kiln.binaries_client in a fresh process with empty Triton and kernel caches."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET" and not k.startswith("KILN_")}
    env.update(TRITON_CACHE_DIR=str(tmp / "triton"), KILN_KERNEL_DIR=str(tmp / "kernels"),
               KILN_COMPILE_WORKERS="2", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "tests.kiln.binaries_client", url],
                          input=json.dumps({"graph": graph, "schedule": schedule}), cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _heuristic(live: LiveService, body: dict) -> dict:
    """Submit `body` and wait for the CPU worker's heuristic schedule (compiled for sm_90)."""
    import httpx

    answer = httpx.post(f"{live.url}/v1/graphs", json=body, timeout=30).json()
    key = answer["key"]

    def ready() -> dict | None:
        doc = httpx.get(f"{live.url}/v1/schedules/{key}", timeout=10).json()
        return doc if doc.get("status") == "heuristic" else None

    return wait_for(ready, 300, "the heuristic schedule")


@pytest.mark.slow
@pytest.mark.services
def test_binaries_round_trip_and_a_tampered_one_is_compiled_locally(
        pg_ctx: ServiceContext, tmp_path: Path) -> None:
    body = wire_body("mlp.train_bwd", gpu_target())
    with LiveService(pg_ctx) as live:
        live.start_worker()
        doc = _heuristic(live, body)
        with pg_ctx.transaction() as session:
            stored = session.execute(text("SELECT key, source_hash FROM kernel_binaries")).all()
        sources = {k["source_hash"] for k in doc["schedule"]["kernels"] if k["source_hash"]}
        assert stored and {s for _, s in stored} <= sources

        # A fresh client: every compile job's binary comes from the service; the JIT then
        # finds each launch's binary in Triton's cache (it writes nothing).
        got = _client_run(tmp_path / "first", live.url, body["graph"], doc["schedule"])
        assert got["jobs"] >= 2 and got["compiled"] == 0, got
        assert sorted(got["placed"]) == sorted(got["keys"]) == sorted(k for k, _ in stored)
        assert got["fetched"] == got["jobs"] and got["refused"] == 0 and got["missed"] == 0
        assert got["warmup_cache_files"] == 0 and got["warned"] == []
        print(f"fetched {got['fetched']} binaries in {got['seconds']} s")

        # One cubin altered in the store: the client refuses it (one warning), installs the
        # others and compiles that kernel itself.
        tampered = stored[0][0]
        with pg_ctx.transaction() as session:
            session.execute(text("UPDATE kernel_binary_files SET data = :d WHERE key = :k "
                                 "AND name LIKE '%.cubin'"), {"d": b"\x7fELF not a cubin", "k": tampered})
        got = _client_run(tmp_path / "second", live.url, body["graph"], doc["schedule"])
        assert tampered not in got["placed"] and len(got["placed"]) == got["jobs"] - 1
        assert got["refused"] == 1 and got["warned"] == ["binary_refused"]
        assert sum("does not match its sha256" in w for w in got["warnings"]) == 1
        assert got["compiled"] + (got["warmup_cache_files"] > 0) >= 1  # compiled here
        cubins = list((tmp_path / "second" / "triton").rglob("*.cubin"))
        assert len(cubins) == got["jobs"] and all(b"not a cubin" not in c.read_bytes() for c in cubins)
        print(f"one compiled here, {got['fetched']} fetched: {got['seconds']} s")


def _record(key: str = "a" * 64, **files: bytes) -> dict[str, Any]:
    return {"key": key, "source_hash": "b" * 64, "arch": "sm_90", "kernel": "k_0",
            "files": files or {"k_1234.json": b"{}", "k_1234.cubin": b"\x7fELF"}}


@pytest.mark.services
def test_the_store_keeps_one_copy_and_refuses_what_is_malformed_or_too_big(
        pg_ctx: ServiceContext) -> None:
    with pg_ctx.transaction() as session:
        assert store.add_binaries(session, [_record(), _record()], "w1") == 1
        assert store.add_binaries(session, [_record()], "w2") == 0
    with pg_ctx.transaction() as session:
        found, left_out = store.binaries_by_keys(session, ["a" * 64, "c" * 64])
    assert left_out == [] and [b["key"] for b in found] == ["a" * 64]
    files = {f["name"]: f for f in found[0]["files"]}
    assert files["k_1234.cubin"]["sha256"] == hashlib.sha256(b"\x7fELF").hexdigest()
    for bad, why in [(_record("A" * 64), "64 lowercase hex"),
                     (_record(**{"../x.cubin": b""}), "file name"),
                     (_record(**{"k.json": b"{}", "k.so": b""}), "file name"),
                     (_record(**{"k.cubin": b"x" * (MAX_BINARY_BYTES // 2 + 1),
                                 "k.json": b"x" * (MAX_BINARY_BYTES // 2 + 1)}), "bytes >")]:
        with pg_ctx.transaction() as session, pytest.raises(BinaryRefused, match=why):
            store.add_binaries(session, [_record("d" * 64), bad], "w")
    with pg_ctx.transaction() as session:  # nothing of a refused batch was written
        assert store.binaries_by_keys(session, ["d" * 64]) == ([], [])
        # An answer stays under its byte budget: what does not fit is named, to ask again.
        store.add_binaries(session, [_record("e" * 64)], "w")
        found, left_out = store.binaries_by_keys(session, ["a" * 64, "e" * 64], max_bytes=1)
    assert [b["key"] for b in found] == ["a" * 64] and left_out == ["e" * 64]


@pytest.mark.services
def test_the_binaries_route_answers_by_key_and_checks_its_query(client: Any,
                                                                pg_ctx: ServiceContext) -> None:
    with pg_ctx.transaction() as session:
        store.add_binaries(session, [_record()], "w")
    doc = client.get(f"/v1/binaries?keys={'a' * 64},{'f' * 64}").json()
    assert doc["left_out"] == [] and [b["key"] for b in doc["binaries"]] == ["a" * 64]
    files = {f["name"]: base64.b64decode(f["data"]) for f in doc["binaries"][0]["files"]}
    assert files == {"k_1234.json": b"{}", "k_1234.cubin": b"\x7fELF"}
    for bad in ["", "xyz", ",".join(["a" * 64] * 257)]:
        answer = client.get(f"/v1/binaries?keys={bad}")
        assert answer.status_code == 422, bad
    assert client.post("/v1/binaries", json={"keys": ["a" * 64]}).status_code in (403, 405)
