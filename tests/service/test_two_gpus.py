"""Two GPUs of one host, with fake GPU workers (the worker is real; its device and tuner are
stand-ins that run on the CPU): the workers split a set of keys, tune each exactly once and
record their own device; a worker killed mid-tune leaves its job to the other one.

Both queue forms: SQLite with the in-process queue (one `kiln serve` with a worker thread
per GPU) and PostgreSQL with Redis (a `kiln worker --device cuda:N` process per GPU)."""

from __future__ import annotations

import dataclasses
import json
import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from service import store
from service.context import ServiceContext
from service.migrate import upgrade
from service.models import JobRow, MeasurementRow, WorkerRow
from service.pipeline import Outcome
from service.settings import Settings
from service.worker import Worker
from tests.service.helpers import fake_submission, job_dict, start_worker, wait_for
from tests.service.test_worker import _ok
from tests.service.worker_proc import stand_in_outcome

pytestmark = pytest.mark.services
GPU_CLASS = "cuda-sm_90"  # fake_submission's queue class for arch sm_90
FAST = {"lease_s": 2.0, "heartbeat_s": 0.3, "max_attempts": 3}


@pytest.fixture(params=["sqlite-inprocess", "postgresql-redis"])
def ctx(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ServiceContext]:
    """A context on a migrated database with short leases: SQLite with the in-process
    queue, then PostgreSQL with Redis (the distributed queue)."""
    if request.param == "sqlite-inprocess":
        settings = Settings(database_url=f"sqlite:///{tmp_path / 'k.db'}", **FAST)
    else:
        settings = Settings(database_url=request.getfixturevalue("postgres_url"),
                            redis_url=request.getfixturevalue("redis_url"),
                            redis_prefix=request.getfixturevalue("redis_prefix"), **FAST)
    upgrade(settings.database_url)
    context = ServiceContext(settings)
    yield context
    context.close()


def _submit_gpu_graphs(ctx: ServiceContext, count: int) -> dict[str, int]:
    """`count` graphs for an H200 target, each with a wire of its own; {wire: job id}."""
    jobs = {}
    for i in range(count):
        sub = fake_submission(arch="sm_90", name="NVIDIA H200")
        sub = dataclasses.replace(sub, wire=json.dumps({"format": "kiln.graph/1", "n": i}))
        with ctx.transaction() as session:
            _entry, job, _new = store.submit(session, sub)
            store.enqueue_after_commit(session, "build", "cpu", job.id, job.tenant)
        jobs[sub.wire] = job.id
    return jobs


class FakeTuner:
    """The tune function of fake GPU workers: counts each graph it tunes, and holds each
    device's first job until the other device has one too (so both must take part: a
    worker holding a job cannot claim another)."""

    def __init__(self, devices: int) -> None:
        self.tuned: list[tuple[str, str]] = []  # (wire, device)
        self._first = threading.Barrier(devices, timeout=30)
        self._met: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, wire: str, target: dict[str, Any], _trials: int, _seconds: float,
                 device: str, progress: Any = None) -> Outcome:
        with self._lock:
            first = device not in self._met
            self._met.add(device)
        if first:
            self._first.wait()
        time.sleep(0.05)
        with self._lock:
            self.tuned.append((wire, device))
        return stand_in_outcome(wire, target, device)


def _tune_events(job: dict[str, Any]) -> list[dict[str, Any]]:
    """The job's events after its heuristic build was handed to the tuners."""
    history = job["history"]
    handed = max(i for i, e in enumerate(history) if "waiting for tuning" in (e["message"] or ""))
    return history[handed + 1:]


def test_two_gpu_workers_split_the_keys_and_tune_each_once(ctx: ServiceContext) -> None:
    tuner = FakeTuner(devices=2)
    gpus = [Worker(ctx, device=f"cuda:{i}", queue_class=GPU_CLASS, tune=tuner, block_s=0.2)
            for i in range(2)]
    builder = Worker(ctx, build=_ok, block_s=0.2)
    workers = [*gpus, builder]
    for w in gpus:  # registered first, so every build is handed to the tuners
        w.start_thread()
    wait_for(lambda: _registered(ctx) >= 2, 10, "the GPU workers did not register")
    builder.start_thread()
    try:
        jobs = _submit_gpu_graphs(ctx, 6)
        wait_for(lambda: all(_tuned(ctx, j) for j in jobs.values()), 60,
                 lambda: f"not every job tuned: {[job_dict(ctx, j) for j in jobs.values()]}")
    finally:
        for w in workers:
            w.stop()
        for w in workers:
            w.join(10)
    # Each key tuned exactly once, and both GPUs took part.
    assert Counter(wire for wire, _ in tuner.tuned) == Counter(jobs.keys())
    assert {device for _, device in tuner.tuned} == {"cuda:0", "cuda:1"}
    device_of = {w.id: w.device for w in gpus}
    finished_by = Counter()
    for wire, job_id in jobs.items():
        job = job_dict(ctx, job_id)
        events = _tune_events(job)
        # One worker claimed it, tuned it and finished it; its own device is recorded.
        assert [e["status"] for e in events] == ["running", "done"], events
        assert {e["worker"] for e in events} == {job["worker"]}
        assert job["tuned_device"] == device_of[job["worker"]]
        assert (wire, job["tuned_device"]) in tuner.tuned
        assert f"(on {job['tuned_device']})" in events[-1]["message"]
        finished_by[job["worker"]] += 1
        with ctx.transaction() as session:
            rows = session.scalars(select(MeasurementRow).where(
                MeasurementRow.schedule_key == job["key"])).all()
            assert [r.worker_id for r in rows] == [job["worker"]]
            assert store.schedule_by_key(session, job["key"]).status == "tuned"
    assert set(finished_by) == set(device_of)


