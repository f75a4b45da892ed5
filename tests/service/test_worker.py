"""Workers on real PostgreSQL with the in-process queue: publish, retry, fail, hand off."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest

from service import store
from service.context import ServiceContext
from service.models import WorkerRow, utcnow
from service.pipeline import Outcome
from service.queue import BUILD_STREAM, InProcessQueue, tune_stream
from service.worker import Worker
from tests.service.helpers import fake_submission, job_dict, running, wait_for

pytestmark = pytest.mark.services

SCHEDULE = {"format": "kiln.schedule/1", "kernels": [], "externs": []}


def _ok(_wire: str, _target: dict, _numel: int) -> Outcome:
    return Outcome(schedule=dict(SCHEDULE), kernels=[{
        "name": "k0", "kind": "pointwise", "variant": "pointwise", "config": {"XBLOCK": 64},
        "nodes": ["n0"], "ops": ["aten.add.Tensor"], "source": "src", "source_hash": "h"}])


def _submit(ctx: ServiceContext, **kw: str) -> tuple[str, int]:
    sub = fake_submission(**kw)
    with ctx.transaction() as session:
        _entry, job, _ = store.submit(session, sub)
    ctx.queue.enqueue(BUILD_STREAM, job.id, job.tenant)
    return sub.key, job.id


def test_cpu_worker_publishes_the_heuristic_schedule(pg_ctx: ServiceContext) -> None:
    key, job_id = _submit(pg_ctx)
    with running(Worker(pg_ctx, build=_ok, block_s=0.2)):
        wait_for(lambda: job_dict(pg_ctx, job_id)["status"] == "done", 20)
    with pg_ctx.transaction() as session:
        entry = store.schedule_by_key(session, key)
        assert entry.status == "heuristic"
    history = [e["status"] for e in job_dict(pg_ctx, job_id)["history"]]
    assert history == ["queued", "running", "done"]


def test_a_job_that_always_crashes_ends_failed_with_its_error(pg_ctx: ServiceContext) -> None:
    calls = []

    def crash(_wire: str, _target: dict, _numel: int) -> Outcome:
        calls.append(1)
        raise RuntimeError("lowering exploded")

    key, job_id = _submit(pg_ctx)
    with running(Worker(pg_ctx, build=crash, block_s=0.2)):
        wait_for(lambda: job_dict(pg_ctx, job_id)["status"] == "failed", 20)
    job = job_dict(pg_ctx, job_id)
    assert len(calls) == pg_ctx.settings.max_attempts == job["attempts"]
    assert "lowering exploded" in job["error"]
    with pg_ctx.transaction() as session:
        assert store.schedule_by_key(session, key).status == "failed"


def test_gpu_target_is_left_for_a_live_gpu_worker(pg_ctx: ServiceContext) -> None:
    with pg_ctx.transaction() as session:
        session.add(WorkerRow(id="gpu-0", device="cuda:0", queue_class="cuda-sm_90",
                              heartbeat_at=utcnow()))
        session.add(WorkerRow(id="gpu-dead", device="cuda:0", queue_class="cuda-sm_80",
                              heartbeat_at=utcnow() - timedelta(minutes=5)))
    served_key, served = _submit(pg_ctx, arch="sm_90", name="NVIDIA H200")
    _unserved_key, unserved = _submit(pg_ctx, arch="sm_80", name="NVIDIA A100")
    with running(Worker(pg_ctx, build=_ok, block_s=0.2)):
        wait_for(lambda: job_dict(pg_ctx, unserved)["status"] == "done"
                 and job_dict(pg_ctx, served)["stage"] == "tune", 20)
    job = job_dict(pg_ctx, served)
    assert job["status"] == "queued" and job["progress"] == 0.5
    # enqueued once the stage's commit is visible (after commit): the test may look between
    wait_for(lambda: pg_ctx.queue.depth().get(tune_stream("cuda-sm_90")) == 1, 10)

    seen: dict = {}

    def tuned(_wire: str, _target: dict, _trials: int, _seconds: float, device: str,
              progress: Callable[[float], None]) -> Outcome:
        seen["device"] = device
        progress(1.0)
        out = _ok("", {}, 0)
        out.timings = {"eager_ms": 2.0, "heuristic_ms": 1.5, "tuned_ms": 1.0, "tuning_s": 3.0}
        out.measurements = [{"kernel": "k0", "variant": "pointwise", "config": {"XBLOCK": 64},
                             "ms": 1.0, "error": None, "verified": True}]
        return out

    with running(Worker(pg_ctx, device="cuda:0", queue_class="cuda-sm_90", tune=tuned,
                        block_s=0.2)):
        wait_for(lambda: job_dict(pg_ctx, served)["status"] == "done", 20)
    assert seen["device"] == "cuda:0"
    with pg_ctx.transaction() as session:
        entry = store.schedule_by_key(session, served_key)
        assert entry.status == "tuned" and entry.tuned_ms == 1.0
        from service.store.admin import entry_detail

        detail = entry_detail(session, served_key)
    assert len(detail["measurements"]) == 1 and detail["speedup"] == 2.0

    # A GPU worker for sm_80 starting later tunes what was built without one.
    with running(Worker(pg_ctx, device="cuda:1", queue_class="cuda-sm_80", tune=tuned,
                        block_s=0.2)):
        wait_for(lambda: job_dict(pg_ctx, unserved)["stage"] == "tune"
                 and job_dict(pg_ctx, unserved)["status"] == "done", 20)
    assert seen["device"] == "cuda:1"
    with pg_ctx.transaction() as session:
        assert store.schedule_by_key(session, _unserved_key).status == "tuned"


def test_recovery_enqueues_unfinished_jobs_when_the_queue_lost_its_state(pg_ctx: ServiceContext) -> None:
    _key, job_id = _submit(pg_ctx)
    pg_ctx.queue.lost_state()  # the first call reports the fresh queue
    msg = pg_ctx.queue.claim([BUILD_STREAM], "x", 0.1)
    pg_ctx.queue.ack(msg)  # the message is gone, the job still queued in the database
    assert pg_ctx.recover() == 0
    pg_ctx.queue = InProcessQueue(pg_ctx.settings.lease_s)  # a restarted, empty backend
    assert pg_ctx.recover() == 1
    assert pg_ctx.queue.claim([BUILD_STREAM], "x", 0.1).job_id == job_id


def test_recovery_enqueues_a_running_job_whose_worker_died_without_a_message(
        pg_ctx: ServiceContext) -> None:
    _key, job_id = _submit(pg_ctx)
    msg = pg_ctx.queue.claim([BUILD_STREAM], "dead", 0.1)
    with pg_ctx.transaction() as session:
        assert store.claim(session, job_id, "build", "dead", 0.1, 3) is not None
    pg_ctx.queue.ack(msg)  # e.g. lost with a Redis restart while its worker was dying
    pg_ctx.queue.lost_state()
    assert pg_ctx.recover() == 0  # the lease has not run out long enough yet
    import time

    time.sleep(pg_ctx.settings.lease_s + 0.3)
    assert pg_ctx.recover() == 1
    with running(Worker(pg_ctx, build=_ok, block_s=0.2)):
        wait_for(lambda: job_dict(pg_ctx, job_id)["status"] == "done", 20)
    assert job_dict(pg_ctx, job_id)["attempts"] == 2


def test_a_hung_build_is_taken_over_after_its_time_limit(pg_ctx: ServiceContext) -> None:
    import threading

    pg_ctx.settings = pg_ctx.settings.model_copy(update={"build_timeout_s": 0.5, "lease_s": 1.0})
    release = threading.Event()

    def hang(wire: str, target: dict, numel: int) -> Outcome:
        release.wait(30)
        return _ok(wire, target, numel)

    _key, job_id = _submit(pg_ctx)
    stuck = Worker(pg_ctx, build=hang, block_s=0.2)
    stuck.start_thread()
    wait_for(lambda: job_dict(pg_ctx, job_id)["status"] == "running", 10)
    rescuer = Worker(pg_ctx, build=_ok, block_s=0.2)
    rescuer.start_thread()
    try:
        wait_for(lambda: job_dict(pg_ctx, job_id)["status"] == "done", 20)
    finally:
        release.set()
        for w in (stuck, rescuer):
            w.stop()
            w.join(10)
    job = job_dict(pg_ctx, job_id)
    assert job["attempts"] == 2 and job["worker"] == rescuer.id
    assert any("ran past the time limit of 0.5 s" in (e["message"] or "") for e in job["history"])
    done = [e for e in job["history"] if e["status"] == "done"]
    assert len(done) == 1 and done[0]["worker"] == rescuer.id  # the hung one's late result is refused
