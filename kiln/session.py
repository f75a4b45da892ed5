"""A session: everything kiln keeps for one configuration.

Each `kiln.Config` a compile runs under gets one `Session` (`for_config`), which owns
- the resolver (`kiln.resolve`: cache, service clients, circuit breaker), which takes each
  graph from converted to built;
- the poller (`kiln.poller`), the thread that swaps tuned builds in later;
- the background compiler (`kiln.background`, `KILN_BACKGROUND=1`);
- its plans (`kiln.plan_store`) and the backwards compiled ahead (`kiln.ahead`);
- the graphs it compiled (`compiled_graphs`, for debugging, tests and `kiln.report`).

`kiln.backend`, the dynamo/AOTAutograd adapter, hands each graph to its session: a graph
AOTAutograd made (`compile_static`) or the graphs of a plan (`compile_planned`).
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

import compiler
from kiln import degrade, plans, resolve
from kiln.ahead import Aheads
from kiln.background import Compiler
from kiln.client import check_url
from kiln.compiled import CompiledGraph, device_of
from kiln.config import Config
from kiln.gc_pause import gc_paused
from kiln.plan_store import PlanStore
from kiln.poller import Poller
from kiln.resolve import Resolver

log = logging.getLogger("kiln")

# How much longer than the service wait a backward resolved ahead may take before the
# first step runs through AOTAutograd's runtime instead of its plan.
AHEAD_GRACE_S = 30.0
PUBLISH_AT_EXIT_S = 10.0  # at exit, how long plans still being stored are waited for


class Session:
    """The resolver, poller, background compiler, plans and backwards ahead of one config."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.poller = Poller(config.poll_interval, config.poll_for)
        self.resolver = Resolver.from_config(config, watch=self.poller.watch)
        self.compiler = Compiler()  # its thread starts with its first job
        self.plans = PlanStore(self.resolver)
        self.aheads = Aheads(self.resolver)
        self._lock = threading.Lock()
        self._compiled: weakref.WeakSet[CompiledGraph] = weakref.WeakSet()

    def compiled_graphs(self) -> list[CompiledGraph]:
        with self._lock:
            return list(self._compiled)

    def _new_entry(self, gm: torch.fx.GraphModule, kind: str, device: torch.device,
                   tag: str | None) -> CompiledGraph:
        entry = CompiledGraph(gm, kind=kind, device=device, tag=tag)
        with self._lock:
            self._compiled.add(entry)
        return entry

    # ---- a graph AOTAutograd made --------------------------------------------------------

    def compile_static(self, gm: torch.fx.GraphModule, example_inputs: list[Any], kind: str,
                       tag: str | None, recorder: plans.Recorder | None = None
                       ) -> CompiledGraph:
        """A graph with static sizes: resolved now, or by the background compiler (it
        runs eagerly meanwhile)."""
        entry = self._new_entry(gm, kind, device_of(example_inputs), tag)
        if recorder is not None:  # now: AOTAutograd's metadata is at hand only in its compilers
            if kind == "backward":
                recorder.backward_compiling(entry)
            else:
                recorder.forward_compiling(entry)
        if self.config.background:
            from torch.fx._lazy_graph_module import _LazyGraphModule

            _LazyGraphModule.force_recompile(gm)  # eager calls and the converter must not race
            self.compiler.submit(functools.partial(self._resolve, entry, example_inputs,
                                                   recorder))
        else:
            self._resolve(entry, example_inputs, recorder)
        return entry

    def _resolve(self, entry: CompiledGraph, example_inputs: list[Any],
                 recorder: plans.Recorder | None = None) -> None:
        """Convert `entry`'s graph and resolve it (`kiln.resolve`); what fails leaves it
        eager (warned once). On the training thread, or the background one. A backward whose
        graph was compiled ahead (`kiln.ahead`, while its forward compiled) takes that."""
        with gc_paused():
            try:
                if entry.kind == "backward" and self.aheads.take(entry, example_inputs):
                    return  # the very graph compiled ahead: its conversion too
                if not resolve.convert(entry, example_inputs):
                    return
                if entry.kind == "backward" and self.aheads.take(entry):
                    return
                self.resolver.resolve(entry)
            finally:  # after the service answered: the plan's upload must not delay that
                if recorder is not None:
                    recorder.converted()

    # ---- a dynamo graph's plan: AOTAutograd's graphs, run without it ---------------------

    def recorder(self, key: str, example_inputs: Sequence[Any]) -> plans.Recorder:
        """What records the plan of the dynamo graph `key` while AOTAutograd compiles it."""
        return plans.Recorder(key, self.plans.publish, plans.shares_storage(example_inputs))

    def compile_planned(self, key: str, gm: torch.fx.GraphModule,
                        example_inputs: Sequence[Any], tag_of: Callable[[str], str | None]
                        ) -> plans.PlanRunner | None:
        """Compile the dynamo graph from the plan kept for `key` (local cache, then the
        service), without AOTAutograd; None when there is none or it does not fit."""
        from torch.utils._python_dispatch import _disable_current_modes

        with degrade.timed("plan"), gc_paused(), _disable_current_modes():
            plan = self.plans.load(key)
            if plan is None:
                return None
            try:
                plans.check_against(plan, gm, example_inputs)
            except plans.NotPlannable as exc:
                log.debug("kiln: plan %s does not fit: %s", key[:12], exc)
                degrade.count("plans_refused")
                return None
            device = device_of(example_inputs)
            target = compiler.Target.detect(str(device))
            kind = "forward" if plan.backward is not None else "inference"
            forward = self._planned_entry(plan.forward, kind, device, target, tag_of(kind))
            backward = None
            if plan.backward is not None:
                backward = self._resolve_later(self._planned_entry(
                    plan.backward, "backward", device, target, tag_of("backward")))
            degrade.count("plans_used")
        self._resolve_planned(forward)
        return plans.PlanRunner(plan, forward, backward)

    def planned_now(self, recorder: plans.Recorder, compiled: Any) -> Any:
        """What AOTAutograd just compiled (`compiled`), run from now on as a service hit
        runs it: by the plan its compile recorded, over the same two compiled graphs (the
        forward, and the backward resolved ahead), without AOTAutograd's runtime, which
        costs host time on every step that the plan's runner does not (resnet18's
        training step on an H200, same kernels: 3.15 ms a step through the runtime, 2.81
        through the plan). `compiled` itself where there is no plan to run yet: a training
        graph whose backward is not resolved ahead (CPU, `KILN_BACKGROUND=1`), or one
        AOTAutograd's metadata keeps from a plan."""
        try:
            return self._planned_now(recorder, compiled)
        except Exception as exc:  # noqa: BLE001 - a plan never breaks the job: AOTAutograd's runtime
            degrade.warn_once("plan", f"{recorder.key[:12]}: {type(exc).__name__}: {str(exc)[:200]}")
            return compiled

    def _planned_now(self, recorder: plans.Recorder, compiled: Any) -> Any:
        forward = recorder.forward
        if forward is None or forward.graph is None:
            return compiled
        ahead = None
        if forward.kind != "inference":
            ahead = self.aheads.of(recorder.backward)
            if ahead is None or not ahead.done.wait(self.config.wait_timeout + AHEAD_GRACE_S):
                return compiled
        plan = recorder.plan_now()
        if plan is None or (plan.backward is None) != (ahead is None):
            return compiled
        backward = None
        if ahead is not None:
            with self._lock:
                self._compiled.add(ahead.entry)
            backward = functools.partial(self.aheads.claim, ahead)
        degrade.count("plans_now")
        return plans.PlanRunner(plan, forward, backward)

    def _planned_entry(self, graph: compiler.Graph, kind: str, device: torch.device,
                       target: compiler.Target, tag: str | None) -> CompiledGraph:
        entry = self._new_entry(graph.to_fx(device), kind, device, tag)
        entry.describe(compiler.tuning_key(graph, target), graph, target)
        degrade.count("graphs")
        return entry

    def _resolve_planned(self, entry: CompiledGraph) -> None:
        """Resolve a graph a plan gave (converted already), here or in the background."""
        if self.config.background:
            self.compiler.submit(functools.partial(self._resolve_converted, entry))
        else:
            self._resolve_converted(entry)

    def _resolve_converted(self, entry: CompiledGraph) -> None:
        with gc_paused():
            self.resolver.resolve(entry)

    def _resolve_later(self, entry: CompiledGraph) -> Callable[[], CompiledGraph]:
        """A planned backward: built on a thread of its own while the forward builds (CUDA,
        outside KILN_BACKGROUND=1, as a backward compiled ahead), else on the first backward
        call; returns what that call waits on."""
        if self.config.background:
            self._resolve_planned(entry)
            return lambda: entry
        if entry.device.type != "cuda":  # the interpreter is not thread-safe
            once = threading.Lock()
            built: list[CompiledGraph] = []

            def on_first_call() -> CompiledGraph:
                with once:
                    if not built:
                        self._resolve_converted(entry)
                        built.append(entry)
                return entry

            return on_first_call
        thread = threading.Thread(target=self._resolve_converted, args=(entry,),
                                  name="kiln-backward-planned", daemon=True)
        thread.start()

        def joined() -> CompiledGraph:
            thread.join()
            return entry

        return joined

    def stop(self) -> None:
        """Stop the poller and forget the backwards compiled ahead (after `compiler.stop()`:
        the background compiler's last jobs may hand graphs to the poller)."""
        self.poller.stop()
        self.aheads.clear()


