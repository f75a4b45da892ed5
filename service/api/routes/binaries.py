"""`GET /v1/binaries?keys=k1,k2,...`: compiled kernels by Triton cache key, for clients that
would otherwise compile them (docs/client.md, "Compiled kernels from the service")."""

from __future__ import annotations

import base64
from typing import Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool

from service import store
from service.api.deps import Client, Ctx
from service.context import ServiceContext
from service.errors import ApiError
from service.store.binaries import KEY_RE, MAX_KEYS

router = APIRouter(prefix="/v1", tags=["binaries"])


def _lookup(ctx: ServiceContext, keys: list[str]) -> dict[str, Any]:
    with ctx.transaction() as session:
        found, left_out = store.binaries_by_keys(session, keys)
    for binary in found:
        for f in binary["files"]:
            f["data"] = base64.b64encode(f["data"]).decode("ascii")
    return {"binaries": found, "left_out": left_out}


@router.get("/binaries")
async def get_binaries(ctx: Ctx, _who: Client,
                       keys: str = Query(max_length=MAX_KEYS * 65,
                                         description="Triton cache keys, comma-separated")
                       ) -> dict[str, Any]:
    """The stored binaries among `keys` (up to 256): `{"binaries": [{"key", "source_hash",
    "arch", "files": [{"name", "sha256", "data": base64}]}], "left_out": [keys found but
    not sent, to keep the answer small: ask again]}`. Keys not stored are simply absent.
    Each file's sha256 was computed when the worker stored it; a client checks the bytes."""
    wanted = [k for k in keys.split(",") if k]
    if not wanted or len(wanted) > MAX_KEYS or not all(KEY_RE.match(k) for k in wanted):
        raise ApiError(422, "invalid_keys",
                       f"keys: 1 to {MAX_KEYS} comma-separated 64-hex-digit Triton cache keys")
    return await run_in_threadpool(_lookup, ctx, wanted)
