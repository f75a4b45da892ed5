"""One graph's resolution: a state machine, read top to bottom.

Each graph kiln compiles (AOTAutograd's, or a plan's) moves through these states; every
failure degrades one step and warns once per cause, never raising into the training job:

1. converted: to the wire format and keyed (`convert`); a graph kiln cannot express, or one
   on a device kiln cannot run, stays eager. A plan's graphs arrive converted; a backward
   compiled ahead (`kiln.ahead`) went through every state on its own thread, and the
   backward compiler takes that and settles it (`kiln.session.Session` picks the path).
2. cached: the local disk cache (`Resolver.search`); a tuned entry ends the search (the
   service is not asked).
3. probed: the service's schedule for the key, read on its hot path before anything is sent
   (`_probe`); a job that is done is a hit, and that answer is all.
4. submitted: the graph sent to the service (`poll`), joining or starting its job.
5. polling: `wait` mode polls until the tuned schedule, a final answer or the wait timeout
   (`_wait`); `async` mode takes what its one short exchange gave (`_ask`). A graph that is
   not tuned yet is then settled onto the background poller (`settle`), whose rounds
   (`poll_round`) go on from here.
6. built: the best schedule at hand is built (`build_from`), failing that the local
   heuristic (`build_local`), failing that the graph stays eager. A tuned build that lands
   later is swapped in between two calls (`CompiledGraph.install`).

A circuit breaker (`failed`, `service_down`) keeps a dead service off the critical path.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import compiler
from compiler.runtime.gil import short_switch_interval
from kiln import degrade, progress
from kiln.binaries import ServiceBinaries, precompile
from kiln.cache import ScheduleCache
from kiln.client import Answer, ServiceClient, ServiceError
from kiln.compiled import LEVELS, CompiledGraph, runs_eagerly_here
from kiln.config import Config

log = logging.getLogger("kiln")


@dataclass
class PollState:
    """Where polling one graph stands: whether the service knows it, and its job."""

    submitted: bool = False
    job_id: str | None = None
    probed: bool = False  # its schedule was read before a first submission (`Resolver.poll`)


# A graph not tuned yet, handed on to be polled in the background: (graph, where its
# polling stands, one round of it returning True when no more is needed).
Watch = Callable[[CompiledGraph, PollState, Callable[[CompiledGraph, PollState], bool]], None]

# After the service failed to answer (down, hung, 5xx), graphs compiled in the next
# BREAKER_S seconds do not wait for it; the background poller keeps trying meanwhile.
BREAKER_S = 30.0


# ---- 1. converted -------------------------------------------------------------------------

def convert(entry: CompiledGraph, example_inputs: list[Any], count: bool = True) -> bool:
    """To the wire format and keyed (`entry.describe`); False when the graph stays eager
    (warned once, and counted unless `count` is False: a backward compiled ahead, which
    its backward compiler converts again)."""
    from torch.utils._python_dispatch import _disable_current_modes

    from compiler.wire.graph import to_wire_and_graph

    if runs_eagerly_here(entry.device):
        degrade.warn_once("cpu_eager")
        if count:
            degrade.count("eager")
        return False
    start = time.perf_counter()
    try:
        # Under dynamo the inputs are fake tensors; only their metadata is used here.
        with _disable_current_modes():
            # to_wire + from_wire with the graph run on meta once: the key is from_wire's.
            wire, graph = to_wire_and_graph(entry.gm, example_inputs)
            target = compiler.Target.detect(str(entry.device))
            entry.describe(compiler.tuning_key(graph, target), graph, target, wire)
    except Exception as exc:  # a graph kiln cannot express runs eagerly
        degrade.warn_once("unsupported", f"{type(exc).__name__}: {exc}")
        if count:
            degrade.count("eager")
        return False
    degrade.add_seconds("wire", time.perf_counter() - start)
    return True


@dataclass
class Resolver:
    """What resolving needs from one configuration: its cache, its clients, its breaker,
    and where graphs not tuned yet go to be polled (`watch`; None: nowhere)."""

    config: Config
    cache: ScheduleCache | None
    client: ServiceClient | None
    quick_client: ServiceClient | None  # async mode: one short attempt on the critical path
    watch: Watch | None = None
    _down_until: float = 0.0
    _down_cause: str = "unreachable"

    @classmethod
    def from_config(cls, config: Config, watch: Watch | None = None) -> Resolver:
        """Cache and clients as the config says (`url` None: no service)."""
        cache = (ScheduleCache(config.schedule_dir, config.cache_max_bytes) if config.cache
                 else None)
        client = quick = None
        if config.url:
            client = ServiceClient(config.url, config.token, config.connect_timeout,
                                   config.request_timeout, config.retries)
            short = min(config.connect_timeout, 1.0)
            quick = ServiceClient(config.url, config.token, short,
                                  min(config.request_timeout, 2.0), retries=0)
        return cls(config=config, cache=cache, client=client, quick_client=quick, watch=watch)

    def resolve(self, entry: CompiledGraph) -> None:
        """States 2 to 6 for a converted graph: search, then settle."""
        self.settle(entry, self.find(entry))

    def find(self, entry: CompiledGraph) -> Answer | None:
        """The search (`search`) as the compile threads run it: timed, with a short switch
        interval (its file and network I/O, binaries installed, kernels loaded and the
        service's answers, runs beside other threads' Python: compiler/runtime/gil.py),
        outside dynamo's fake modes; whatever it raises leaves what is installed (or eager),
        warned once. Returns the service's last answer, or None."""
        from torch.utils._python_dispatch import _disable_current_modes

        answer = None
        with degrade.timed("resolve"), short_switch_interval():
            try:
                with _disable_current_modes():
                    answer = self.search(entry)
            except Exception as exc:  # degrade to what is installed (or eager)
                degrade.warn_once("build_failed",
                                  f"{entry.key[:12]}: {type(exc).__name__}: {exc}")
                log.debug("kiln: resolve failed", exc_info=True)
        return answer

    # ---- 2. cached, then the service, then built --------------------------------------------

    def search(self, entry: CompiledGraph) -> Answer | None:
        """Give `entry` the best implementation obtainable now (the module docstring's order).
        Returns the service's last answer (None when it gave none), from which `settle`
        decides whether the background poller keeps watching."""
        if self.cache is not None:
            cached = self.cache.get(entry.key)
            if cached is not None:
                level = "tuned" if cached.status == "tuned" else "heuristic"
                if not self.build_from(entry, cached.schedule, level, "cache"):
                    self._discard(entry.key)  # unusable here: let a good entry replace it
                if entry.level == "tuned":
                    return None
        answer = None
        if self.client is not None:
            answer = self._exchange_while_lowering(entry)
            if answer is not None and answer.schedule is not None:
                level = "tuned" if answer.status == "tuned" else "heuristic"
                self.build_from(entry, answer.schedule, level, "service")
            if answer is not None and answer.status in ("tuned", "failed"):
                entry.final = True  # even if unusable here: polling will not improve it
        if entry.level == "eager":
            self.build_local(entry)
        return answer

    def _exchange_while_lowering(self, entry: CompiledGraph) -> Answer | None:
        """The service exchange (`_wait` or `_ask`, by mode) on a thread of its own while
        this thread lowers the graph: whatever schedule comes, its build starts from that
        lowering (`compiler.lower_graph` keeps it), and the exchange mostly waits on the
        network. A graph that does not lower is left for the build to report."""
        done: list[Answer | None] = []
        failed: list[BaseException] = []

        def exchange() -> None:
            try:
                if self.config.mode == "wait":
                    with degrade.timed("service"):
                        done.append(self._wait(entry))
                else:
                    done.append(self._ask(self.quick_client, entry))
            except BaseException as exc:  # noqa: BLE001 - raised again on this thread
                failed.append(exc)

        thread = threading.Thread(target=exchange, name="kiln-exchange", daemon=True)
        started = time.monotonic()
        thread.start()
        with degrade.timed("lower"):
            try:
                compiler.lower_graph(entry.graph)
            except Exception:  # noqa: BLE001 - the build raises it again, and reports it
                log.debug("kiln: lowering %s ahead of its schedule failed", entry.key[:12],
                          exc_info=True)
        self._join_saying_so(thread, entry, started, done)
        if failed:
            raise failed[0]
        return done[0]

    def _join_saying_so(self, thread: threading.Thread, entry: CompiledGraph, started: float,
                        done: list[Answer | None]) -> None:
        """Join the exchange; a wait-mode one still running `progress.NOTICE_S` after it
        started is logged, and so is how it ended (`kiln.progress`)."""
        if self.config.mode == "wait":  # async: one short attempt, nothing to report
            thread.join(max(0.0, started + progress.NOTICE_S - time.monotonic()))
        if not thread.is_alive() or self.config.mode != "wait":
            thread.join()
            return
        progress.waiting(entry, time.monotonic() - started, self.config.wait_timeout)
        thread.join()
        progress.waited(entry, done[0] if done else None, time.monotonic() - started)

    def _ask(self, client: ServiceClient | None, entry: CompiledGraph,
             state: PollState | None = None) -> Answer | None:
        """Submit once, unless the breaker says the service is down; None without an answer."""
        if self.service_down():
            degrade.count(f"fallback:{self._down_cause}")
            return None
        try:
            return self.poll(entry, state or PollState(), client)
        except ServiceError as exc:
            self.failed(exc)
            return None

    # ---- 3. probed, 4. submitted: one round with the service -------------------------------

    def poll(self, entry: CompiledGraph, state: PollState,
             client: ServiceClient | None = None) -> Answer:
        """One round: submit the graph when the service does not know it (first round, or
        it answered "unknown": invalidated or forgotten), else read its schedule; `state`
        keeps the job. Before the first submission its schedule is read (`_probe`): on a
        hit that answer is all. Raises `ServiceError`."""
        client = client or self.client
        assert client is not None
        if state.submitted:
            answer = client.schedule(entry.key)
        else:
            answer = self._probe(client, entry, state) or client.submit(
                entry.wire, entry.target.to_json(), entry.key, entry.tag)
        self.answered()
        state.submitted = answer.status != "unknown"
        if answer.job_id is not None:  # a 200 GET does not repeat it
            state.job_id = answer.job_id
        return answer

    @staticmethod
    def _probe(client: ServiceClient, entry: CompiledGraph, state: PollState) -> Answer | None:
        """The key's schedule read on the service's hot path, once per `state`: the answer
        when its job is done (a hit: nothing will improve the schedule), else None and the
        graph is submitted (joining or starting its job, the wire form restored if the
        service dropped it). A hit this way sends no graph and has the service validate
        none: GPT-2's training graphs (99 and 144 KB) took 3.4 and 3.9 ms to look up against
        38 and 57 ms to submit (`python -m bench.lookup_vs_submit`, CI machine)."""
        if state.probed:
            return None
        state.probed = True
        answer = client.schedule(entry.key)
        if answer.job_done:
            degrade.count("schedules_probed")
            return answer
        return None

    # ---- 5. polling: `wait` mode here; the background poller a round at a time -------------

    def _wait(self, entry: CompiledGraph) -> Answer | None:
        """Submit, then poll until a tuned schedule, a final answer, or the wait timeout."""
        assert self.client is not None
        deadline = time.monotonic() + self.config.wait_timeout
        state = PollState()
        answer = self._ask(self.client, entry, state)
        try:
            while answer is not None and answer.status not in ("tuned", "failed"):
                last = self.settled(entry, state, answer)
                if last is not None:  # nothing better is coming (no tuner, or it failed)
                    answer, entry.final = last, True
                    break
                if time.monotonic() + self.config.poll_interval > deadline:
                    degrade.warn_once("wait_timeout", f"{self.config.wait_timeout:g}s for "
                                      f"{entry.key[:12]}")
                    break
                time.sleep(self.config.poll_interval)
                answer = self.poll(entry, state)
                if answer.status == "unknown":  # invalidated or forgotten: submit again
                    answer = self._ask(self.client, entry, state)
        except ServiceError as exc:
            self.failed(exc)
        if answer is not None and answer.status == "failed":
            degrade.warn_once("rejected", f"the service failed to build {entry.key[:12]}")
        if answer is not None and answer.job_id is None and state.job_id is not None:
            answer = dataclasses.replace(answer, job_id=state.job_id)
        return answer

    def settled(self, entry: CompiledGraph, state: PollState,
                answer: Answer | None = None) -> Answer | None:
        """When the graph's job is over (done or failed), its schedule read once more (a
        tuned one may have landed with the job); None while the job runs or none is known.
        An `answer` that read the job done together with its schedule (a submission's,
        `job_status`) is that last read already: two round trips fewer on a first step
        whose service has no tuner."""
        if answer is not None and answer.job_done:
            return answer
        assert self.client is not None
        if state.job_id is None or not self.job_final(state.job_id):
            return None
        return self.client.schedule(entry.key)

    def job_final(self, job_id: str) -> bool:
        """Whether the service's job is over (done or failed); a failed job is warned."""
        assert self.client is not None
        job = self.client.job(job_id)
        if job.status == "failed":
            degrade.warn_once("rejected", f"job {job_id}: {job.error}")
        return job.status in ("done", "failed")

    def settle(self, entry: CompiledGraph, answer: Answer | None) -> None:
        """The search is over: count a graph left eager; hand one that is not tuned yet,
        and may be, to the background poller."""
        if entry.level == "eager":
            degrade.count("eager")
        if entry.level != "tuned" and not entry.final and self.client is not None \
                and self.watch is not None:
            self.watch(entry, PollState(submitted=answer is not None,
                                        job_id=answer.job_id if answer is not None else None),
                       self.poll_round)
        log.debug("kiln: compiled %r", entry)

    def poll_round(self, entry: CompiledGraph, state: PollState) -> bool:
        """One background round for a settled graph (the poller's): submit it if the
        service does not know it, read its schedule, build a tuned one (or a heuristic one
        for a graph still eager); True when it needs no more polling."""
        assert self.client is not None
        try:
            answer = self.poll(entry, state)
            if answer.status == "unknown":  # never seen, or invalidated: submit next round
                return False
            if answer.status == "failed":
                return True
            if answer.status == "tuned" and answer.schedule is not None:
                self.build_from(entry, answer.schedule, "tuned", "service")
                return True  # a tuned schedule that cannot be built will not improve
            if answer.status == "heuristic" and answer.schedule is not None \
                    and entry.level == "eager":
                self.build_from(entry, answer.schedule, "heuristic", "service")
            last = self.settled(entry, state, answer)
            if last is None:
                return False
            if last.status == "tuned" and last.schedule is not None:
                self.build_from(entry, last.schedule, "tuned", "service")
            return True
        except ServiceError as exc:
            self.failed(exc)
            return False

    # ---- 6. built ---------------------------------------------------------------------------

    def build_from(self, entry: CompiledGraph, schedule_json: dict[str, Any], level: str,
                   origin: str) -> bool:
        """Parse, check and build a schedule that came from the cache or the service, and
        install it in `entry`. Returns False (after warning once) when it cannot be used."""
        if LEVELS[level] <= LEVELS[entry.level]:
            return False
        url = self.config.url or "?"
        try:
            schedule = compiler.Schedule.from_json(schedule_json)
        except Exception as exc:  # any parse failure is "malformed"
            degrade.warn_once("malformed", f"schedule for {entry.key[:12]}: {exc}", url=url)
            return False
        expected = compiler.graph_hash(entry.graph)
        if getattr(schedule, "graph_hash", expected) != expected:
            degrade.warn_once("malformed", f"schedule for {entry.key[:12]} names another graph",
                              url=url)
            return False
        try:
            built = self._build(entry, schedule)
        except compiler.ScheduleMismatch as exc:
            degrade.warn_once("hash_mismatch", f"{entry.key[:12]}: {exc}")
            return False
        except Exception as exc:  # a schedule we cannot build is a miss
            degrade.warn_once("bad_schedule", f"{entry.key[:12]}: {type(exc).__name__}: {exc}")
            return False
        degrade.count("builds")
        degrade.count(f"schedules_{'cached' if origin == 'cache' else 'fetched'}")
        entry.install(built, level, origin)
        if origin == "service":
            self._store(entry.key, level, built)
        return True

    def build_local(self, entry: CompiledGraph) -> bool:
        """Build from the heuristic schedule computed here; on failure the graph stays
        eager (warned once)."""
        if entry.level != "eager":
            return True
        try:
            schedule = compiler.heuristic_schedule(entry.graph, entry.target)
            degrade.count("schedules_local")
            built = self._build(entry, schedule)
        except NotImplementedError as exc:
            degrade.warn_once("unsupported", f"{entry.key[:12]}: {exc}")
            return False
        except Exception as exc:  # degrade to eager, never break the job
            degrade.warn_once("build_failed", f"{entry.key[:12]}: {type(exc).__name__}: {exc}")
            log.debug("kiln: local build failed", exc_info=True)
            return False
        degrade.count("builds")
        entry.install(built, "heuristic", "local")
        self._store(entry.key, "heuristic", built)  # a restart skips even the heuristic
        return True

    def _build(self, entry: CompiledGraph, schedule: compiler.Schedule) -> compiler.Built:
        """Build and load every kernel onto the device: whichever thread builds (the
        background poller, too) also pays Triton's compile, not the first call after the
        swap; a kernel that does not compile fails the build here, not the training step.
        Kernels the service holds compiled binaries of are loaded instead of compiled
        (`kiln.binaries`)."""
        with degrade.timed("build"):
            built = compiler.build(entry.graph, schedule)
        degrade.count("kernels", len(built.kernels))
        with degrade.timed("precompile"):
            precompile(built, entry.device, self.binaries(), entry.key)
        return built

    def binaries(self) -> ServiceBinaries | None:
        """Where precompiling gets compiled kernels: the service, unless there is none, it
        is down, or `KILN_BINARIES=off`."""
        if self.client is None or not self.config.binaries or self.service_down():
            return None
        return ServiceBinaries(self.client)

    def _store(self, key: str, level: str, built: compiler.Built) -> None:
        if self.cache is None:
            return
        try:
            self.cache.put(key, level, built.schedule.to_json())
        except (OSError, ValueError, TypeError) as exc:
            degrade.warn_once("cache", f"{self.cache.root}: {exc}")

    def _discard(self, key: str) -> None:
        assert self.cache is not None
        try:
            self.cache.discard(key)
        except OSError as exc:
            degrade.warn_once("cache", f"{self.cache.root}: {exc}")

    # ---- circuit breaker: a dead service costs one timeout, not one per graph ---------------

    def service_down(self) -> bool:
        """Whether a recent failure says not to ask the service on the critical path."""
        return time.monotonic() < self._down_until

    def failed(self, exc: ServiceError) -> None:
        """Warn once for `exc`; if the service looks down, skip it for `BREAKER_S`."""
        degrade.warn_once(exc.cause, str(exc), url=self.config.url or "?")
        if exc.cause in ("unreachable", "timeout", "server_error"):
            self._down_until = time.monotonic() + BREAKER_S
            self._down_cause = exc.cause

    def answered(self) -> None:
        """The service answered: ask it again on the critical path."""
        self._down_until = 0.0
