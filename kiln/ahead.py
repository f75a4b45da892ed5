"""Backwards compiled while their forward compiles.

AOTAutograd compiles a training graph's backward only when the first backward runs, after
the forward compiled and ran: one after the other, each with its own round of compile
workers. The partitioner hands kiln the backward graph with the forward
(`kiln.backend._Partition`), so a thread resolves it (`Ahead`) while the forward compiles;
the backward compiler, later, takes that conversion and build (`Aheads.take`) when its
graph has the same `fingerprint` (a copy of the same graph), else when its converted
graph has the same tuning key, and otherwise compiles as before. Only for CUDA graphs
outside KILN_BACKGROUND=1: the interpreter is not thread-safe, and background builds leave
the training thread anyway. Each session (`kiln.session`) keeps its own.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from kiln import degrade, resolve
from kiln.compiled import CompiledGraph, device_of, has_symbolic_sizes
from kiln.gc_pause import gc_paused

if TYPE_CHECKING:
    from kiln.plans import Recorder

log = logging.getLogger("kiln")

MAX_AHEAD = 8  # backwards compiled ahead and not taken yet, kept (the oldest dropped)
# Tests: compile CPU (interpreter) backwards ahead too, and finish before the forward runs.
ON_CPU = False


def fingerprint(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> str:
    """What converting a graph depends on, much cheaper to compute than the conversion:
    each node's op, target, name and arguments (argument nodes by name), and each input's
    size, strides, dtype and device. Two graphs with one fingerprint convert alike."""
    parts = []
    for node in gm.graph.nodes:
        args = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: a.name)
        parts.append(f"{node.op}|{node.target}|{node.name}|{args!r}")
    for x in inputs:
        parts.append(repr((tuple(x.shape), x.stride(), x.dtype, x.device))
                     if isinstance(x, torch.Tensor) else f"{type(x).__name__}:{x!r}")
    return "\n".join(parts)


class Ahead:
    """A backward graph resolved on a thread of its own: converted, then searched for (the
    answer kept for `Resolver.settle` when the backward compiler takes it)."""

    def __init__(self, gm: torch.fx.GraphModule, inputs: list[Any], resolver: resolve.Resolver,
                 tag: str | None, recorder: Recorder | None = None) -> None:
        self.entry = CompiledGraph(gm, kind="backward", device=device_of(inputs), tag=tag)
        self.resolver = resolver
        self.recorder = recorder
        if recorder is not None:
            recorder.backward_compiling(self.entry)
        self.converted = threading.Event()  # entry.key is set (or conversion failed)
        self.done = threading.Event()
        self.answer: Any = None
        self.ok = False
        self.fingerprint: str | None = None  # `fingerprint` of its graph and inputs
        self._inputs = inputs
        self.thread = threading.Thread(target=self._run, name="kiln-backward-ahead", daemon=True)

    def _run(self) -> None:
        with gc_paused():
            self._compile()

    def _compile(self) -> None:
        try:
            try:
                self.fingerprint = fingerprint(self.entry.gm, self._inputs)
            except Exception as exc:  # noqa: BLE001 - then only its key can match
                log.debug("kiln: no fingerprint for a backward: %s", exc)
            self.ok = resolve.convert(self.entry, self._inputs, count=False)
            self.converted.set()
            if self.ok:
                self.answer = self.resolver.find(self.entry)
        finally:
            self._inputs = []
            self.converted.set()
            if self.recorder is not None:  # after the service answered, as for any graph,
                self.recorder.converted()  # and before `done`: a runner waits for the plan
            self.done.set()


class Aheads:
    """One session's backwards compiled ahead and not taken yet (at most `MAX_AHEAD`)."""

    def __init__(self, resolver: resolve.Resolver) -> None:
        self.resolver = resolver
        self._lock = threading.Lock()
        self._waiting: list[Ahead] = []

    def __len__(self) -> int:
        with self._lock:
            return len(self._waiting)

    def start(self, gm: torch.fx.GraphModule | None, tag: str | None,
              recorder: Recorder | None = None) -> None:
        """Start resolving the backward graph the partitioner made, if there is one to do."""
        if gm is None or self.resolver.config.background:
            return
        inputs = [n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")]
        if not all(isinstance(x, torch.Tensor) for x in inputs) \
                or has_symbolic_sizes(gm, inputs):
            return
        if device_of(inputs).type != "cuda" and not ON_CPU:
            return
        ahead = Ahead(gm, inputs, self.resolver, tag, recorder)
        with self._lock:
            self._waiting.append(ahead)
            del self._waiting[:-MAX_AHEAD]
        ahead.thread.start()
        if ON_CPU:
            ahead.done.wait()

    def take(self, entry: CompiledGraph, example_inputs: list[Any] | None = None) -> bool:
        """Give a backward what resolving it ahead gave (waiting for it to finish: a build,
        or eager with its warnings given) and settle it; False when there is none. With
        `example_inputs`, before the backward is converted: the one compiled ahead must have
        the same `fingerprint` (AOTAutograd hands the backward compiler a copy of the graph
        its partitioner made), and gives its conversion too; without, the converted
        backward's key must be the same."""
        with self._lock:
            candidates = list(self._waiting)
        if not candidates:
            return False
        wanted = None
        if example_inputs is not None:
            try:
                wanted = fingerprint(entry.gm, example_inputs)
            except Exception as exc:  # noqa: BLE001 - converted and matched by key instead
                log.debug("kiln: no fingerprint for a backward: %s", exc)
                return False
        for ahead in candidates:
            ahead.converted.wait()
            if not ahead.ok:
                continue
            if wanted is not None:
                if ahead.fingerprint != wanted:
                    continue
                done = ahead.entry
                entry.describe(done.key, done.graph, done.target, done.wire)
            elif ahead.entry.key != entry.key:
                continue
            ahead.done.wait()
            with self._lock:
                if ahead in self._waiting:
                    self._waiting.remove(ahead)
            done = ahead.entry  # what resolving this graph gave, a failure (eager) included
            if done.built is not None and done.level != "eager":
                entry.install(done.built, done.level, done.origin)
            entry.final = done.final
            degrade.count("backwards_ahead")
            self.resolver.settle(entry, ahead.answer)
            return True
        return False

    def of(self, entry: CompiledGraph | None) -> Ahead | None:
        """The backward being resolved ahead as `entry`, if any."""
        with self._lock:
            return next((a for a in self._waiting if a.entry is entry), None)

    def claim(self, ahead: Ahead) -> CompiledGraph:
        """`ahead`'s own entry, settled, for a caller that runs it without AOTAutograd's
        backward compiler (a plan's runner made from the graphs AOTAutograd just compiled,
        `Session.planned_now`): what `take` gives another entry, given to it."""
        ahead.done.wait()
        with self._lock:
            if ahead in self._waiting:
                self._waiting.remove(ahead)
        degrade.count("backwards_ahead")
        self.resolver.settle(ahead.entry, ahead.answer)
        return ahead.entry

    def clear(self) -> None:
        with self._lock:
            self._waiting.clear()
