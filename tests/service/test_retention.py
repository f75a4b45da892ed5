"""`kiln db prune`: old events, superseded measurements, counters, dead workers and expired
sessions go; entries, jobs, graphs and each entry's latest tuning pass stay."""

from __future__ import annotations

import re
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from kiln.cli import build_parser, main
from service import store
from service.auth import create_session
from service.context import ServiceContext
from service.models import (
    DashboardSessionRow,
    GraphRow,
    JobEventRow,
    JobRow,
    KernelBinaryFileRow,
    KernelBinaryRow,
    LookupCountRow,
    MeasurementRow,
    ScheduleRow,
    WorkerRow,
    utcnow,
)
from service.settings import Settings
from service.store.retention import Policy, prune
from tests.service.helpers import fake_submission, job_dict


def _count(session, model) -> int:
    return session.scalar(select(func.count()).select_from(model))


def _seed(ctx: ServiceContext) -> str:
    """One finished entry with two tuning passes (one old), old and new events, counters,
    workers and sessions."""
    old = utcnow() - timedelta(days=100)
    with ctx.transaction() as session:
        _entry, job, _ = store.submit(session, fake_submission())
        session.query(JobRow).filter(JobRow.id == job.id).update({"status": "done"})
        session.query(JobEventRow).update({"at": old})
        store.add_event(session, job, "done", "w", "recent")
        for at in (old, old + timedelta(days=1)):  # two passes, both old: the latest stays
            session.add(MeasurementRow(schedule_key=job.key, kernel="k", config={}, ms=1.0, at=at))
        store.count_lookup(session, "hit", at=old)
        store.count_lookup(session, "hit")
        session.add(WorkerRow(id="gone", device="cpu", queue_class="cpu", status="dead",
                              heartbeat_at=old))
        session.add(WorkerRow(id="live", device="cpu", queue_class="cpu", status="running",
                              heartbeat_at=utcnow()))
        create_session(session, "t", ttl_s=-1)
        create_session(session, "t")
        # Binaries of kernels no schedule uses: an old one goes, a fresh one stays.
        for key in ("a" * 64, "b" * 64):
            store.add_binaries(session, [{"key": key, "source_hash": "c" * 64, "arch": "sm_90",
                                          "files": {"k.json": b"{}", "k.cubin": b"x"}}], "w")
        session.query(KernelBinaryRow).filter(KernelBinaryRow.key == "a" * 64).update(
            {"created_at": old})
        return job.key


def test_prune_deletes_only_what_the_policy_lets_go(any_ctx: ServiceContext) -> None:
    ctx = any_ctx
    key = _seed(ctx)
    with ctx.transaction() as session:
        counted = prune(session, Policy(), dry_run=True)
    with ctx.transaction() as session:
        assert _count(session, JobEventRow) == 2  # a dry run deletes nothing
        deleted = prune(session, Policy())
    assert deleted == counted == {"job_events": 1, "measurements": 1, "lookup_counts": 1,
                                  "workers": 1, "dashboard_sessions": 1,
                                  "kernel_binary_files": 2, "kernel_binaries": 1}
    with ctx.transaction() as session:
        assert [e.message for e in session.scalars(select(JobEventRow))] == ["recent"]
        kept = session.scalars(select(MeasurementRow)).one()
        assert kept.schedule_key == key and kept.at > utcnow() - timedelta(days=100)
        assert [w.id for w in session.scalars(select(WorkerRow))] == ["live"]
        assert _count(session, LookupCountRow) == 1
        assert _count(session, DashboardSessionRow) == 1
        assert _count(session, GraphRow) == 1 and _count(session, JobRow) == 1
        assert list(session.scalars(select(KernelBinaryRow.key))) == ["b" * 64]
        assert _count(session, KernelBinaryFileRow) == 2
        assert prune(session, Policy()) == dict.fromkeys(deleted, 0)


def test_kiln_db_prune_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                               capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'k.db'}"
    monkeypatch.setenv("KILN_DATABASE_URL", url)
    assert main(["db", "upgrade"]) == 0
    ctx = ServiceContext(Settings(database_url=url))
    try:
        _seed(ctx)
    finally:
        ctx.close()
    capsys.readouterr()
    assert main(["db", "prune", "--dry-run"]) == 0
    assert "would delete 1 job events" in capsys.readouterr().out
    assert main(["db", "prune", "--events-days", "1000"]) == 0
    out = capsys.readouterr().out
    assert "deleted 0 job events" in out and "1 workers" in out


def test_prune_help_states_the_policy_defaults() -> None:
    parser = build_parser()
    db = next(a for a in parser._subparsers._group_actions[0].choices.values()
              if a.prog.endswith(" db"))
    text = db._subparsers._group_actions[0].choices["prune"].format_help()
    stated = {f"{m.group(1)}_days": float(m.group(2))
              for m in re.finditer(r"--(\w+)-days N.*?\(default (\d+)", text, re.S)}
    assert stated == {name: days for name, days in asdict(Policy()).items() if days is not None}
    assert Policy().wire_days is None and "--wire-days N" in text  # graph bodies: off by default


