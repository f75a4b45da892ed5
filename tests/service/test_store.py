"""Submissions, dedupe and job transitions in the database (real PostgreSQL)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import func, select

from service import store
from service.context import ServiceContext
from service.models import JobRow, ScheduleRow
from tests.service.helpers import fake_submission

pytestmark = pytest.mark.services


def test_concurrent_submissions_of_one_key_make_one_job(pg_ctx: ServiceContext) -> None:
    sub = fake_submission()

    def one(_: int) -> bool:
        with pg_ctx.transaction() as session:
            return store.submit(session, sub)[2]

    with ThreadPoolExecutor(16) as pool:
        enqueues = list(pool.map(one, range(64)))
    assert enqueues.count(True) == 1
    with pg_ctx.transaction() as session:
        assert session.scalar(select(func.count()).select_from(JobRow)) == 1
        assert session.scalar(select(func.count()).select_from(ScheduleRow)) == 1


def test_miss_reasons_compare_with_entries_of_the_same_graph(pg_ctx: ServiceContext) -> None:
    base = fake_submission(arch="sm_90", name="NVIDIA H200")
    with pg_ctx.transaction() as session:
        assert store.miss_reason(session, base.key, base.graph_hash, base.target) == "unknown_graph"
        store.submit(session, base)
    cases = {
        "other_gpu": fake_submission(base.graph_hash, arch="sm_80", name="NVIDIA A100"),
        "other_versions": fake_submission(base.graph_hash, arch="sm_90", name="NVIDIA H200",
                                          triton_v="3.6.0"),
        "other_compiler": fake_submission(base.graph_hash, arch="sm_90", name="NVIDIA H200",
                                          comp="2"),
    }
    with pg_ctx.transaction() as session:
        for reason, sub in cases.items():
            assert store.miss_reason(session, sub.key, sub.graph_hash, sub.target) == reason


def test_claim_counts_attempts_and_expired_leases_are_taken_over(pg_ctx: ServiceContext) -> None:
    sub = fake_submission()
    with pg_ctx.transaction() as session:
        job_id = store.submit(session, sub)[1].id
    with pg_ctx.transaction() as session:
        assert store.claim(session, job_id, "build", "w1", 0.3, 3) is not None
    with pg_ctx.transaction() as session:  # held on a live lease
        assert store.claim(session, job_id, "build", "w2", 0.3, 3) is None
    time.sleep(0.4)
    with pg_ctx.transaction() as session:
        job = store.claim(session, job_id, "build", "w2", 0.3, 3)
        assert job is not None and job.attempts == 2 and job.worker_id == "w2"
    with pg_ctx.transaction() as session:  # w1 lost it: its renewal fails
        assert not store.renew(session, job_id, "w1", 5)
        assert store.renew(session, job_id, "w2", 5)


def test_a_heuristic_never_replaces_a_tuned_schedule(pg_ctx: ServiceContext) -> None:
    sub = fake_submission()
    with pg_ctx.transaction() as session:
        store.submit(session, sub)
        assert store.publish_schedule(session, sub.key, "tuned", {"kernels": []}, [], {"tuned_ms": 1.0})
        assert not store.publish_schedule(session, sub.key, "heuristic", {"kernels": []}, [], {})
        assert store.schedule_by_key(session, sub.key).status == "tuned"


def test_migrations_create_exactly_the_models(pg_ctx: ServiceContext) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from service.models import Base

    with pg_ctx.engine.connect() as conn:
        assert compare_metadata(MigrationContext.configure(conn), Base.metadata) == []
