"""`compiler.build(graph, schedule) -> Built`: generated kernels plus ATen calls, runnable.

Kernel sources are written under $KILN_KERNEL_DIR (default ~/.cache/kiln/kernels),
content-addressed by their sha256, and imported from there: the runtime only ever
executes code that this process generated from a validated graph.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import fx
from torch.utils._pytree import tree_flatten, tree_unflatten

from compiler import cudagraphs
from compiler.codegen import generate_kernel
from compiler.frontend import lower_graph
from compiler.heuristics import _is_gpu, pointwise_config, schedule_for
from compiler.interpreter_fixes import patch_interpreter_bf16_dot
from compiler.ir import ExternStep, KernelGroup, Program, ViewStep, meta
from compiler.ops import op_name
from compiler.schedule import Schedule, ScheduleMismatch, validate_config

_MODULES: dict[str, ModuleType] = {}
_MODULES_LOCK = threading.Lock()


def kernel_dir() -> Path:
    """Where generated kernel modules live ($KILN_KERNEL_DIR or ~/.cache/kiln/kernels)."""
    return Path(os.environ.get("KILN_KERNEL_DIR") or Path.home() / ".cache" / "kiln" / "kernels")


def source_hash(source: str) -> str:
    """sha256 of a kernel's generated source."""
    return hashlib.sha256(source.encode()).hexdigest()