def _entry(ctx: ServiceContext, graph_hash: str, job_status: str = "done", used_days: float = 100,
           changed_days: float = 100, arch: str = "cpu") -> str:
    """An entry of `graph_hash` last changed and last used so many days ago."""
    with ctx.transaction() as session:
        _e, job, _ = store.submit(session, fake_submission(graph_hash, arch=arch, name=arch))
        session.query(JobRow).filter(JobRow.id == job.id).update({"status": job_status})
        session.query(ScheduleRow).filter(ScheduleRow.key == job.key).update({
            "updated_at": utcnow() - timedelta(days=changed_days),
            "last_used_at": utcnow() - timedelta(days=used_days)})
        session.query(GraphRow).update({"created_at": utcnow() - timedelta(days=200)})
        return job.key


def test_prune_drops_only_the_bodies_of_graphs_unused_for_the_given_days(
        any_ctx: ServiceContext) -> None:
    ctx = any_ctx
    graphs = {name: name[0] * 64 for name in ("unused", "hit", "changed", "mixed", "busy")}
    _entry(ctx, graphs["unused"])
    _entry(ctx, graphs["hit"], used_days=3)
    _entry(ctx, graphs["changed"], changed_days=3)
    _entry(ctx, graphs["mixed"])
    _entry(ctx, graphs["mixed"], used_days=3, arch="sm_90")  # the same graph on a GPU: in use
    _entry(ctx, graphs["busy"], job_status="queued")
    with ctx.transaction() as session:
        assert "graph_bodies" not in prune(session, Policy())  # off unless asked
        assert prune(session, Policy(wire_days=30), dry_run=True)["graph_bodies"] == 1
        assert session.scalar(select(func.count()).select_from(GraphRow)
                              .where(GraphRow.wire.is_(None))) == 0
        assert prune(session, Policy(wire_days=30))["graph_bodies"] == 1
    with ctx.transaction() as session:
        bodies = {g.graph_hash: g.wire for g in session.scalars(select(GraphRow))}
        entries = _count(session, ScheduleRow)
    assert {h for h, wire in bodies.items() if wire is None} == {graphs["unused"]}
    assert len(bodies) == 5 and entries == 6  # rows stay; only the body goes
    with ctx.transaction() as session:
        assert prune(session, Policy(wire_days=30))["graph_bodies"] == 0
        assert prune(session, Policy(wire_days=1))["graph_bodies"] == 3  # all but the busy one


@pytest.mark.slow
def test_a_pruned_body_fails_a_retune_until_the_graph_is_submitted_again(
        client: Any, pg_ctx: ServiceContext) -> None:
    """Through the API and a real worker: the entry keeps serving without its body, a
    re-tune fails asking for the graph, and a resubmission stores the body and reruns it."""
    from service.worker import Worker
    from tests.service.helpers import running, wait_for, wire_body
    from tests.service.test_worker import _ok

    body = wire_body()
    first = client.post("/v1/graphs", json=body)
    key, job_id = first.json()["key"], first.json()["job_id"]
    built = []  # the wire texts the worker was given

    def build(wire: str, target: dict, numel: int) -> Any:
        built.append(wire)
        return _ok(wire, target, numel)

    with running(Worker(pg_ctx, build=build, block_s=0.1)):
        wait_for(lambda: job_dict(pg_ctx, job_id)["status"] == "done", 20)
        with pg_ctx.transaction() as session:
            original = session.scalars(select(GraphRow.wire)).one()
            session.query(ScheduleRow).update({"updated_at": utcnow() - timedelta(days=60)})
            session.query(GraphRow).update({"created_at": utcnow() - timedelta(days=60)})
            assert prune(session, Policy(wire_days=30))["graph_bodies"] == 1
        assert client.get(f"/v1/schedules/{key}").status_code == 200  # still serves

        retune = client.post(f"/v1/admin/entries/{key}/retune",
                             headers={"Authorization": "Bearer admin-secret"})
        assert retune.status_code == 202, retune.text
        wait_for(lambda: job_dict(pg_ctx, job_id)["status"] == "failed", 20)
        assert job_dict(pg_ctx, job_id)["error"] == store.WIRE_PRUNED
        assert "submit the graph again" in store.WIRE_PRUNED and len(built) == 1
        assert client.get(f"/v1/schedules/{key}").status_code == 200  # the schedule stays

        again = client.post("/v1/graphs", json=body)
        assert again.status_code in (200, 202) and again.json()["key"] == key
        wait_for(lambda: job_dict(pg_ctx, job_id)["status"] == "done", 20)
    with pg_ctx.transaction() as session:
        assert session.scalars(select(GraphRow.wire)).one() == original
    assert built == [original, original]
    history = [e["message"] for e in job_dict(pg_ctx, job_id)["history"]]
    assert "graph submitted again: its wire form is back" in history


def test_resubmitting_an_invalidated_entry_restores_its_body(pg_ctx: ServiceContext) -> None:
    from service.store import admin

    key = _entry(pg_ctx, "f" * 64, changed_days=60, used_days=60)
    with pg_ctx.transaction() as session:
        assert prune(session, Policy(wire_days=30))["graph_bodies"] == 1
        admin.invalidate(session, key)
    with pg_ctx.transaction() as session:
        _e, job, enqueue = store.submit(session, fake_submission("f" * 64))
        assert enqueue and job.status == "queued" and job.stage == "build"
        assert session.scalars(select(GraphRow.wire)).one() == fake_submission().wire
    history = [e["message"] for e in job_dict(pg_ctx, job.id)["history"]]
    assert history[-1] == "resubmitted after invalidation" and history.count(history[-1]) == 1
