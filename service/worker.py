"""Worker processes: `kiln worker --device cpu` builds heuristic schedules for every target,
`kiln worker --device cuda:N` tunes for its GPU's target class.

A job is claimed in the database (attempts counted there) after its message is delivered;
a heartbeat thread renews the job's lease in both the database and the queue, records the
worker's heartbeat, and runs the recovery pass that re-enqueues what Redis lost.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from typing import Any

from service import build_child, metrics, pipeline, store
from service.context import ServiceContext
from service.logs import log_job_finished
from service.models import JobRow, utcnow
from service.queue import BUILD_STREAM, Delivery, QueueUnavailable, tune_stream
from service.target_compile import TargetCompileError

log = logging.getLogger(__name__)

BuildFn = Callable[[str, dict[str, Any], int], pipeline.Outcome]
TuneFn = Callable[..., pipeline.Outcome]  # pipeline.tune's signature


class WorkerInterrupted(BaseException):
    """Raised in the worker's thread by a second SIGTERM: give the job back and stop now."""


def install_signal_handlers(worker: Worker) -> None:
    """SIGTERM/SIGINT once: finish the job in hand, then stop. Twice: give the job back to
    the queue (the attempt is not counted) and stop at once. Call from the main thread that
    then runs `worker.run()`."""
    received = {"count": 0}

    def on_signal(signum: int, _frame: Any) -> None:
        received["count"] += 1
        if received["count"] == 1:
            log.info("signal %d: finishing the job in hand, then stopping", signum)
            worker.stop()
        else:
            raise WorkerInterrupted()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


