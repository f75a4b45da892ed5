"""Job queues: one interface, a Redis-streams implementation and an in-process one."""

from __future__ import annotations

from service.queue.base import BUILD_STREAM, Delivery, JobQueue, QueueUnavailable, tune_stream
from service.queue.memory import InProcessQueue


def make_queue(redis_url: str | None, prefix: str, lease_s: float) -> JobQueue:
    """Redis streams when a URL is configured, else the in-process queue (embedded mode)."""
    if redis_url:
        from service.queue.redis_streams import RedisStreamQueue

        return RedisStreamQueue(redis_url, prefix, lease_s)
    return InProcessQueue(lease_s)


__all__ = ["BUILD_STREAM", "Delivery", "InProcessQueue", "JobQueue", "QueueUnavailable",
           "make_queue", "tune_stream"]
