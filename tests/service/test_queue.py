"""The queue contract, on Redis streams and on the in-process queue."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from service.queue import InProcessQueue, JobQueue
from service.queue.redis_streams import RedisStreamQueue

LEASE = 0.5


@pytest.fixture(params=["memory", "redis"])
def queue(request: pytest.FixtureRequest) -> Iterator[JobQueue]:
    if request.param == "memory":
        yield InProcessQueue(LEASE)
        return
    url, prefix = request.getfixturevalue("redis_url"), request.getfixturevalue("redis_prefix")
    q = RedisStreamQueue(url, prefix, LEASE)
    yield q
    q.close()


def test_message_goes_to_one_consumer_and_is_gone_after_ack(queue: JobQueue) -> None:
    queue.enqueue("build", 7, "a")
    first = queue.claim(["build"], "a", 0.2)
    assert first is not None and first.job_id == 7
    assert queue.claim(["build"], "b", 0.1) is None  # held by a, lease not expired
    queue.ack(first)
    time.sleep(LEASE + 0.1)
    assert queue.claim(["build"], "b", 0.1) is None
    assert queue.depth().get("build", 0) == 0


def test_expired_lease_is_claimed_by_another_consumer(queue: JobQueue) -> None:
    queue.enqueue("tune:cuda-sm_90", 3, "a")
    held = queue.claim(["tune:cuda-sm_90"], "dead", 0.2)
    assert held is not None
    time.sleep(LEASE + 0.2)
    taken = queue.claim(["tune:cuda-sm_90"], "alive", 0.2)
    assert taken is not None and taken.job_id == 3 and taken.message_id == held.message_id


def test_touch_keeps_the_lease(queue: JobQueue) -> None:
    queue.enqueue("build", 5, "a")
    held = queue.claim(["build"], "a", 0.2)
    assert held is not None
    for _ in range(3):
        time.sleep(LEASE / 2)
        queue.touch(held, "a")
    assert queue.claim(["build"], "b", 0.05) is None


def test_streams_are_separate_and_depth_counts_unsettled(queue: JobQueue) -> None:
    queue.enqueue("build", 1, "a")
    queue.enqueue("build", 2, "a")
    queue.enqueue("tune:x", 9, "a")
    assert queue.depth() == {"build": 2, "tune:x": 1}
    got = queue.claim(["tune:x"], "a", 0.2)
    assert got is not None and got.job_id == 9
    queue.ack(got)
    assert queue.depth() == {"build": 2, "tune:x": 0}


def test_lost_state_reports_once(queue: JobQueue) -> None:
    assert queue.lost_state() is True
    assert queue.lost_state() is False


def _drain(queue: JobQueue, streams: list[str], consumer: str = "w") -> list[tuple[str, int]]:
    """Claim and ack until the queue is empty: (tenant, job id) in the order served."""
    served = []
    while (got := queue.claim(streams, consumer, 0.05)) is not None:
        served.append((got.tenant, got.job_id))
        queue.ack(got)
    return served


def test_tenants_take_turns_one_message_each(queue: JobQueue) -> None:
    for job in (1, 2, 3):
        queue.enqueue("build", job, "team-a")
    for job in (11, 12, 13):
        queue.enqueue("build", job, "team-b")
    queue.enqueue("build", 21, "team-c")
    assert [job for _t, job in _drain(queue, ["build"])] == [1, 11, 21, 2, 12, 3, 13]


def test_a_newcomer_is_served_right_after_the_build_in_progress(queue: JobQueue) -> None:
    """A's backlog of 20 is being worked through when B submits its first job: B's job is the
    very next one served, ahead of the rest of A's backlog."""
    for job in range(1, 21):
        queue.enqueue("build", job, "team-a")
    in_progress = queue.claim(["build"], "w", 0.2)
    assert in_progress is not None and in_progress.job_id == 1
    queue.enqueue("build", 100, "team-b")
    queue.ack(in_progress)
    served = _drain(queue, ["build"])
    assert served[0] == ("team-b", 100)
    assert [job for _t, job in served[1:]] == list(range(2, 21))


def test_a_tenant_just_served_waits_behind_those_already_waiting(queue: JobQueue) -> None:
    queue.enqueue("build", 1, "team-a")
    queue.enqueue("build", 2, "team-a")
    queue.enqueue("build", 11, "team-b")
    queue.enqueue("build", 12, "team-b")
    first = queue.claim(["build"], "w", 0.2)
    assert first is not None and first.job_id == 1
    queue.ack(first)
    queue.enqueue("build", 21, "team-c")  # arrives after A was served: behind B, ahead of A
    assert [job for _t, job in _drain(queue, ["build"])] == [11, 21, 2, 12]