def _registered(ctx: ServiceContext) -> int:
    with ctx.transaction() as session:
        return len(session.scalars(select(WorkerRow).where(
            WorkerRow.queue_class == GPU_CLASS, WorkerRow.status == "running")).all())


def _tuned(ctx: ServiceContext, job_id: int) -> bool:
    job = job_dict(ctx, job_id)
    return job["stage"] == "tune" and job["status"] == "done"


def test_a_gpu_worker_killed_mid_tune_leaves_its_job_to_the_other(
        tmp_path: Path, postgres_url: str, redis_url: str, redis_prefix: str) -> None:
    settings = Settings(database_url=postgres_url, redis_url=redis_url,
                        redis_prefix=redis_prefix, **FAST)
    upgrade(postgres_url)
    env = {"KILN_DATABASE_URL": postgres_url, "KILN_REDIS_URL": redis_url,
           "KILN_REDIS_PREFIX": redis_prefix, "KILN_LEASE_S": "2", "KILN_HEARTBEAT_S": "0.3"}
    ctx = ServiceContext(settings)
    procs = []
    builder = Worker(ctx, build=_ok, block_s=0.2)
    try:
        # The doomed worker (cuda:0) alone first: it takes the tuning job and holds it.
        doomed = start_worker(tmp_path, "cuda0", delay=120, device="cuda:0", **env)
        procs.append(doomed)
        doomed_id = wait_for(lambda: _worker_on(ctx, "cuda:0"), 60,
                             lambda: f"the cuda:0 worker did not start:\n{doomed.log()}",
                             proc=doomed)
        builder.start_thread()
        (job_id,) = _submit_gpu_graphs(ctx, 1).values()
        wait_for(lambda: (j := job_dict(ctx, job_id))["stage"] == "tune"
                 and j["status"] == "running" and j["worker"] == doomed_id, 30,
                 lambda: f"cuda:0 never started tuning:\n{doomed.log()}")
        rescuer = start_worker(tmp_path, "cuda1", delay=0, device="cuda:1", **env)
        procs.append(rescuer)
        rescuer_id = wait_for(lambda: _worker_on(ctx, "cuda:1"), 60,
                              lambda: f"the cuda:1 worker did not start:\n{rescuer.log()}",
                              proc=rescuer)
        assert job_dict(ctx, job_id)["worker"] == doomed_id  # still held: a live lease
        doomed.popen.kill()  # SIGKILL mid-tune: no chance to give the job back
        doomed.popen.wait(10)
        wait_for(lambda: _tuned(ctx, job_id), 40,
                 lambda: f"the job was not taken over:\n{rescuer.log()}")
        job = job_dict(ctx, job_id)
        events = _tune_events(job)
        running = [e["worker"] for e in events if e["status"] == "running"]
        assert running[0] == doomed_id and running[-1] == rescuer_id
        assert [e["status"] for e in events].count("done") == 1
        assert events[-1]["status"] == "done"
        assert job["worker"] == rescuer_id and job["tuned_device"] == "cuda:1"
        with ctx.transaction() as session:
            rows = session.scalars(select(MeasurementRow).where(
                MeasurementRow.schedule_key == job["key"])).all()
            assert [r.worker_id for r in rows] == [rescuer_id]  # tuned once, by the rescuer
            assert store.schedule_by_key(session, job["key"]).status == "tuned"
            assert session.get(JobRow, job_id).tuned_device == "cuda:1"
    finally:
        builder.stop()
        builder.join(10)
        for p in procs:
            p.stop(signal.SIGKILL)
        ctx.close()


def _worker_on(ctx: ServiceContext, device: str) -> str | None:
    """The id of the running worker on `device`, once it has registered."""
    with ctx.transaction() as session:
        return session.scalars(select(WorkerRow.id).where(
            WorkerRow.device == device, WorkerRow.status == "running")).first()
