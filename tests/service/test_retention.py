"""`kiln db prune`: old events, superseded measurements, counters, dead workers and expired
sessions go; entries, jobs, graphs and each entry's latest tuning pass stay."""

from __future__ import annotations

import re
from dataclasses import asdict
from datetime import timedelta
from pathlib import Path

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
    LookupCountRow,
    MeasurementRow,
    WorkerRow,
    utcnow,
)
from service.retention import Policy, prune
from service.settings import Settings
from tests.service.helpers import fake_submission


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
        return job.key


@pytest.fixture(params=["sqlite", "postgresql"])
def any_ctx(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "postgresql":
        yield request.getfixturevalue("pg_ctx")
        return
    from service.migrate import upgrade

    url = f"sqlite:///{tmp_path / 'k.db'}"
    upgrade(url)
    ctx = ServiceContext(Settings(database_url=url))
    yield ctx
    ctx.close()


def test_prune_deletes_only_what_the_policy_lets_go(any_ctx: ServiceContext) -> None:
    ctx = any_ctx
    key = _seed(ctx)
    with ctx.transaction() as session:
        counted = prune(session, Policy(), dry_run=True)
    with ctx.transaction() as session:
        assert _count(session, JobEventRow) == 2  # a dry run deletes nothing
        deleted = prune(session, Policy())
    assert deleted == counted == {"job_events": 1, "measurements": 1, "lookup_counts": 1,
                                  "workers": 1, "dashboard_sessions": 1}
    with ctx.transaction() as session:
        assert [e.message for e in session.scalars(select(JobEventRow))] == ["recent"]
        kept = session.scalars(select(MeasurementRow)).one()
        assert kept.schedule_key == key and kept.at > utcnow() - timedelta(days=100)
        assert [w.id for w in session.scalars(select(WorkerRow))] == ["live"]
        assert _count(session, LookupCountRow) == 1
        assert _count(session, DashboardSessionRow) == 1
        assert _count(session, GraphRow) == 1 and _count(session, JobRow) == 1
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
    assert stated == asdict(Policy())
