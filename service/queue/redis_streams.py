"""Redis queue with fair turns: per stream (queue class), one Redis stream per tenant (its
line) with the consumer group `workers`, and a sorted set of the tenants with undelivered
messages whose lowest score is served next (base.py: how turns rotate). Enqueue and claim
are Lua scripts, so the turn order and the line contents change together. A message
delivered but not acked within the lease (its consumer died or stopped touching it) is taken
over with XAUTOCLAIM, before any new message.

The claim script builds the keys of tenants' lines from the names it reads, so this queue
needs a single Redis (not a cluster)."""

from __future__ import annotations

import logging
import time
import uuid

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from service.queue import keys
from service.queue.base import Delivery, JobQueue, QueueUnavailable

log = logging.getLogger(__name__)
_DOWN = (RedisConnectionError, RedisTimeoutError, OSError)
_MAX_WAIT_S = 4.0  # one blocking wait, below the client's 5 s socket timeout

# KEYS: line, |tenants, |ready, |turn, |wake, streams index; ARGV: tenant, job id, stream.
# A tenant that starts waiting is placed half a turn before the current turn: behind the
# tenants already waiting, ahead of the one just served.
_ENQUEUE = """
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[1], 'workers', '0', 'MKSTREAM')
end
local id = redis.call('XADD', KEYS[1], '*', 'job', ARGV[2])
redis.call('SADD', KEYS[2], ARGV[1])
local turn = tonumber(redis.call('GET', KEYS[4]) or '0')
redis.call('ZADD', KEYS[3], 'NX', turn - 0.5, ARGV[1])
redis.call('RPUSH', KEYS[5], '1')
redis.call('LTRIM', KEYS[5], -64, -1)
redis.call('SADD', KEYS[6], ARGV[3])
return id
"""

# ARGV: prefix, consumer, lease in ms, stream names in the caller's order. Returns
# {stream, tenant, message id, job field, reclaimed 0|1} or false.
_CLAIM = """
local prefix, consumer, lease = ARGV[1], ARGV[2], ARGV[3]
local function job_of(fields)
  for i = 1, #fields, 2 do
    if fields[i] == 'job' then return fields[i + 1] end
  end
  return ''
end
for i = 4, #ARGV do
  local base = prefix .. 'fq:' .. ARGV[i]
  for _, tenant in ipairs(redis.call('SMEMBERS', base .. '|busy')) do
    local line = base .. '|t:' .. tenant
    if redis.call('EXISTS', line) == 0 then
      redis.call('SREM', base .. '|busy', tenant)
    else
      local got = redis.call('XAUTOCLAIM', line, 'workers', consumer, lease, '0-0', 'COUNT', 1)
      local msg = got[2][1]
      if msg then return {ARGV[i], tenant, msg[1], job_of(msg[2]), 1} end
      if redis.call('XPENDING', line, 'workers')[1] == 0 then
        redis.call('SREM', base .. '|busy', tenant)
      end
    end
  end
end
for i = 4, #ARGV do
  local base = prefix .. 'fq:' .. ARGV[i]
  while true do
    local tenant = redis.call('ZRANGE', base .. '|ready', 0, 0)[1]
    if not tenant then break end
    local line = base .. '|t:' .. tenant
    local got = false
    if redis.call('EXISTS', line) == 1 then
      got = redis.call('XREADGROUP', 'GROUP', 'workers', consumer, 'COUNT', 1,
                       'STREAMS', line, '>')
    end
    local msg = got and got[1][2][1]
    if msg then
      redis.call('ZADD', base .. '|ready', redis.call('INCR', base .. '|turn'), tenant)
      redis.call('SADD', base .. '|busy', tenant)
      return {ARGV[i], tenant, msg[1], job_of(msg[2]), 0}
    end
    redis.call('ZREM', base .. '|ready', tenant)
  end
end
return false
"""

