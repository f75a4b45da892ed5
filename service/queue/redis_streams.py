"""Redis-streams queue: one stream per target class, one consumer group, XAUTOCLAIM leases."""

from __future__ import annotations

import logging
import uuid

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from service.queue import keys
from service.queue.base import Delivery, JobQueue, QueueUnavailable

log = logging.getLogger(__name__)
_DOWN = (RedisConnectionError, RedisTimeoutError, OSError)


class RedisStreamQueue(JobQueue):
    """Streams `<prefix>stream:<name>` with group `workers`; a message idle longer than the
    lease (its consumer died or stopped touching it) is taken over with XAUTOCLAIM."""

    def __init__(self, url: str, prefix: str, lease_s: float) -> None:
        self.lease_s = lease_s
        self.prefix = prefix
        self.client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2,
                                           health_check_interval=10)

    def _call(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return fn(*args, **kwargs)
        except _DOWN as exc:
            raise QueueUnavailable(f"Redis does not answer: {exc}") from exc

    def _ensure_groups(self, names: list[str]) -> None:
        for name in names:
            try:
                self._call(self.client.xgroup_create, keys.stream(self.prefix, name), keys.GROUP,
                           id="0", mkstream=True)
            except ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise
            self._call(self.client.sadd, keys.streams_index(self.prefix), name)

    def enqueue(self, stream: str, job_id: int) -> None:
        self._call(self.client.sadd, keys.streams_index(self.prefix), stream)
        self._call(self.client.xadd, keys.stream(self.prefix, stream), {"job": str(job_id)})

    def claim(self, streams: list[str], consumer: str, block_s: float) -> Delivery | None:
        try:
            return self._claim(streams, consumer, block_s)
        except ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self._ensure_groups(streams)  # Redis restarted or the stream is new
            return self._claim(streams, consumer, block_s)

    def _claim(self, streams: list[str], consumer: str, block_s: float) -> Delivery | None:
        lease_ms = int(self.lease_s * 1000)
        for name in streams:
            _next, messages, *_deleted = self._call(
                self.client.xautoclaim, keys.stream(self.prefix, name), keys.GROUP, consumer,
                min_idle_time=lease_ms, start_id="0-0", count=1)
            for mid, fields in messages:
                delivery = self._delivery(name, mid, fields)
                if delivery is not None:
                    log.info("reclaimed job %s from an expired lease on %s", delivery.job_id, name)
                    return delivery
        answer = self._call(
            self.client.xreadgroup, keys.GROUP, consumer,
            {keys.stream(self.prefix, n): ">" for n in streams}, count=1,
            block=max(1, int(block_s * 1000)))
        for raw_stream, messages in answer or []:
            full = raw_stream.decode() if isinstance(raw_stream, bytes) else raw_stream
            name = full.removeprefix(keys.stream(self.prefix, ""))
            for mid, fields in messages:
                delivery = self._delivery(name, mid, fields)
                if delivery is not None:
                    return delivery
        return None

    def _delivery(self, name: str, mid: bytes | str, fields: dict | None) -> Delivery | None:
        mid_s = mid.decode() if isinstance(mid, bytes) else mid
        raw = (fields or {}).get(b"job")
        try:
            return Delivery(name, mid_s, int(raw))
        except (TypeError, ValueError):  # a malformed message: settle it, never loop on it
            log.warning("dropping malformed message %s on %s", mid_s, name)
            self.ack(Delivery(name, mid_s, -1))
            return None

    def touch(self, delivery: Delivery, consumer: str) -> None:
        try:
            self._call(self.client.xclaim, keys.stream(self.prefix, delivery.stream), keys.GROUP,
                       consumer, 0, [delivery.message_id], justid=True)
        except ResponseError as exc:  # Redis lost the group: the database lease still holds
            if "NOGROUP" not in str(exc):
                raise

    def ack(self, delivery: Delivery) -> None:
        key = keys.stream(self.prefix, delivery.stream)
        pipe = self.client.pipeline()
        pipe.xack(key, keys.GROUP, delivery.message_id)
        pipe.xdel(key, delivery.message_id)
        try:
            self._call(pipe.execute)
        except ResponseError as exc:  # the message went with a Redis restart: nothing to settle
            if "NOGROUP" not in str(exc):
                raise

    def depth(self) -> dict[str, int]:
        names = sorted(n.decode() for n in self._call(self.client.smembers,
                                                      keys.streams_index(self.prefix)))
        pipe = self.client.pipeline()
        for name in names:
            pipe.xlen(keys.stream(self.prefix, name))
        return dict(zip(names, self._call(pipe.execute), strict=True))

    def ping(self) -> None:
        self._call(self.client.ping)

    def lost_state(self) -> bool:
        return bool(self._call(self.client.set, keys.epoch(self.prefix), uuid.uuid4().hex, nx=True))

    def close(self) -> None:
        self.client.close()
