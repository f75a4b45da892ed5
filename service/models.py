"""SQLAlchemy 2 models: the database is the record of truth for graphs, jobs and schedules.

Unique constraints carry correctness: one graph row per graph hash, one schedule row and one
job per tuning key, one token row per token hash, so concurrent submissions cannot duplicate.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import (
    JSON,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    TypeDecorator,
    false,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from service.tenants import DEFAULT_TENANT


def utcnow() -> datetime:
    """Timezone-aware now, the only clock the models use."""
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator):
    """Stores UTC; always gives back aware datetimes (SQLite drops the zone otherwise)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: object) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value

    def process_result_value(self, value: datetime | None, dialect: object) -> datetime | None:
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        return value


class Base(DeclarativeBase):
    pass


class Created:
    """A row's `created_at`, set when it is inserted."""

    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class CreatedUpdated(Created):
    """`created_at` and `updated_at`; whoever changes the row sets `updated_at`."""

    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class GraphRow(Created, Base):
    """A validated wire graph, stored once per graph hash."""

    __tablename__ = "graphs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    graph_hash: Mapped[str] = mapped_column(String(64), unique=True)
    # Canonical kiln.graph/1 JSON text; None once `kiln db prune --wire-days` dropped it (the
    # graph's entries went unused); a resubmission of the graph stores it again.
    wire: Mapped[str | None] = mapped_column(Text, nullable=True)
    op_summary: Mapped[dict] = mapped_column(JSON)
    num_nodes: Mapped[int] = mapped_column(Integer)


class ScheduleRow(CreatedUpdated, Base):
    """One entry per tuning key: the key's components, its status and the schedule JSON."""

    __tablename__ = "schedules"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)
    graph_hash: Mapped[str] = mapped_column(ForeignKey("graphs.graph_hash"), index=True)
    device_type: Mapped[str] = mapped_column(String(16))
    arch: Mapped[str] = mapped_column(String(32))
    device_name: Mapped[str] = mapped_column(String(128))
    torch_version: Mapped[str] = mapped_column(String(32))
    triton_version: Mapped[str] = mapped_column(String(32))
    compiler_version: Mapped[str] = mapped_column(String(32))
    queue_class: Mapped[str] = mapped_column(String(128), index=True)
    # pending | heuristic | tuned | failed | invalidated
    status: Mapped[str] = mapped_column(String(16), index=True)
    schedule: Mapped[str | None] = mapped_column(Text, nullable=True)  # kiln.schedule/1 JSON
    tag: Mapped[str | None] = mapped_column(String(200), nullable=True, index=True)
    eager_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    heuristic_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    tuned_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    tuning_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    hits: Mapped[int] = mapped_column(Integer, default=0)
    last_used_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class KernelRow(Base):
    """One generated kernel of a schedule, kept with its Triton source for inspection."""

    __tablename__ = "schedule_kernels"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    schedule_key: Mapped[str] = mapped_column(
        ForeignKey("schedules.key", ondelete="CASCADE"), index=True
    )
    position: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(16))
    variant: Mapped[str] = mapped_column(String(32))
    config: Mapped[dict] = mapped_column(JSON)
    nodes: Mapped[list] = mapped_column(JSON)
    ops: Mapped[list] = mapped_column(JSON)
    source: Mapped[str | None] = mapped_column(Text, nullable=True)
    source_hash: Mapped[str | None] = mapped_column(String(64), nullable=True)
    heuristic_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    tuned_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    # What compiling for the target's GPU gave (registers, spills, shared memory, binary
    # size, ...: service.target_compile); null for CPU targets.
    compiled: Mapped[dict | None] = mapped_column(JSON, nullable=True)


class JobRow(CreatedUpdated, Base):
    """The work for one key. `stage` is build (CPU worker) or tune (GPU worker)."""

    __tablename__ = "jobs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(ForeignKey("schedules.key"), unique=True)
    stage: Mapped[str] = mapped_column(String(8), default="build")
    status: Mapped[str] = mapped_column(String(16), index=True)  # queued|running|done|failed
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    # The GPU the tuning child ran on, as it reported it (`cuda:N`): with several GPUs per
    # host, which one tuned the key. Set when the tuning stage finishes.
    tuned_device: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # The tenant whose submission created the job: the queue serves tenants in turn.
    tenant: Mapped[str] = mapped_column(String(64), default=DEFAULT_TENANT,
                                        server_default=DEFAULT_TENANT)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    lease_until: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # Queued, but putting it on the queue failed (Redis down): the next submission of its key
    # or the next recovery pass enqueues it.
    needs_enqueue: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class JobEventRow(Base):
    """The status history of a job: every transition, when, by which worker, why."""

    __tablename__ = "job_events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    status: Mapped[str] = mapped_column(String(16))
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    worker_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)