def load_kernel_module(source: str, digest: str) -> ModuleType:
    """Write `source` to its content-addressed file (once) and import it from there."""
    with _MODULES_LOCK:
        if digest in _MODULES:
            return _MODULES[digest]
        directory = kernel_dir() / digest[:2]
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"kiln_{digest}.py"
        if not path.exists() or source_hash(path.read_text()) != digest:
            tmp = directory / f".{digest}.{os.getpid()}.{threading.get_ident()}.tmp"
            tmp.write_text(source)
            os.replace(tmp, path)
        spec = importlib.util.spec_from_file_location(f"kiln_kernel_{digest}", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import generated kernel {path}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _MODULES[digest] = module
        return module


@dataclass(frozen=True)
class BuiltKernel:
    """One generated kernel of a built graph."""

    name: str
    kind: str
    variant: str
    config: dict[str, int]
    source: str
    source_hash: str
    nodes: tuple[str, ...]
    ops: tuple[str, ...]


@dataclass
class KernelCall:
    """One kernel launch of a run; `launch()` re-launches it alone on the same buffers."""

    name: str
    launch: Callable[[], None]


class _Const:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class _Slot:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


class _Args:
    """Arguments of a call with node references replaced by environment slots.

    Binding is on every call's path, so the usual shapes (positional nodes, constants and
    flat lists of them; constant keyword arguments) bind without pytree walks."""

    def __init__(self, args: Any, slots: dict[fx.Node, int]) -> None:
        flat, self.spec = tree_flatten(args)
        self.flat = [(_Slot(slots[a]) if isinstance(a, fx.Node) else a) for a in flat]
        self.refs = [i for i, a in enumerate(self.flat) if isinstance(a, _Slot)]
        self.fast: list[Any] | None = None
        self.kwargs: dict[str, Any] = {}
        if isinstance(args, tuple) and len(args) == 2 and isinstance(args[1], dict):
            positional, kwargs = args
            if not any(isinstance(v, (fx.Node, list, tuple, dict)) for v in kwargs.values()):
                self.kwargs = dict(kwargs)
                self.fast = [self._simple(a, slots) for a in positional]
                if any(a is _COMPLEX for a in self.fast):
                    self.fast = None

    @staticmethod
    def _simple(arg: Any, slots: dict[fx.Node, int]) -> Any:
        if isinstance(arg, fx.Node):
            return _Slot(slots[arg])
        if isinstance(arg, (list, tuple)):
            if any(isinstance(a, (list, tuple, dict)) for a in arg):
                return _COMPLEX
            return _List([_Slot(slots[a]) if isinstance(a, fx.Node) else a for a in arg],
                         type(arg))
        if isinstance(arg, dict):
            return _COMPLEX
        return arg

    def bind(self, env: list[Any]) -> Any:
        if self.fast is not None:
            return [_value(a, env) for a in self.fast], self.kwargs
        flat = list(self.flat)
        for i in self.refs:
            flat[i] = env[flat[i].index]
        return tree_unflatten(flat, self.spec)


_COMPLEX = object()


class _List:
    __slots__ = ("items", "kind")

    def __init__(self, items: list[Any], kind: type) -> None:
        self.items, self.kind = items, kind


def _value(a: Any, env: list[Any]) -> Any:
    kind = type(a)
    if kind is _Slot:
        return env[a.index]
    if kind is _List:
        return a.kind(env[x.index] if type(x) is _Slot else x for x in a.items)
    return a


class _Launch:
    """A generated kernel with its grid, block sizes and buffers."""

    def __init__(self, name: str, fn: Any, in_slots: list[int], outs: list[tuple],
                 grid: tuple[int, ...], constexprs: dict[str, int], options: dict[str, int]) -> None:
        self.name, self.fn = name, fn
        self.in_slots, self.outs = in_slots, outs
        self.grid, self.constexprs, self.options = grid, constexprs, options
        self.empty = any(g == 0 for g in grid)
        self.poison = False
        self._interpreted: Any = None

    def kernel_for(self, device: torch.device) -> Any:
        if device.type == "cpu" or _is_interpreted(self.fn):
            patch_interpreter_bf16_dot()
        if device.type == "cpu" and not _is_interpreted(self.fn):
            if self._interpreted is None:
                from triton.runtime.interpreter import InterpretedFunction

                self._interpreted = InterpretedFunction(self.fn.fn)
            return self._interpreted
        return self.fn

    def run(self, env: list[Any], device: torch.device, record: list | None) -> Callable[[], None]:
        """Launch on `env`'s buffers; returns a closure that launches again on the same ones."""
        for slot, shape, stride, dtype in self.outs:
            env[slot] = torch.empty_strided(shape, stride, dtype=dtype, device=device)
            if self.poison:
                _poison(env[slot])
        if self.empty:
            return _nothing
        args = [env[s] for s in self.in_slots] + [env[o[0]] for o in self.outs]
        fn = self.kernel_for(device)

        def launch() -> None:
            fn[self.grid](*args, **self.constexprs, **self.options)

        launch()
        if record is not None:
            record.append(KernelCall(self.name, launch))
        return launch


def _nothing() -> None:
    return None


def _poison(t: torch.Tensor) -> None:
    """Fill a fresh buffer with NaN (or an unlikely integer) so unwritten elements show."""
    if t.dtype.is_floating_point:
        t.fill_(float("nan"))
    elif t.dtype == torch.bool:
        t.view(torch.uint8).fill_(0x5A) if t.numel() else None
    else:
        t.fill_(torch.iinfo(t.dtype).min + 7)


def _is_interpreted(fn: Any) -> bool:
    return type(fn).__name__ == "InterpretedFunction"


class _Call:
    """An ATen call (extern op, view, getitem) on environment values."""

    def __init__(self, node: fx.Node, slots: dict[fx.Node, int]) -> None:
        self.target = node.target
        self.args = _Args((node.args, node.kwargs), slots)
        self.slot = slots[node]

    def run(self, env: list[Any], device: torch.device, record: list | None) -> None:
        args, kwargs = self.args.bind(env)
        env[self.slot] = self.target(*args, **kwargs)


class _AtenMatmul:
    """A matmul run as an ATen call, then its epilogue kernel (if the group has one)."""

    def __init__(self, name: str, call: _Call, epilogue: _Launch | None) -> None:
        self.name, self.call, self.epilogue = name, call, epilogue

    def run(self, env: list[Any], device: torch.device, record: list | None) -> None:
        args, kwargs = self.call.args.bind(env)
        target = self.call.target
        env[self.call.slot] = target(*args, **kwargs)
        epilogue = self.epilogue.run(env, device, None) if self.epilogue is not None else _nothing
        if record is not None:
            def launch() -> None:  # the ATen call's result is dropped: the epilogue's input stays
                target(*args, **kwargs)
                epilogue()
            record.append(KernelCall(self.name, launch))


def _grid(group: KernelGroup, variant: str, config: dict[str, int]) -> tuple[int, ...]:
    def cdiv(a: int, b: int) -> int:
        return -(-a // b)

    sizes = group.sizes
    if group.kind == "matmul" and variant == "triton":
        return (cdiv(sizes["M"], config["BLOCK_M"]) * cdiv(sizes["N"], config["BLOCK_N"]),
                sizes["batch"])
    if group.kind == "matmul":
        numel = sizes["M"] * sizes["N"] * sizes["batch"]
        return (cdiv(numel, config["XBLOCK"]),)
    return (cdiv(sizes["xnumel"], config["XBLOCK"]),)


class Built:
    """A graph built from a schedule: call it like the graph's `to_fx()` module."""

    def __init__(self, program: Program, schedule: Schedule, kernels: list[BuiltKernel],
                 execs: list[Any], slots: dict[fx.Node, int]) -> None:
        self.program = program
        self.schedule = schedule
        self.kernels = kernels
        self.fallback_ops = sorted({op_name(s.node) for s in program.steps
                                    if isinstance(s, ExternStep)
                                    and op_name(s.node) != "operator.getitem"}
                                   | {op_name(k.anchors[0]) for k, c in
                                      zip(program.kernels, schedule.kernels, strict=False) if c.variant == "aten"})
        self._execs = execs
        self._graphs: cudagraphs.GraphRunner | None = None
        self._nslots = len(slots)
        self._inputs = [(slots[p], p.meta.get("kiln_meta")) for p in program.placeholders]
        self._consts = [(slots[n], n.target) for n in program.gm.graph.nodes if n.op == "get_attr"]
        self._const_cache: dict[torch.device, list[tuple[int, torch.Tensor]]] = {}
        out_node = next(n for n in reversed(program.gm.graph.nodes) if n.op == "output")
        self._outputs = _Args(out_node.args[0], slots)
        self._frees = _last_uses(execs, self._outputs, self._nslots)
        outs = out_node.args[0]
        self._flat_outputs = (
            [slots[a] if isinstance(a, fx.Node) else _Const(a) for a in outs]
            if isinstance(outs, (tuple, list)) and not any(isinstance(a, (list, tuple, dict)) for a in outs)
            else None)

    @property
    def poison(self) -> bool:
        """Testing aid: when True, every kernel output buffer is filled with NaN (floats) or
        a sentinel (integers, bools) before the kernel runs."""
        return any(getattr(e, "poison", False) for e in self._launches())

    @poison.setter
    def poison(self, value: bool) -> None:
        for launch in self._launches():
            launch.poison = value

    def _launches(self) -> list[_Launch]:
        found = []
        for e in self._execs:
            if isinstance(e, _Launch):
                found.append(e)
            elif isinstance(e, _AtenMatmul) and e.epilogue is not None:
                found.append(e.epilogue)
        return found

    def _constants(self, device: torch.device) -> list[tuple[int, torch.Tensor]]:
        if device not in self._const_cache:
            values = []
            for slot, target in self._consts:
                obj: Any = self.program.gm
                for part in target.split("."):
                    obj = getattr(obj, part)
                values.append((slot, obj.to(device)))
            self._const_cache[device] = values
        return self._const_cache[device]

    def _run(self, inputs: Sequence[Any], record: list | None) -> Any:
        if len(inputs) != len(self._inputs):
            raise ValueError(f"built graph takes {len(self._inputs)} inputs, got {len(inputs)}")
        env: list[Any] = [None] * self._nslots
        device = torch.device("cpu")
        for (slot, m), value in zip(self._inputs, inputs, strict=False):
            if m is not None:
                _check_input(slot, m, value)
                device = value.device
            env[slot] = value
        for slot, value in self._constants(device):
            env[slot] = value
        for i, step in enumerate(self._execs):
            step.run(env, device, record)
            for slot in self._frees[i]:
                env[slot] = None
        if self._flat_outputs is not None:
            return tuple(o.value if type(o) is _Const else env[o] for o in self._flat_outputs)
        out = self._outputs.bind(env)
        return tuple(out) if isinstance(out, list) else out

    def __call__(self, *inputs: Any) -> Any:
        """Run the graph: returns its outputs in wire order. On CUDA, calls after the
        first replay a CUDA graph where that is cheaper (see compiler/cudagraphs.py)."""
        if self._graphs is not None:
            out = self._graphs(inputs)
            if out is not None:
                return out
        elif self._cuda_inputs(inputs) and cudagraphs.enabled():
            self._graphs = cudagraphs.GraphRunner(lambda xs: self._run(xs, None), len(self._execs))
            self._graphs(inputs)
        return self._run(inputs, None)

    def _cuda_inputs(self, inputs: Sequence[Any]) -> bool:
        return any(isinstance(t, torch.Tensor) and t.is_cuda for t in inputs)

    def kernel_calls(self, *inputs: Any) -> list[KernelCall]:
        """Run once; one entry per kernel launch, each able to re-launch it alone."""
        record: list[KernelCall] = []
        self._run(inputs, record)
        return record


def _check_input(slot: int, m: Any, value: Any) -> None:
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"input {slot} must be a tensor")
    if value.shape == m.shape and value.dtype == m.dtype and value.stride() == m.stride:
        return
    if tuple(value.shape) != m.shape or value.dtype != m.dtype:
        raise ValueError(f"input {slot}: expected {m.dtype} {list(m.shape)}, "
                         f"got {value.dtype} {list(value.shape)}")
    for size, have, want in zip(m.shape, value.stride(), m.stride, strict=False):
        if size > 1 and have != want:
            raise ValueError(f"input {slot}: expected strides {m.stride}, got {value.stride()}")


def _last_uses(execs: list[Any], outputs: _Args, nslots: int) -> list[list[int]]:
    """For each step, the slots nothing after it reads (their buffers can be reused)."""
    last: dict[int, int] = {}
    for i, step in enumerate(execs):
        for slot in _reads(step):
            last[slot] = i
    keep = {outputs.flat[i].index for i in outputs.refs}
    frees: list[list[int]] = [[] for _ in execs]
    for slot, i in last.items():
        if slot not in keep:
            frees[i].append(slot)
    return frees


def _reads(step: Any) -> list[int]:
    if isinstance(step, _Launch):
        return step.in_slots + [o[0] for o in step.outs]
    if isinstance(step, _Call):
        return [step.args.flat[i].index for i in step.args.refs] + [step.slot]
    reads = _reads(step.call)
    return reads + (_reads(step.epilogue) if step.epilogue is not None else [])


def _comment(program: Program, group: KernelGroup, variant: str) -> list[str]:
    lines = [f"{group.kind} kernel, variant {variant}; fused aten nodes:"]
    for name in program.origin_names(group.members + group.inlined):
        lines.append(f"  {name}: {program.original_ops[name]}")
    return lines


def build(graph: Any, schedule: Schedule | dict | str | None = None,
          example_inputs: Sequence[Any] | None = None) -> Built:
    """Build `graph` (a `compiler.Graph`, or an fx GraphModule with `example_inputs`) with
    `schedule` (default: the heuristic one). Raises ScheduleMismatch when the schedule is
    for another graph or its source hashes differ, ValueError for an invalid config."""
    program, ghash = lower_graph(graph, example_inputs)
    if schedule is None:
        schedule = schedule_for(program, ghash, None)
    elif not isinstance(schedule, Schedule):
        schedule = Schedule.from_json(schedule)
    if schedule.graph_hash and schedule.graph_hash != ghash:
        raise ScheduleMismatch(f"schedule is for graph {schedule.graph_hash[:12]}, "
                               f"this graph is {ghash[:12]}")
    groups = program.kernels
    if [k.name for k in schedule.kernels] != [g.name for g in groups]:
        raise ScheduleMismatch("the schedule's kernels differ from this compiler's fusion groups")
    gpu = _is_gpu(schedule.target)
    slots = {n: i for i, n in enumerate(program.gm.graph.nodes)}
    kernels: list[BuiltKernel] = []
    choices = []
    execs: list[Any] = []
    by_group = {}
    for group, choice in zip(groups, schedule.kernels, strict=False):
        nodes = tuple(program.origin_names(group.members + group.inlined))
        if choice.kind != group.kind or tuple(choice.nodes) != nodes:
            raise ScheduleMismatch(f"{choice.name}: fusion group differs from this graph's")
        validate_config(choice.kind, choice.variant, choice.config, group.sizes, choice.name)
        gen = generate_kernel(group, choice.variant, program.is_buffer,
                              _comment(program, group, choice.variant))
        digest = source_hash(gen.source)
        if choice.source_hash is not None and choice.source_hash != digest:
            raise ScheduleMismatch(f"{choice.name}: generated source hash {digest[:12]} differs "
                                   f"from the schedule's {choice.source_hash[:12]}")
        launch = None
        if gen.outputs:
            fn = getattr(load_kernel_module(gen.source, digest), gen.name)
            config = dict(choice.config)
            if choice.kind == "matmul" and choice.variant == "aten":
                numel = group.sizes["M"] * group.sizes["N"] * group.sizes["batch"]
                config = pointwise_config(numel, gpu)
            constexprs = {k: v for k, v in config.items() if k not in ("num_warps", "num_stages")}
            options = {k: config[k] for k in ("num_warps", "num_stages")}
            outs = [(slots[n], meta(n).shape, meta(n).stride, meta(n).dtype) for n in gen.outputs]
            launch = _Launch(gen.name, fn, [slots[n] for n in gen.inputs], outs,
                             _grid(group, choice.variant, config), constexprs, options)
        if choice.kind == "matmul" and choice.variant == "aten":
            by_group[id(group)] = _AtenMatmul(gen.name, _Call(group.anchors[0], slots), launch)
        else:
            by_group[id(group)] = launch
        kernels.append(BuiltKernel(
            name=choice.name, kind=choice.kind, variant=choice.variant, config=dict(choice.config),
            source=gen.source, source_hash=digest, nodes=nodes,
            ops=tuple(program.original_ops[n] for n in nodes)))
        choices.append(replace(choice, source_hash=digest))
    aten_mms = [g.anchors[0] for g, c in zip(groups, choices, strict=True)
                if g.kind == "matmul" and c.variant == "aten"]
    needed = _needed_views(program, aten_mms)
    for step in program.steps:
        if isinstance(step, KernelGroup):
            if by_group[id(step)] is not None:
                execs.append(by_group[id(step)])
        elif isinstance(step, ExternStep) or step.node in needed:
            execs.append(_Call(step.node, slots))
    built_schedule = replace(schedule, kernels=tuple(choices), graph_hash=ghash)
    return Built(program, built_schedule, kernels, execs, slots)


def _needed_views(program: Program, aten_matmuls: list[fx.Node]) -> set[fx.Node]:
    """Views whose tensors something reads at run time (ATen calls, outputs, other views)."""
    views = {s.node for s in program.steps if isinstance(s, ViewStep)}
    out_node = next(n for n in reversed(program.gm.graph.nodes) if n.op == "output")
    needed = {n for n in out_node.all_input_nodes if n in views}
    readers = [s.node for s in program.steps if isinstance(s, ExternStep)]
    readers += aten_matmuls
    for node in readers:
        needed |= {a for a in node.all_input_nodes if a in views}
    changed = True
    while changed:
        changed = False
        for v in list(needed):
            base = v.args[0]
            if base in views and base not in needed:
                needed.add(base)
                changed = True
    return needed
