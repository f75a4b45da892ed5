"""Fixtures for the dashboard tests: a migrated PostgreSQL service context and entries."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from service import store
from service.context import ServiceContext
from service.migrate import upgrade
from service.queue import InProcessQueue
from service.settings import Settings

ADMIN_TOKEN = "kiln_dashboard-test-admin-token"

KERNEL_SOURCE = '''@triton.jit
def fused_add_relu_0(in_ptr0, in_ptr1, out_ptr0, xnumel, XBLOCK: tl.constexpr):
    # fused aten nodes: n0 aten.add.Tensor, n1 aten.relu.default
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    xmask = xindex < xnumel
    tmp0 = tl.load(in_ptr0 + xindex, xmask) + tl.load(in_ptr1 + xindex, xmask)
    tl.store(out_ptr0 + xindex, tl.maximum(tmp0, 0.0), xmask)
'''


@pytest.fixture
def dash_settings(postgres_url: str) -> Settings:
    """Settings on a fresh, migrated PostgreSQL database with a known admin token."""
    upgrade(postgres_url)
    return Settings(database_url=postgres_url, admin_token=ADMIN_TOKEN, rate_limit_per_s=0)


@pytest.fixture
def dash_ctx(dash_settings: Settings) -> Iterator[ServiceContext]:
    """A ServiceContext on that database with the in-process queue."""
    ctx = ServiceContext(dash_settings, queue=InProcessQueue(dash_settings.lease_s))
    yield ctx
    ctx.close()


def fake_submission(tag: str | None = None) -> store.Submission:
    """A CPU-target submission with made-up hashes (the dashboard only displays them)."""
    graph_hash, key = uuid.uuid4().hex * 2, uuid.uuid4().hex * 2
    target = {"device_type": "cpu", "arch": "cpu", "name": "cpu", "torch": "2.13",
              "triton": "3.9.0", "compiler": "1"}
    return store.Submission(key=key, graph_hash=graph_hash, target=target, queue_class="cpu",
                            wire='{"format":"kiln.graph/1"}', tag=tag, num_nodes=2,
                            op_summary={"aten.add.Tensor": 1, "aten.relu.default": 1})


def seed_entry(ctx: ServiceContext, tag: str = "seed-mlp", tuning_s: float | None = None) -> str:
    """Store an entry with one kernel, a heuristic schedule and a few measured candidates
    (one failed) through the service's own store functions; returns its key."""
    submission = fake_submission(tag=tag)
    kernel = {"name": "fused_add_relu_0", "kind": "pointwise", "variant": "pointwise",
              "config": {"XBLOCK": 128, "num_warps": 4, "num_stages": 1},
              "nodes": ["n0", "n1"], "ops": ["aten.add.Tensor", "aten.relu.default"],
              "source": KERNEL_SOURCE, "source_hash": "ab" * 32, "heuristic_ms": 0.2}
    schedule = {"format": "kiln.schedule/1", "graph_hash": submission.graph_hash,
                "target": submission.target, "kernels": [kernel], "externs": []}
    with ctx.transaction() as session:
        store.submit(session, submission)
        store.publish_schedule(session, submission.key, "heuristic", schedule, [kernel],
                               {"eager_ms": 0.3, "heuristic_ms": 0.2, "tuning_s": tuning_s})
        store.add_measurements(session, submission.key, None, "test", [
            {"kernel": "fused_add_relu_0", "variant": "pointwise", "verified": True,
             "config": {"XBLOCK": x, "num_warps": 4, "num_stages": 1}, "ms": 0.1 + x / 1000,
             "error": None} for x in (64, 128, 256)] + [
            {"kernel": "fused_add_relu_0", "variant": "pointwise", "verified": False,
             "config": {"XBLOCK": 8192, "num_warps": 4, "num_stages": 1}, "ms": None,
             "error": "OutOfResources: shared memory"}])
    return submission.key