class MeasurementRow(Base):
    """Every candidate a GPU worker timed: its config, time or error, and verification."""

    __tablename__ = "measurements"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    schedule_key: Mapped[str] = mapped_column(
        ForeignKey("schedules.key", ondelete="CASCADE"), index=True
    )
    job_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    worker_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    kernel: Mapped[str] = mapped_column(String(200))
    variant: Mapped[str | None] = mapped_column(String(32), nullable=True)
    config: Mapped[dict] = mapped_column(JSON)
    ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    verified: Mapped[bool] = mapped_column(Boolean, default=False)
    at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class WorkerRow(Base):
    """A worker process and its latest heartbeat."""

    __tablename__ = "workers"
    id: Mapped[str] = mapped_column(String(200), primary_key=True)
    device: Mapped[str] = mapped_column(String(32))
    queue_class: Mapped[str] = mapped_column(String(128), index=True)
    # running | stopped | dead (no heartbeat for a lease: killed or cut off)
    status: Mapped[str] = mapped_column(String(16), default="running")
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    heartbeat_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    current_job_id: Mapped[int | None] = mapped_column(Integer, nullable=True)


class TokenRow(Created, Base):
    """An API token; only its sha256 is stored."""

    __tablename__ = "api_tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    role: Mapped[str] = mapped_column(String(16))  # client | admin
    # Whose plans it reads and writes (service/tenants.py).
    tenant: Mapped[str] = mapped_column(String(64), default=DEFAULT_TENANT,
                                        server_default=DEFAULT_TENANT)
    name: Mapped[str | None] = mapped_column(String(200), nullable=True)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)


class DashboardSessionRow(Created, Base):
    """A dashboard login: the cookie holds a random id, this row its sha256. Logout deletes
    the row; revoking the admin token that opened it ends it too."""

    __tablename__ = "dashboard_sessions"
    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    token_hash: Mapped[str] = mapped_column(String(64), index=True)  # the admin token used
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)


class JobOwnerRow(Base):
    """Who submitted a job's key: a token's hash (anonymous loopback callers are not
    recorded). A client token reads only the jobs it submitted."""

    __tablename__ = "job_owners"
    job_id: Mapped[int] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"),
                                        primary_key=True)
    owner: Mapped[str] = mapped_column(String(64), primary_key=True)


class LookupCountRow(Base):
    """Hits and misses (by reason) per minute, for the stats page and its hit-rate series."""

    __tablename__ = "lookup_counts"
    bucket: Mapped[datetime] = mapped_column(UTCDateTime, primary_key=True)
    # hit | unknown_graph | other_gpu | other_versions | other_compiler
    kind: Mapped[str] = mapped_column(String(32), primary_key=True)
    count: Mapped[int] = mapped_column(Integer, default=0)


class KernelBinaryRow(Created, Base):
    """A kernel compiled for a target by the worker that compiled it, content-addressed by
    Triton's cache key (Triton's version, the kernel's source and specialisation, target,
    compile options). Opaque bytes to the service: stored and served, never loaded."""

    __tablename__ = "kernel_binaries"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    source_hash: Mapped[str] = mapped_column(String(64), index=True)
    arch: Mapped[str] = mapped_column(String(32))
    kernel: Mapped[str] = mapped_column(String(200))  # a schedule's name for it (display)
    size: Mapped[int] = mapped_column(Integer)  # bytes of all its files
    worker: Mapped[str | None] = mapped_column(String(200), nullable=True)


class KernelBinaryFileRow(Base):
    """One file of a kernel binary (its metadata JSON, its cubin) with the sha256 the
    worker computed when it stored it; clients check the bytes against it."""

    __tablename__ = "kernel_binary_files"
    key: Mapped[str] = mapped_column(
        ForeignKey("kernel_binaries.key", ondelete="CASCADE"), primary_key=True
    )
    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    sha256: Mapped[str] = mapped_column(String(64))
    data: Mapped[bytes] = mapped_column(LargeBinary)


class PlanRow(Created, Base):
    """A kiln.plan/1 document (compiler/wire/plan.py), under the key its client computed,
    one per tenant (service/tenants.py): a tenant's client reads its own tenant's plans and
    the published ones (tenant `*`), so no other tenant's write reaches its jobs. First
    writer wins within a tenant: a stored plan is never replaced, only deleted by an admin."""

    __tablename__ = "plans"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16))  # training | inference
    body: Mapped[str] = mapped_column(Text)  # plan_text(): canonical JSON, served as is
    bytes: Mapped[int] = mapped_column(Integer)  # of body, UTF-8
    hits: Mapped[int] = mapped_column(Integer, default=0)
    last_hit_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)
    # A published plan (tenant `*`): the tenant whose plan an admin published.
    published_from: Mapped[str | None] = mapped_column(String(64), nullable=True)


Index("ix_schedules_last_used", ScheduleRow.last_used_at)