# ---- the sessions of this process -------------------------------------------------------------

class _Sessions:
    """One `Session` per configuration, made on first use."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_config: dict[Config, Session] = {}

    def all(self) -> list[Session]:
        with self.lock:
            return list(self.by_config.values())


_SESSIONS = _Sessions()


def for_config(config: Config) -> Session:
    """The session of `config`, without its service when its URL is not one kiln can talk
    to (warned once as a bad setting): the graphs then build locally, as with KILN_URL=off."""
    if config.url is not None:
        try:
            check_url(config.url)
        except ValueError as exc:
            degrade.warn_once("config", str(exc), action="building graphs locally without "
                              "the service (as with KILN_URL=off) until it is fixed")
            config = dataclasses.replace(config, url=None)
    with _SESSIONS.lock:
        session = _SESSIONS.by_config.get(config)
        if session is None:
            session = _SESSIONS.by_config[config] = Session(config)
        return session


def sessions() -> list[Session]:
    """This process's sessions, one per configuration that compiled."""
    return _SESSIONS.all()


def compiled_graphs() -> list[CompiledGraph]:
    """The graphs this process compiled through kiln and still holds (debugging, tests)."""
    return [entry for session in _SESSIONS.all() for entry in session.compiled_graphs()]


def wait_compiled(timeout: float | None = None) -> bool:
    """Block until every graph handed to the background compiler (`KILN_BACKGROUND=1`) is
    built, or has failed to be and runs eagerly; False if `timeout` seconds passed first.
    Returns True at once when nothing compiles in the background."""
    deadline = None if timeout is None else time.monotonic() + timeout
    return all(session.compiler.wait(None if deadline is None
                                     else max(0.0, deadline - time.monotonic()))
               for session in _SESSIONS.all())


def wait_plans(timeout: float | None = None) -> bool:
    """Block until the plans being sent to the service are sent (or failed); False if
    `timeout` seconds passed first. Runs at exit, bounded by PUBLISH_AT_EXIT_S."""
    deadline = None if timeout is None else time.monotonic() + timeout
    return all([session.plans.wait(deadline) for session in _SESSIONS.all()])


atexit.register(wait_plans, PUBLISH_AT_EXIT_S)


def shutdown() -> None:
    """Stop every session's threads (each background compiler after the jobs already
    queued, first) and forget the sessions and the graphs they compiled (tests; before a
    fork). Compiled graphs keep working; they just are not swapped any more."""
    with _SESSIONS.lock:
        stopping = list(_SESSIONS.by_config.values())
        _SESSIONS.by_config.clear()
    for session in stopping:
        session.compiler.stop()
    for session in stopping:
        session.stop()