def test_turns_are_kept_per_stream(queue: JobQueue) -> None:
    queue.enqueue("build", 1, "team-a")
    queue.enqueue("build", 2, "team-a")
    queue.enqueue("tune:x", 9, "team-b")
    queue.enqueue("build", 11, "team-b")
    # The first stream with work is served first; within it, tenants take turns.
    assert _drain(queue, ["build", "tune:x"]) == [
        ("team-a", 1), ("team-b", 11), ("team-a", 2), ("team-b", 9)]


def test_an_expired_lease_is_redelivered_before_other_tenants_work(queue: JobQueue) -> None:
    """A worker killed mid-job: its message goes to another consumer after the lease, with
    its tenant, ahead of new work; the turns of the others are not disturbed."""
    queue.enqueue("build", 1, "team-a")
    queue.enqueue("build", 2, "team-a")
    held = queue.claim(["build"], "killed", 0.2)
    assert held is not None and (held.tenant, held.job_id) == ("team-a", 1)
    queue.enqueue("build", 11, "team-b")
    time.sleep(LEASE + 0.2)
    again = queue.claim(["build"], "alive", 0.2)
    assert again is not None and again.message_id == held.message_id
    assert (again.tenant, again.job_id) == ("team-a", 1)
    queue.ack(again)
    assert _drain(queue, ["build"], "alive") == [("team-b", 11), ("team-a", 2)]
    assert queue.depth() == {"build": 0}


def test_a_blocked_claim_wakes_when_work_arrives(queue: JobQueue) -> None:
    import threading

    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(
        queue.claim(["build"], "w", 3.0).job_id))
    waiter.start()
    time.sleep(0.3)
    started = time.monotonic()
    queue.enqueue("build", 4, "team-a")
    waiter.join(5)
    assert got == [4]
    assert time.monotonic() - started < 2.5  # woken by the enqueue, not by the 3 s timeout


def test_messages_of_the_layout_before_fair_queueing_are_moved_not_lost(
        redis_url: str, redis_prefix: str, pg_settings) -> None:  # noqa: ANN001
    """Upgrading a running deployment: what an older kiln left in its one stream per class
    (delivered or not) goes into the tenants' lines at the next recovery pass."""
    import redis

    from service import store
    from service.context import ServiceContext
    from service.queue import keys
    from tests.service.helpers import fake_submission

    settings = pg_settings.model_copy(update={"redis_url": redis_url,
                                              "redis_prefix": redis_prefix})
    ctx = ServiceContext(settings)
    try:
        ids = {}
        with ctx.transaction() as session:
            for i, tenant in enumerate(("team-a", "team-a", "team-b")):
                _entry, job, _new = store.submit(session, fake_submission(f"{i:x}" * 64),
                                                 tenant=tenant)
                ids[job.id] = tenant
        raw = redis.Redis.from_url(redis_url)
        old = keys.legacy_stream(redis_prefix, "build")
        raw.xgroup_create(old, keys.GROUP, id="0", mkstream=True)
        for job_id in ids:
            raw.xadd(old, {"job": str(job_id)})
        raw.xadd(old, {"job": "garbage"})
        raw.sadd(keys.streams_index(redis_prefix), "build")
        # An old worker had taken the first one when the deployment was upgraded.
        raw.xreadgroup(keys.GROUP, "old-worker", {old: ">"}, count=1)
        ctx.queue.lost_state()  # not a lost Redis: only the move brings these back
        ctx.recover()
        assert not raw.exists(old)
        served = _drain(ctx.queue, ["build"])
        assert sorted(served) == sorted((tenant, job_id) for job_id, tenant in ids.items())
        assert served[1][0] != served[0][0]  # in turns
        ctx.recover()  # nothing left to move
        assert _drain(ctx.queue, ["build"]) == []
        raw.close()
    finally:
        ctx.close()


def test_wake_ends_a_waiting_claim_and_leaves_later_claims_alone() -> None:
    import threading

    queue = InProcessQueue(lease_s=60.0)
    got: list[object] = []
    waiting = threading.Thread(target=lambda: got.append(queue.claim(["build"], "w", 60.0)))
    waiting.start()
    time.sleep(0.2)  # the claim is waiting (with no work it would wait its 60 s)
    queue.wake()
    waiting.join(30)
    assert not waiting.is_alive() and got == [None]
    queue.enqueue("build", 7, "t")  # a claim after the wake gets work as before
    delivery = queue.claim(["build"], "w", 1.0)
    assert delivery is not None and delivery.job_id == 7
