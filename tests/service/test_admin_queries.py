"""service.store.admin, the shapes the dashboard and the admin routes share (real PostgreSQL)."""

from __future__ import annotations

import pytest

from service import store
from service.context import ServiceContext
from service.models import utcnow
from service.store import admin
from tests.service.helpers import fake_submission

pytestmark = pytest.mark.services


@pytest.fixture
def entries(pg_ctx: ServiceContext) -> list[str]:
    """Five entries: hits 0..4, two tagged, two on sm_80, one tuned with timings."""
    keys = []
    with pg_ctx.transaction() as session:
        for i in range(5):
            sub = fake_submission(arch="sm_80" if i < 2 else "sm_90",
                                  name="NVIDIA A100" if i < 2 else "NVIDIA H200",
                                  tag="llm" if i % 2 else None)
            store.submit(session, sub)
            store.record_hits(session, {sub.key: i}, {sub.key: utcnow()})
            keys.append(sub.key)
        store.publish_schedule(session, keys[4], "tuned", {"kernels": []}, [],
                               {"eager_ms": 3.0, "heuristic_ms": 2.0, "tuned_ms": 1.5,
                                "tuning_s": 9.0})
    return keys


def test_list_filters_sorts_and_pages(pg_ctx: ServiceContext, entries: list[str]) -> None:
    with pg_ctx.transaction() as session:
        page = admin.list_entries(session, sort="hits", order="asc", per_page=2, page=2)
        assert page["total"] == 5 and [i["hits"] for i in page["items"]] == [2, 3]
        assert admin.list_entries(session, tag="llm")["total"] == 2
        assert admin.list_entries(session, target="sm_80")["total"] == 2
        assert admin.list_entries(session, status="tuned")["items"][0]["key"] == entries[4]
        found = admin.list_entries(session, q=entries[3][:10])
        assert [i["key"] for i in found["items"]] == [entries[3]]
        best = admin.list_entries(session, sort="speedup")["items"][0]
        assert best["speedup"] == 2.0 and best["tuning_s"] == 9.0
        assert set(best) >= {"key", "graph_hash", "status", "target", "tag", "created_at",
                             "last_used_at", "hits", "eager_ms", "heuristic_ms", "tuned_ms",
                             "speedup", "tuning_s"}
        for bad in ({"sort": "nope"}, {"order": "up"}, {"status": "x"}, {"page": 0}):
            with pytest.raises(ValueError):
                admin.list_entries(session, **bad)


def test_detail_stats_and_jobs(pg_ctx: ServiceContext, entries: list[str]) -> None:
    with pg_ctx.transaction() as session:
        detail = admin.entry_detail(session, entries[4])
        assert detail["status"] == "tuned" and detail["op_summary"] == {"aten.add.Tensor": 1}
        assert detail["jobs"][0]["status"] == "queued" and detail["kernels"] == []
        assert admin.entry_detail(session, "f" * 64) is None
        stats = admin.stats(session, {"build": 5})
        assert stats["entries_by_status"] == {"pending": 4, "heuristic": 0, "tuned": 1,
                                              "failed": 0, "invalidated": 0}
        assert stats["speedups"] == [2.0] and stats["queue_depth"] == {"build": 5}
        assert stats["tuned_fraction"] == 1.0 and stats["gpu_entries_ready"] == 1
        assert stats["jobs_waiting"] == {"build": {"queued": 5, "running": 0}}
        jobs = admin.list_jobs(session, status="queued", limit=3)["items"]
        assert len(jobs) == 3 and {"id", "key", "status", "progress", "attempts", "error",
                                   "history"} <= set(jobs[0])


def test_speedups_and_tuned_fraction_leave_cpu_targets_out(pg_ctx: ServiceContext,
                                                           entries: list[str]) -> None:
    """Interpreter times are no speed: a CPU entry's 'speedup' would swamp the plot."""
    with pg_ctx.transaction() as session:
        cpu = fake_submission(arch="cpu")
        store.submit(session, cpu)
        for key, status, timings in ((cpu.key, "tuned", {"eager_ms": 900.0, "tuned_ms": 1.0}),
                                     (entries[3], "heuristic", {"heuristic_ms": 2.0})):
            assert store.publish_schedule(session, key, status, {"kernels": []}, [], timings)
        stats = admin.stats(session)
    assert stats["speedups"] == [2.0]
    assert stats["gpu_entries_ready"] == 2 and stats["tuned_fraction"] == 0.5
    assert stats["entries_by_status"]["tuned"] == 2  # the count itself keeps every target
