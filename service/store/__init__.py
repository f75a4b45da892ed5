"""The service's data layer: every query and write, by record kind. Callers own the
transaction (nothing here commits); everything else calls these named functions.

- jobs.py: job lookups, transitions and status history; `enqueue_after_commit`, the one way
  to put a job on the queue (a failed enqueue marks it `needs_enqueue` for recovery), and the
  query recovery runs.
- entries.py: graphs and entries: submissions, miss reasons, hit counters, schedules,
  kernels and measurements.
- workers.py: worker registration, heartbeats, silent workers.
- tokens.py: API tokens and dashboard sessions (by hash).
- lookup.py: the fast schedule read of `GET /v1/schedules/{key}` (no ORM).
- admin.py: what the admin routes and the dashboard read; retention.py: `kiln db prune`.
- binaries.py: compiled kernel binaries, stored by the worker that compiled them and
  fetched by clients by Triton cache key.
- plans.py: plans (kiln.plan/1) by client key and tenant, first writer wins per tenant.

The names of jobs, entries and workers are re-exported here (`store.submit`, `store.claim`).
"""

from service.store.binaries import BinaryRefused, add_binaries, binaries_by_keys
from service.store.entries import (
    MISS_REASONS,
    READY,
    Submission,
    add_job_owner,
    add_measurements,
    count_lookup,
    job_input,
    job_visible,
    minute,
    miss_reason,
    publish_schedule,
    record_hits,
    restore_wire,
    schedule_by_key,
    set_entry_status,
    submit,
)
from service.store.jobs import (
    WIRE_PRUNED,
    add_event,
    adopt_untuned,
    claim,
    enqueue_after_commit,
    fail_attempt,
    finish,
    finish_failed,
    hand_to_tuner,
    job_by_id,
    job_by_key,
    job_dict,
    note_timeout,
    note_unqueued,
    recoverable_jobs,
    release,
    renew,
    requeue,
    set_needs_enqueue,
    stream_name,
    take_after_commit,
    unfinished_jobs,
    unqueued,
)
from service.store.plans import (
    count_plans,
    delete_plan,
    get_plan,
    has_plan,
    list_plans,
    publish_plan,
    put_plan,
)
from service.store.workers import beat, bury_dead_workers, gpu_serves, register_worker, stop_worker

__all__ = [
    "BinaryRefused",
    "add_binaries",
    "binaries_by_keys",
    "count_plans", "delete_plan", "get_plan", "has_plan", "list_plans", "publish_plan", "put_plan",
    "MISS_REASONS", "READY", "WIRE_PRUNED", "Submission", "add_event", "add_job_owner",
    "add_measurements", "adopt_untuned", "beat", "bury_dead_workers", "claim", "count_lookup",
    "enqueue_after_commit", "fail_attempt", "finish", "finish_failed", "gpu_serves",
    "hand_to_tuner", "job_by_id", "job_by_key", "job_dict", "job_input", "job_visible",
    "minute", "miss_reason", "note_timeout", "note_unqueued", "publish_schedule",
    "record_hits", "recoverable_jobs", "register_worker", "release", "renew", "requeue",
    "restore_wire", "schedule_by_key", "set_entry_status", "set_needs_enqueue", "stop_worker",
    "stream_name", "submit", "take_after_commit", "unfinished_jobs", "unqueued",
]
