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
    queue.enqueue("build", 7)
    first = queue.claim(["build"], "a", 0.2)
    assert first is not None and first.job_id == 7
    assert queue.claim(["build"], "b", 0.1) is None  # held by a, lease not expired
    queue.ack(first)
    time.sleep(LEASE + 0.1)
    assert queue.claim(["build"], "b", 0.1) is None
    assert queue.depth().get("build", 0) == 0


def test_expired_lease_is_claimed_by_another_consumer(queue: JobQueue) -> None:
    queue.enqueue("tune:cuda-sm_90", 3)
    held = queue.claim(["tune:cuda-sm_90"], "dead", 0.2)
    assert held is not None
    time.sleep(LEASE + 0.2)
    taken = queue.claim(["tune:cuda-sm_90"], "alive", 0.2)
    assert taken is not None and taken.job_id == 3 and taken.message_id == held.message_id


def test_touch_keeps_the_lease(queue: JobQueue) -> None:
    queue.enqueue("build", 5)
    held = queue.claim(["build"], "a", 0.2)
    assert held is not None
    for _ in range(3):
        time.sleep(LEASE / 2)
        queue.touch(held, "a")
    assert queue.claim(["build"], "b", 0.05) is None


def test_streams_are_separate_and_depth_counts_unsettled(queue: JobQueue) -> None:
    queue.enqueue("build", 1)
    queue.enqueue("build", 2)
    queue.enqueue("tune:x", 9)
    assert queue.depth() == {"build": 2, "tune:x": 1}
    got = queue.claim(["tune:x"], "a", 0.2)
    assert got is not None and got.job_id == 9
    queue.ack(got)
    assert queue.depth() == {"build": 2, "tune:x": 0}


def test_lost_state_reports_once(queue: JobQueue) -> None:
    assert queue.lost_state() is True
    assert queue.lost_state() is False