# KEYS: a legacy stream; ARGV: message ids. Deletes them, and the stream once empty.
_DROP_LEGACY = """
redis.call('XDEL', KEYS[1], unpack(ARGV))
if redis.call('XLEN', KEYS[1]) == 0 then redis.call('DEL', KEYS[1]) end
return 1
"""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class RedisStreamQueue(JobQueue):
    """Tenants' lines under `<prefix>fq:<stream>` (keys.fair_base), served in turn."""

    def __init__(self, url: str, prefix: str, lease_s: float) -> None:
        self.lease_s = lease_s
        self.prefix = prefix
        self.client = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=2,
                                           health_check_interval=10)
        self._enqueue = self.client.register_script(_ENQUEUE)
        self._claim = self.client.register_script(_CLAIM)
        self._drop_legacy = self.client.register_script(_DROP_LEGACY)

    def _call(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return fn(*args, **kwargs)
        except _DOWN as exc:
            raise QueueUnavailable(f"Redis does not answer: {exc}") from exc

    def _key(self, name: str, part: str) -> str:
        return f"{keys.fair_base(self.prefix, name)}|{part}"

    def enqueue(self, stream: str, job_id: int, tenant: str) -> None:
        self._call(self._enqueue, keys=[
            keys.tenant_line(self.prefix, stream, tenant), self._key(stream, "tenants"),
            self._key(stream, "ready"), self._key(stream, "turn"), self._key(stream, "wake"),
            keys.streams_index(self.prefix)], args=[tenant, str(job_id), stream])

    def claim(self, streams: list[str], consumer: str, block_s: float) -> Delivery | None:
        deadline = time.monotonic() + block_s
        wake = [self._key(name, "wake") for name in streams]
        while True:
            got = self._call(self._claim, args=[self.prefix, consumer,
                                                int(self.lease_s * 1000), *streams])
            if got:
                name, tenant, mid, job, reclaimed = (_text(v) if isinstance(v, bytes) else v
                                                     for v in got)
                delivery = self._delivery(name, tenant, mid, job)
                if delivery is not None:
                    if reclaimed:
                        log.info("reclaimed job %s from an expired lease on %s",
                                 delivery.job_id, name)
                    return delivery
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            # An enqueue pushes a wake token; a stale token only costs one more claim.
            self._call(self.client.blpop, wake, timeout=max(0.01, min(left, _MAX_WAIT_S)))

    def _delivery(self, name: str, tenant: str, mid: str, job: str) -> Delivery | None:
        try:
            return Delivery(name, mid, int(job), tenant)
        except ValueError:  # a malformed message: settle it, never loop on it
            log.warning("dropping malformed message %s on %s", mid, name)
            self.ack(Delivery(name, mid, -1, tenant))
            return None

    def touch(self, delivery: Delivery, consumer: str) -> None:
        try:
            self._call(self.client.xclaim,
                       keys.tenant_line(self.prefix, delivery.stream, delivery.tenant),
                       keys.GROUP, consumer, 0, [delivery.message_id], justid=True)
        except ResponseError as exc:  # Redis lost the group: the database lease still holds
            if "NOGROUP" not in str(exc):
                raise

    def ack(self, delivery: Delivery) -> None:
        key = keys.tenant_line(self.prefix, delivery.stream, delivery.tenant)
        pipe = self.client.pipeline()
        pipe.xack(key, keys.GROUP, delivery.message_id)
        pipe.xdel(key, delivery.message_id)
        try:
            self._call(pipe.execute)
        except ResponseError as exc:  # the message went with a Redis restart: nothing to settle
            if "NOGROUP" not in str(exc):
                raise

    def depth(self) -> dict[str, int]:
        names = sorted(_text(n) for n in self._call(self.client.smembers,
                                                    keys.streams_index(self.prefix)))
        pipe = self.client.pipeline()
        for name in names:
            pipe.smembers(self._key(name, "tenants"))
        tenants = dict(zip(names, self._call(pipe.execute), strict=True))
        for name in names:
            for tenant in sorted(tenants[name]):
                pipe.xlen(keys.tenant_line(self.prefix, name, _text(tenant)))
        lengths = iter(self._call(pipe.execute))
        return {name: sum(next(lengths) for _ in tenants[name]) for name in names}

    def ping(self) -> None:
        self._call(self.client.ping)

    def lost_state(self) -> bool:
        return bool(self._call(self.client.set, keys.epoch(self.prefix), uuid.uuid4().hex, nx=True))

    def legacy(self) -> dict[str, list[tuple[str, int]]]:
        names = sorted(_text(n) for n in self._call(self.client.smembers,
                                                    keys.streams_index(self.prefix)))
        out: dict[str, list[tuple[str, int]]] = {}
        for name in names:
            entries = self._call(self.client.xrange, keys.legacy_stream(self.prefix, name))
            for mid, fields in entries:
                raw = (fields or {}).get(b"job", b"")
                job = int(raw) if raw.isdigit() else -1  # a malformed one is dropped below
                out.setdefault(name, []).append((_text(mid), job))
        return out

    def drop_legacy(self, stream: str, message_ids: list[str]) -> None:
        if message_ids:
            self._call(self._drop_legacy, keys=[keys.legacy_stream(self.prefix, stream)],
                       args=message_ids)

    def close(self) -> None:
        self.client.close()