class Worker:
    """One worker: `device` is "cpu" (build stream) or "cuda:N" (its target's tune stream).

    `tune_on_cpu=True` makes a CPU worker serve the CPU target's tune stream instead, timing
    candidates on the Triton interpreter (for tests and demos: interpreter times say nothing
    about GPU speed). `build` stands in for kiln's own build (None: `service.build_child`'s,
    in a child process with the settings' limits)."""

    def __init__(self, ctx: ServiceContext, device: str = "cpu", worker_id: str | None = None,
                 build: BuildFn | None = None, tune: TuneFn = pipeline.tune,
                 queue_class: str | None = None, block_s: float = 1.0,
                 tune_on_cpu: bool = False) -> None:
        self.ctx, self.device, self.block_s = ctx, device, block_s
        role = "cpu-tune" if tune_on_cpu else device
        self.id = worker_id or f"{socket.gethostname()}-{os.getpid()}-{role}-{uuid.uuid4().hex[:6]}"
        self._build, self._tune = build, tune
        if device == "cpu" and tune_on_cpu:
            self.queue_class, self.streams = "cpu", [tune_stream("cpu")]
        elif device == "cpu":
            self.queue_class, self.streams = "cpu", [BUILD_STREAM]
        else:
            if queue_class is None:
                import compiler

                queue_class = compiler.Target.detect(device).queue_class
            self.queue_class, self.streams = queue_class, [tune_stream(queue_class)]
        self._stop = threading.Event()
        self._current: tuple[JobRow, Delivery] | None = None
        self._progress: float | None = None  # of the job in hand, written by the heartbeat
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.processed = 0

    # ---- lifecycle -------------------------------------------------------------------------
    def run(self, announce: bool = True) -> None:
        """Serve jobs until stop() (or a signal) asks to stop; the job in hand is finished.
        `announce`: log the streams it serves (a thread's starter says so itself)."""
        self._register()
        beat = threading.Thread(target=self._heartbeat, name=f"kiln-heartbeat-{self.id}", daemon=True)
        beat.start()
        log.log(logging.INFO if announce else logging.DEBUG, "worker %s serving %s", self.id,
                ", ".join(self.streams))
        try:
            while not self._stop.is_set():
                try:
                    delivery = self.ctx.queue.claim(self.streams, self.id, self.block_s)
                except QueueUnavailable as exc:
                    log.warning("queue unavailable (%s); retrying", exc)
                    self._stop.wait(1.0)
                    continue
                if delivery is None:
                    continue
                try:
                    self._handle(delivery)
                except Exception:  # one job's trouble (Redis or the database gone) never ends the worker
                    log.exception("handling job %s failed; its message stays for a retry",
                                  delivery.job_id)
                    self._stop.wait(1.0)
        except WorkerInterrupted:
            log.info("worker %s interrupted", self.id)
        finally:
            self._stop.set()
            beat.join(timeout=5)
            self._unregister()

    def start_thread(self) -> threading.Thread:
        """Run in a daemon thread (the embedded worker of `kiln serve`, tests), which does
        not log the streams it serves: `kiln serve` does, before its start banner, and a
        line from the thread would come after it."""
        self._thread = threading.Thread(target=self.run, kwargs={"announce": False},
                                        name=f"kiln-worker-{self.id}", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self) -> None:
        """Stop after the job in hand (a wait for work ends now)."""
        self._stop.set()
        self.ctx.queue.wake()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the worker thread started by start_thread()."""
        if self._thread is not None:
            self._thread.join(timeout)

    # ---- one job ---------------------------------------------------------------------------
    def _handle(self, delivery: Delivery) -> None:
        settings = self.ctx.settings
        stage = "build" if delivery.stream == BUILD_STREAM else "tune"
        try:
            with self.ctx.transaction() as session:
                job = store.claim(session, delivery.job_id, stage, self.id, settings.lease_s,
                                  settings.max_attempts)
                if job is not None:
                    wire, entry = store.job_input(session, job.key)
                    if wire is None:  # dropped by `kiln db prune --wire-days`
                        store.finish_failed(session, job, self.id, store.WIRE_PRUNED)
                        job = None
                    queue_class = entry.queue_class
                    target_json = {"device_type": entry.device_type, "arch": entry.arch,
                                   "name": entry.device_name, "torch": entry.torch_version,
                                   "triton": entry.triton_version,
                                   "compiler": entry.compiler_version}
        except Exception:
            log.exception("claiming job %s failed; the message stays for a retry", delivery.job_id)
            self._stop.wait(1.0)
            return
        if job is None:  # finished, held by a live worker, out of attempts, or no graph body
            self.ctx.queue.ack(delivery)
            return
        with self._lock:
            self._current, self._progress = (job, delivery), None
        try:
            self._run_job(job, stage, wire, target_json, queue_class, delivery)
        except WorkerInterrupted:
            with self.ctx.transaction() as session:
                store.release(session, job, self.id, "worker stopped; job given back")
                store.enqueue_after_commit(session, stage, queue_class, job.id, job.tenant)
            self.ctx.queue.ack(delivery)
            raise
        finally:
            with self._lock:
                self._current = None

    def _run_job(self, job: JobRow, stage: str, wire: str, target_json: dict[str, Any],
                 queue_class: str, delivery: Delivery) -> None:
        settings = self.ctx.settings
        started = time.monotonic()
        log.info("job %s (%s) attempt %d on %s", job.id, stage, job.attempts, self.id)
        try:
            with metrics.timed(stage):
                if stage == "build":
                    outcome = build_child.run(self._build, wire, target_json, settings)
                else:
                    outcome = self._tune(wire, target_json, settings.tune_trials,
                                         settings.tune_seconds, device=self.device,
                                         progress=self._set_progress)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            log.warning("job %s failed on %s: %s\n%s", job.id, self.id, error, traceback.format_exc())
            # A kernel that does not compile for the target, or a build past its time or
            # memory limit, fails the same way every time.
            final = isinstance(exc, (TargetCompileError, build_child.BuildLimitError))
            attempts = job.attempts if final else settings.max_attempts
            with self.ctx.transaction() as session:
                state = store.fail_attempt(session, job, self.id, error[:4000], attempts)
                if state == "queued":
                    store.enqueue_after_commit(session, stage, queue_class, job.id, job.tenant)
            self.ctx.queue.ack(delivery)
            self._finished(job, stage, "retry" if state == "queued" else "failed", started)
            return
        status = "heuristic" if stage == "build" else "tuned"
        with self.ctx.transaction() as session:
            store.publish_schedule(session, job.key, status, outcome.schedule, outcome.kernels,
                                   outcome.timings)
            if outcome.measurements:
                store.add_measurements(session, job.key, job.id, self.id, outcome.measurements)
            if outcome.binaries:
                try:
                    store.add_binaries(session, outcome.binaries, self.id)
                except store.BinaryRefused as exc:  # clients compile those kernels themselves
                    log.warning("job %s: compiled kernels not stored: %s", job.id, exc)
            if stage == "build" and target_json["device_type"] != "cpu" and \
                    store.gpu_serves(session, queue_class, self._gpu_window_s()):
                if store.hand_to_tuner(session, job, self.id):
                    store.enqueue_after_commit(session, "tune", queue_class, job.id, job.tenant)
            elif stage == "tune":
                store.finish(session, job, self.id, self._tuned_note(outcome), outcome.device)
            else:
                store.finish(session, job, self.id, outcome.note)
        self.ctx.queue.ack(delivery)
        self.processed += 1
        self._finished(job, stage, "done", started)

    def _finished(self, job: JobRow, stage: str, outcome: str, started: float) -> None:
        """The job stage's duration histogram and its one log line."""
        seconds = time.monotonic() - started
        metrics.observe_job(stage, outcome, seconds)
        log_job_finished(log, job.id, job.key, stage, outcome, seconds, self.id, job.attempts)

    def _tuned_note(self, outcome: pipeline.Outcome) -> str:
        """The tuning note with the GPU the child reported; a child on another GPU than
        this worker's is logged (the record keeps what the child said)."""
        if outcome.device is None:
            return outcome.note
        if outcome.device != ("cuda:0" if self.device == "cuda" else self.device):
            log.warning("worker %s (%s): its tuning child reported %s", self.id, self.device,
                        outcome.device)
        return f"{outcome.note} (on {outcome.device})"

    def _set_progress(self, fraction: float) -> None:
        # Tuning is the second half of a job (the heuristic build was the first).
        self._progress = 0.5 + 0.5 * min(max(fraction, 0.0), 1.0)

    # ---- background ------------------------------------------------------------------------
    def _heartbeat(self) -> None:
        settings = self.ctx.settings
        since_recovery = settings.lease_s  # recover on the first beat
        while not self._stop.wait(settings.heartbeat_s):
            with self._lock:
                current = self._current
            try:
                overdue = current is not None and self._overdue(current[0])
                with self.ctx.transaction() as session:
                    store.beat(session, self.id, current[0].id if current else None)
                    if current and overdue:
                        store.note_timeout(session, current[0], self.id, overdue)
                    elif current:
                        store.renew(session, current[0].id, self.id, settings.lease_s,
                                    self._progress)
                if current and not overdue:
                    self.ctx.queue.touch(current[1], self.id)
                since_recovery += settings.heartbeat_s
                if since_recovery >= settings.lease_s:
                    since_recovery = 0.0
                    self.ctx.recover()
            except Exception as exc:  # database or Redis down: keep beating
                log.warning("heartbeat of %s failed: %s", self.id, exc)

    def _gpu_window_s(self) -> float:
        """How recent a GPU worker's heartbeat must be for it to count as serving."""
        return max(3 * self.ctx.settings.heartbeat_s, 15.0)

    def _overdue(self, job: JobRow) -> float | None:
        """The time limit a job in hand has run past, or None. Past it the lease is no longer
        renewed, so another worker takes the job over (a hung build cannot hold it forever)."""
        settings = self.ctx.settings
        limit = settings.build_timeout_s if job.stage == "build" else \
            settings.tune_seconds + settings.build_timeout_s
        started = job.started_at or utcnow()
        return limit if (utcnow() - started).total_seconds() > limit else None

    def _register(self) -> None:
        with self.ctx.transaction() as session:
            store.register_worker(session, self.id, self.device, self.queue_class)
            adopted = [] if self.device == "cpu" else \
                store.adopt_untuned(session, self.queue_class, self.id)
        if adopted:
            log.info("worker %s will tune %d entries built before it started", self.id,
                     len(adopted))

    def _unregister(self) -> None:
        try:
            with self.ctx.transaction() as session:
                store.stop_worker(session, self.id)
        except Exception as exc:
            log.warning("could not mark worker %s stopped: %s", self.id, exc)
