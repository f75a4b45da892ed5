"""Recovery on real PostgreSQL: a job whose enqueue failed is enqueued by the next submission
of its key (not minutes later), and a worker that stops heartbeating is marked dead with its
job queued again."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from service import store
from service.api.app import create_app
from service.context import ServiceContext
from service.models import JobRow, WorkerRow, utcnow
from service.queue import BUILD_STREAM, InProcessQueue, QueueUnavailable
from service.worker import Worker
from tests.service.helpers import fake_submission, job_dict, running, wait_for, wire_body
from tests.service.test_worker import _ok

pytestmark = pytest.mark.services


class BlippingQueue(InProcessQueue):
    """The in-process queue, with an outage switch for enqueue (a Redis blip)."""

    down = False

    def enqueue(self, stream: str, job_id: int, tenant: str) -> None:
        if self.down:
            raise QueueUnavailable("redis: connection refused")
        super().enqueue(stream, job_id, tenant)


@pytest.fixture
def blip_ctx(pg_settings) -> ServiceContext:
    ctx = ServiceContext(pg_settings, queue=BlippingQueue(pg_settings.lease_s))
    ctx.queue.lost_state()  # past the fresh start: recover() follows the ordinary rules
    yield ctx
    ctx.close()


def test_resubmitting_a_key_whose_enqueue_failed_enqueues_it(blip_ctx: ServiceContext) -> None:
    with TestClient(create_app(ctx=blip_ctx), base_url="http://127.0.0.1") as client:
        blip_ctx.queue.down = True
        first = client.post("/v1/graphs", json=wire_body())
        assert first.status_code == 503  # the job row exists; its message does not
        blip_ctx.queue.down = False
        assert blip_ctx.queue.claim([BUILD_STREAM], "w", 0.05) is None
        again = client.post("/v1/graphs", json=wire_body())
        assert again.status_code == 202, again.text
        delivered = blip_ctx.queue.claim([BUILD_STREAM], "w", 0.05)
        assert delivered is not None and delivered.job_id == again.json()["job_id"]
        blip_ctx.queue.ack(delivered)
        # Once enqueued it is an ordinary job: another submission adds no message.
        assert client.post("/v1/graphs", json=wire_body()).status_code == 202
        assert blip_ctx.queue.claim([BUILD_STREAM], "w", 0.05) is None


def test_recovery_enqueues_a_failed_enqueue_at_once(blip_ctx: ServiceContext) -> None:
    blip_ctx.queue.down = True
    with blip_ctx.transaction() as session:
        _entry, job, _new = store.submit(session, fake_submission())
        store.enqueue_after_commit(session, "build", "cpu", job.id, job.tenant)
    blip_ctx.queue.down = False
    # Not stale by the old rule (5 leases): the mark alone brings it back.
    assert blip_ctx.recover() == 1
    assert blip_ctx.queue.claim([BUILD_STREAM], "w", 0.05).job_id == job.id
    assert blip_ctx.recover() == 0


def test_a_silent_worker_is_marked_dead_and_its_job_queued_again(pg_ctx: ServiceContext) -> None:
    pg_ctx.queue.lost_state()
    with pg_ctx.transaction() as session:
        _entry, job, _new = store.submit(session, fake_submission())
        store.enqueue_after_commit(session, "build", "cpu", job.id, job.tenant)
    msg = pg_ctx.queue.claim([BUILD_STREAM], "killed", 0.1)
    pg_ctx.queue.ack(msg)  # only the database remembers who held it
    long_ago = utcnow() - timedelta(seconds=10 * pg_ctx.settings.lease_s)
    with pg_ctx.transaction() as session:
        assert store.claim(session, job.id, "build", "killed", pg_ctx.settings.lease_s, 3)
        session.add(WorkerRow(id="killed", device="cpu", queue_class="cpu", status="running",
                              heartbeat_at=long_ago, current_job_id=job.id))
        session.add(WorkerRow(id="alive", device="cpu", queue_class="cpu", status="running",
                              heartbeat_at=utcnow()))
        session.query(JobRow).filter(JobRow.id == job.id).update({"lease_until": long_ago})
    assert pg_ctx.recover() == 1
    with pg_ctx.transaction() as session:
        statuses = {w.id: (w.status, w.current_job_id) for w in session.query(WorkerRow)}
    assert statuses == {"killed": ("dead", None), "alive": ("running", None)}
    state = job_dict(pg_ctx, job.id)
    assert state["status"] == "queued" and state["worker"] is None
    assert "no heartbeat" in state["history"][-1]["message"]
    with running(Worker(pg_ctx, build=_ok, block_s=0.2)):
        wait_for(lambda: job_dict(pg_ctx, job.id)["status"] == "done", 20)
    assert job_dict(pg_ctx, job.id)["attempts"] == 2  # the killed attempt counts


def test_a_worker_whose_heartbeat_resumes_is_running_again(pg_ctx: ServiceContext) -> None:
    pg_ctx.settings = pg_ctx.settings.model_copy(update={"lease_s": 0.5, "heartbeat_s": 0.1})
    with pg_ctx.transaction() as session:
        session.add(WorkerRow(id="w", device="cpu", queue_class="cpu", status="running",
                              heartbeat_at=utcnow() - timedelta(seconds=5)))
    pg_ctx.recover()
    with running(Worker(pg_ctx, build=_ok, worker_id="w", block_s=0.1)):
        time.sleep(0.5)
        with pg_ctx.transaction() as session:
            assert session.get(WorkerRow, "w").status == "running"


def _flaky(calls: list[int]):
    """A build stand-in that fails its first call (a retry) and then succeeds."""
    def build(wire: str, target: dict, numel: int):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("transient build failure")
        return _ok(wire, target, numel)
    return build


@pytest.mark.parametrize("path", ["hand_to_tuner", "retry"])
def test_a_worker_whose_enqueue_fails_marks_the_job_for_recovery(blip_ctx: ServiceContext,
                                                                  path: str) -> None:
    """A job the worker puts back on the queue (handed to the tuner, or retried after a failed
    attempt) while Redis is down is marked, and the next recovery pass enqueues it at once."""
    gpu = path == "hand_to_tuner"
    with blip_ctx.transaction() as session:
        if gpu:  # a live GPU worker serves the target, so the build hands the job on
            session.add(WorkerRow(id="gpu-0", device="cuda:0", queue_class="cuda-sm_90",
                                  status="running", heartbeat_at=utcnow()))
        sub = fake_submission(arch="sm_90", name="NVIDIA H200") if gpu else fake_submission()
        _entry, job, _new = store.submit(session, sub)
        store.enqueue_after_commit(session, "build", sub.queue_class, job.id, job.tenant)
    worker = Worker(blip_ctx, build=_ok if gpu else _flaky([]), block_s=0.05)
    delivery = blip_ctx.queue.claim([BUILD_STREAM], worker.id, 0.1)
    blip_ctx.queue.down = True
    worker._handle(delivery)  # what run() does with one delivery
    with blip_ctx.transaction() as session:
        row = session.get(JobRow, job.id)
        assert (row.status, row.stage, row.needs_enqueue) == (
            "queued", "tune" if gpu else "build", True)
    blip_ctx.queue.down = False
    stream = "tune:cuda-sm_90" if gpu else BUILD_STREAM
    assert blip_ctx.queue.claim([stream], "w", 0.05) is None  # the enqueue was lost
    assert blip_ctx.recover() == 1  # not stale by the 5-lease rule: the mark brings it back
    assert blip_ctx.queue.claim([stream], "w", 0.05).job_id == job.id
    with blip_ctx.transaction() as session:
        assert session.get(JobRow, job.id).needs_enqueue is False
