"""The callable handed back to AOTAutograd: one graph, whose implementation can be swapped.

A graph starts as eager (the aten `GraphModule` itself), a heuristic build or a tuned build,
and only ever moves up that ladder. The swap is one attribute assignment under a lock, and
a call reads the attribute once, so a call in flight finishes on the implementation it
started with and the next call gets the new one: swaps land between calls.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from kiln import degrade

if TYPE_CHECKING:  # `import kiln` stays light: compiler loads when a graph is first compiled
    import compiler

# Rank of each implementation; a graph never moves down.
LEVELS = {"eager": 0, "heuristic": 1, "tuned": 2}


class CompiledGraph:
    """A graph's current implementation plus what kiln knows about it."""

    def __init__(self, gm: torch.fx.GraphModule, kind: str = "inference",
                 device: torch.device | None = None, tag: str | None = None) -> None:
        self.gm = gm
        self.kind = kind  # forward | backward | inference
        self.tag = tag  # the entry's name on the dashboard, sent with the graph
        # Set by describe() once kiln has converted the graph:
        self.key: str | None = None
        self.graph: compiler.Graph | None = None
        self._wire: dict[str, Any] | None = None  # the kiln.graph/1 dict sent to the service
        self.target: compiler.Target | None = None
        self.device = device or torch.device("cpu")  # where the kernels run
        self.level = "eager"
        self.origin = "eager"  # eager | local | cache | service
        self.built: compiler.Built | None = None  # once built
        self.final = False  # the service said all it will say: no background polling
        # Takes the boxed list: the eager graph, or `Built.call_boxed`, which clears the
        # list itself once it holds the inputs (each then dies at its last use).
        self._impl: Callable[[list[Any]], Any] = _unboxed(gm)
        self._lock = threading.Lock()
        # AOTAutograd's boxed calling convention: called with one list of inputs, which the
        # callee may clear so that activations are freed early. An instance attribute, so
        # that the wrappers dynamo puts around the backward (functools.wraps) carry it.
        self._boxed_call = True

    def __call__(self, args: list[Any]) -> Any:
        return self._impl(args)  # read once: a concurrent swap affects only the next call

    def describe(self, key: str, graph: compiler.Graph, target: compiler.Target,
                 wire: dict[str, Any] | None = None) -> None:
        """What kiln made of the graph: set once, before anything is built. Without `wire`
        (a graph from a plan: the service has it), the graph's is copied only if asked for."""
        self.key, self.graph, self._wire, self.target = key, graph, wire, target

    @property
    def wire(self) -> dict[str, Any] | str | None:
        """The kiln.graph/1 document to send to the service (None before `describe`): the
        dict the conversion made, else (a graph from a plan) the graph's canonical JSON
        text, which it keeps anyway (a copy of its dict would cost more than the request)."""
        if self._wire is None and self.graph is not None:
            return self.graph.canonical_text()
        return self._wire

    def install(self, built: compiler.Built, level: str, origin: str) -> bool:
        """Use `built` from the next call on, if `level` is above the current one.
        Returns whether it was installed."""
        with self._lock:
            if LEVELS[level] <= LEVELS[self.level]:
                return False
            swapped = self.level != "eager"
            self.built, self.level, self.origin = built, level, origin
            boxed = getattr(built, "call_boxed", None)
            self._impl = self._timing_first_call(boxed if boxed is not None else _unboxed(built))
        if swapped:
            degrade.count("swaps")
        return True

    def _timing_first_call(self, impl: Callable[[list[Any]], Any]) -> Callable[[list[Any]], Any]:
        """`impl`, whose first call is timed (`seconds:first_call`, a timeline step: a
        build's first call makes its launcher and passes every kernel through Triton's JIT
        once) and then puts `impl` itself in place, so later calls pay nothing."""

        def first(args: list[Any]) -> Any:
            try:
                with degrade.timed("first_call"):
                    return impl(args)
            finally:
                with self._lock:
                    if self._impl is first:
                        self._impl = impl

        return first

    def __repr__(self) -> str:
        key = self.key[:12] if self.key else None
        return (f"CompiledGraph({self.kind}, key={key}, level={self.level}, "
                f"origin={self.origin})")


def _unboxed(fn: Callable[..., Any]) -> Callable[[list[Any]], Any]:
    """A callable that takes its inputs as arguments, called with (and clearing) a list."""

    def call(args: list[Any]) -> Any:
        inputs = list(args)
        args.clear()
        return fn(*inputs)

    return call


def has_symbolic_sizes(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> bool:
    """Whether dynamo handed a graph whose sizes are symbols rather than numbers."""
    for value in example_inputs:
        if isinstance(value, torch.SymInt | torch.SymFloat):
            return True
        if isinstance(value, torch.Tensor):
            dims = (*value.shape, *value.stride(), value.storage_offset())
            if any(isinstance(d, torch.SymInt) for d in dims):
                return True
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("val")
            if isinstance(val, torch.SymInt):
                return True
    return False


ShapeKey = tuple[Any, ...]


def shape_key(args: tuple[Any, ...]) -> ShapeKey:
    """What a per-shape compile specialises on: each tensor's metadata, each scalar's value."""
    key: list[Any] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            key.append((tuple(a.shape), a.stride(), a.storage_offset(), a.dtype,
                        a.device.type, a.requires_grad))
        else:
            key.append((type(a).__name__, a))
    return tuple(key)


class PerShapeGraph:
    """A graph with symbolic sizes, compiled once per concrete shape at call time.

    `specialise(args)` returns a callable for a concrete signature (the backend traces the
    symbolic graph with the concrete inputs into a static aten graph and compiles that).
    """

    def __init__(self, gm: torch.fx.GraphModule,
                 specialise: Callable[[torch.fx.GraphModule, tuple[Any, ...]], Callable[..., Any]],
                 max_shapes: int = 64) -> None:
        self.gm = gm
        self._specialise = specialise
        self._max_shapes = max_shapes
        self._compiled: dict[ShapeKey, Callable[..., Any]] = {}
        self._lock = threading.Lock()
        self._boxed_call = True  # see CompiledGraph

    def __call__(self, boxed: list[Any]) -> Any:
        args = tuple(boxed)
        boxed.clear()
        key = shape_key(args)
        fn = self._compiled.get(key)
        if fn is None:
            with self._lock:
                fn = self._compiled.get(key)
                if fn is None:
                    if len(self._compiled) >= self._max_shapes:
                        fn = self.gm  # shape churn: stop compiling, run eagerly
                    else:
                        fn = self._specialise(self.gm, args)
                    self._compiled[key] = fn
        return fn(*args)

    @property
    def shapes(self) -> list[ShapeKey]:
        """Signatures compiled so far."""
        with self._lock:
            return list(self._compiled)


def device_of(example_inputs: Sequence[Any]) -> torch.device:
    """The accelerator a graph runs on (a CPU scalar tensor beside CUDA inputs does not
    make it a CPU graph); the CPU when every input is on it."""
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type != "cpu":
            return x.device
    return torch.device("cpu")


def runs_eagerly_here(device: torch.device) -> bool:
    """Whether kiln leaves a graph on `device` eager in this process: a CPU graph without
    Triton's interpreter (TRITON_INTERPRET=1), where Triton cannot run kiln's kernels. The
    one device check of both paths, AOTAutograd's (`kiln.resolve.convert`) and a plan's
    (`PlanStore.key_for`)."""
    from compiler import runs_on_cpu

    return device.type == "cpu" and not runs_on_cpu()
