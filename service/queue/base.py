"""The queue interface. Messages carry only a job id; the database holds the job itself,
so a duplicate or replayed message is harmless (claiming in the database decides)."""

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


class JobQueue(ABC):
    """Work queue with leases: a message delivered but not acked within the lease is given
    to another consumer."""

    lease_s: float

    @abstractmethod
    def enqueue(self, stream: str, job_id: int) -> None:
        """Append a job id to a stream."""

    @abstractmethod
    def claim(self, streams: list[str], consumer: str, block_s: float) -> Delivery | None:
        """Next message for `consumer`: a message whose lease expired first, else a new one;
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

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections."""
