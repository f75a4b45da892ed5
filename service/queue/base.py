"""The queue interface. Messages carry only a job id and its tenant; the database holds the
job itself, so a duplicate or replayed message is harmless (claiming in the database decides).

Fair queueing: within a stream (a queue class) each tenant has its own line, and tenants
take turns, one message each. A tenant that starts waiting goes behind the tenants already
waiting but ahead of the one just served, so one tenant's backlog delays another tenant's
first job by at most the job in progress (plus one job of each tenant already waiting)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

BUILD_STREAM = "build"  # heuristic builds, served by CPU workers for every target


def tune_stream(queue_class: str) -> str:
    """The stream of tuning work for one target class (`Target.queue_class`)."""
    return f"tune:{queue_class}"


class QueueUnavailable(RuntimeError):
    """The queue backend does not answer (Redis down)."""


@dataclass(frozen=True)
class Delivery:
    """One message handed to one consumer, to ack when the job is settled."""

    stream: str
    message_id: str
    job_id: int
    tenant: str


class JobQueue(ABC):
    """Work queue with leases: a message delivered but not acked within the lease is given
    to another consumer."""

    lease_s: float

    @abstractmethod
    def enqueue(self, stream: str, job_id: int, tenant: str) -> None:
        """Append a job id to its tenant's line in a stream."""

    @abstractmethod
    def claim(self, streams: list[str], consumer: str, block_s: float) -> Delivery | None:
        """Next message for `consumer`: a message whose lease expired first, else a new one
        from the first of `streams` with work, from the tenant whose turn it is there;
        waits up to `block_s`."""

    @abstractmethod
    def touch(self, delivery: Delivery, consumer: str) -> None:
        """Restart the lease of a message this consumer still works on."""

    @abstractmethod
    def ack(self, delivery: Delivery) -> None:
        """Settle a message: it is never delivered again."""

    @abstractmethod
    def depth(self) -> dict[str, int]:
        """Messages not yet settled, per stream."""

    @abstractmethod
    def ping(self) -> None:
        """Raise QueueUnavailable when the backend does not answer."""

    @abstractmethod
    def lost_state(self) -> bool:
        """True once after the backend came back empty (restart, flush): the caller must
        enqueue again every job the database still has pending."""

    def legacy(self) -> dict[str, list[tuple[str, int]]]:
        """Messages (message id, job id; -1 when malformed) per stream left in a layout this
        version no longer serves (a queue written by a kiln before fair queueing): the caller
        enqueues their jobs again, in their tenants' lines, then calls `drop_legacy`."""
        return {}

    def drop_legacy(self, stream: str, message_ids: list[str]) -> None:  # noqa: B027
        """Delete messages `legacy` reported for `stream` (optional hook)."""

    def wake(self) -> None:  # noqa: B027 - optional hook
        """End every `claim` waiting now (it returns None): workers are stopping. A backend
        whose wait cannot be cut short (Redis's blocking read) ends it within `block_s`."""

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
