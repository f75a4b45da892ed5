"""`compiler.build(graph, schedule) -> Built`: generated kernels plus ATen calls, runnable.

Kernel sources are written under $KILN_KERNEL_DIR (default ~/.cache/kiln/kernels),
content-addressed by their sha256, and imported from there: the runtime only ever
executes code that this process generated from a validated graph.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

import torch
from torch import fx

from compiler.aot import CompileJob, compile_ahead, import_kernel, source_hash, specialization
from compiler.codegen import NotFusible, Unsupported, generate_kernel, kinds
from compiler.codegen.kinds import aten_activation
from compiler.ir import ExternStep, KernelGroup, Program, ViewStep, meta, op_name
from compiler.lowering.frontend import lower_graph
from compiler.lowering.ops import VIEWS
from compiler.runtime import cudagraphs, static_launch, triton_key
from compiler.runtime.execution import (
    ActivationCall,
    Args,
    AtenMatmul,
    Call,
    Const,
    KernelCall,
    Launch,
    is_interpreted,
    slot_tree,
)
from compiler.runtime.launcher import GraphLauncher, Plan
from compiler.scheduling.heuristics import _is_gpu, extern_ops, schedule_for
from compiler.scheduling.schedule import Schedule, ScheduleMismatch, validate_config

log = logging.getLogger(__name__)

_MODULES: dict[str, ModuleType] = {}
_MODULES_LOCK = threading.Lock()


def load_kernel_module(source: str, digest: str) -> ModuleType:
    """Write `source` to its content-addressed file (once) and import it from there; one
    module per digest in this process, so identical kernels share one function and binary."""
    with _MODULES_LOCK:
        if digest not in _MODULES:
            _MODULES[digest] = import_kernel(source, digest)
        return _MODULES[digest]


@dataclass(frozen=True)
class LaunchInfo:
    """One Triton launch of a built graph: kernel name, the jitted function (interpreted
    under TRITON_INTERPRET=1; its `.fn` is the Python function), pointer dtypes in
    argument order, block sizes, launch options and grid."""

    kernel: str
    fn: Any
    arg_dtypes: tuple[torch.dtype, ...]
    constexprs: dict[str, int]
    options: dict[str, int]
    grid: tuple[int, ...]


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
    triton: bool = True  # launches generated Triton code (False: an ATen call and nothing else)


class Built:
    """A graph built from a schedule: call it like the graph's `to_fx()` module."""

    def __init__(self, program: Program, schedule: Schedule, kernels: list[BuiltKernel],
                 execs: list[Any], slots: dict[fx.Node, int]) -> None:
        self.program = program
        self.schedule = schedule
        self.kernels = kernels
        self.fallback_ops = sorted(extern_ops(program)
                                   | {op_name(k.anchors[0]) for k, c in
                                      zip(program.kernels, schedule.kernels, strict=False)
                                      if kinds.kind_of(c.kind, c.variant).library})
        self._execs = execs
        self._graphs: cudagraphs.GraphRunner | None = None
        # A graph that writes into its inputs cannot copy them in for a CUDA graph (the
        # replay would write the copies): such graphs never capture.
        self._writes_inputs = _writes_inputs(program.gm.graph)
        self._nslots = len(slots)
        self._inputs = [(slots[p], p.meta.get("kiln_meta")) for p in program.placeholders]
        self._consts = [(slots[n], n.target) for n in program.gm.graph.nodes if n.op == "get_attr"]
        self._const_cache: dict[torch.device, list[tuple[int, torch.Tensor]]] = {}
        out_node = next(n for n in reversed(program.gm.graph.nodes) if n.op == "output")
        self._outputs = Args(out_node.args[0], slots)
        self._frees = _last_uses(execs, self._outputs, self._nslots)
        outs = out_node.args[0]
        self._flat_outputs = (
            [slots[a] if isinstance(a, fx.Node) else Const(a) for a in outs]
            if isinstance(outs, (tuple, list)) and not any(isinstance(a, (list, tuple, dict)) for a in outs)
            else None)
        plan = Plan(execs, self._inputs, [slot for slot, _ in self._consts],
                    slot_tree(outs, slots), self._frees)
        with_meta = [i for i, (_, m) in enumerate(self._inputs) if m is not None]
        self._launcher = GraphLauncher(
            plan, lambda launch, device: launch.kernel_for(device), self._constants,
            self._check_one, self._check_all, with_meta)

    @property
    def poison(self) -> bool | float:
        """Testing aid: when True, every kernel output buffer is filled with NaN (floats) or
        a sentinel (integers, bools) before the kernel runs; a number instead of True is
        the float fill (for tests that expect NaN results, where NaN would hide a gap)."""
        return next((e.poison for e in self._launches() if e.poison is not False), False)

    @poison.setter
    def poison(self, value: bool | float) -> None:
        for launch in self._launches():
            launch.poison = value
        self._launcher.reset()  # the generated launchers poison (or not) in their source

    def _launches(self) -> list[Launch]:
        return self._launcher.plan.launches  # kernel launches and matmul epilogues, in order

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
        device = None
        for (slot, m), value in zip(self._inputs, inputs, strict=False):
            if m is not None:
                _check_input(slot, m, value)
                if device is None or device.type == "cpu":  # the first one off the CPU
                    device = value.device
            env[slot] = value
        device = device or torch.device("cpu")
        for slot, value in self._constants(device):
            env[slot] = value
        for i, step in enumerate(self._execs):
            step.run(env, device, record)
            for slot in self._frees[i]:
                env[slot] = None
        if self._flat_outputs is not None:
            return tuple(o.value if type(o) is Const else env[o] for o in self._flat_outputs)
        out = self._outputs.bind(env)
        return tuple(out) if isinstance(out, list) else out

    def __call__(self, *inputs: Any) -> Any:
        """Run the graph: returns its outputs in wire order. Runs the graph's generated
        launcher (compiler/runtime/launcher.py); on CUDA, once two calls agree on where the
        inputs live, replays a CUDA graph instead (compiler/runtime/cudagraphs.py)."""
        return self._call(inputs, False)

    def call_boxed(self, inputs: list[Any]) -> Any:
        """AOTAutograd's boxed convention: the list is cleared once the graph holds its
        inputs, so that each input is freed at its last use (saved activations in a
        backward) instead of when the call returns."""
        return self._call(inputs, True)

    def _call(self, inputs: Sequence[Any], boxed: bool) -> Any:
        if self._graphs is not None:
            out = self._graphs(inputs)
            if out is not None:
                if boxed:
                    inputs.clear()  # type: ignore[attr-defined]
                return out
        elif not self._writes_inputs and self._cuda_inputs(inputs) and cudagraphs.enabled():
            self._graphs = cudagraphs.GraphRunner(lambda xs: self._launcher(xs, False),
                                                  len(self._execs), self._launcher.check)
            self._graphs(inputs)
        return self._launcher(inputs, boxed)

    def launcher_source(self, device: torch.device | str = "cpu", mode: str = "jit") -> str:
        """The generated launcher's source for `device` ("jit" mode: every launch through
        Triton's JIT; see compiler/runtime/launcher.py)."""
        return self._launcher.source(device, mode)

    def _check_one(self, pos: int, value: Any) -> None:
        slot, m = self._inputs[pos]
        _check_input(slot, m, value)

    def _check_all(self, inputs: Sequence[Any]) -> None:
        for (slot, m), value in zip(self._inputs, inputs, strict=False):
            if m is not None:
                _check_input(slot, m, value)

    def _cuda_inputs(self, inputs: Sequence[Any]) -> bool:
        return any(isinstance(t, torch.Tensor) and t.is_cuda for t in inputs)

    def launches(self) -> list[LaunchInfo]:
        """Every Triton launch this graph makes, in order, with what an ahead-of-time
        compile needs (the tuner compiles candidates for a GPU target on a CPU worker)."""
        nodes = list(self.program.gm.graph.nodes)
        found = []
        for launch in self._launches():
            dtypes = tuple(meta(nodes[s]).dtype for s in launch.in_slots) + tuple(
                o[3] for o in launch.outs)
            found.append(LaunchInfo(launch.name, launch.fn, dtypes, dict(launch.constexprs),
                                    dict(launch.options), launch.grid))
        return found

    def precompile(self, device: torch.device | str) -> int:
        """Compile (or fetch from Triton's cache) and load every Triton kernel of this graph
        for the CUDA `device` without launching anything, so that the first call pays for
        none of it; returns how many launches it prepared (0 on the CPU, where kernels are
        interpreted). The distinct kernels compile in parallel in the compile workers
        (compiler/aot/: `compile_ahead`); this thread only loads them, with torch's static
        launcher where Triton would build a C launcher per kernel (static_launch.py), and
        hands them to the graph's launcher, whose first call then launches them directly
        (`GraphLauncher.preload`). Raises what Triton raises for a kernel that does not
        compile (CompileCrash for one that kills the compiler)."""
        device = torch.device(device)
        if device.type != "cuda":
            return 0
        infos = self.launches()
        if any(is_interpreted(info.fn) for info in infos):
            return 0
        static_launch.lazy_driver()  # where nothing made Triton's driver yet
        with torch.cuda.device(device):
            compile_ahead(self._compile_jobs(infos), launchers=not static_launch.available())
            kernels = []
            for info in infos:
                # Dtypes stand for tensors (Triton's MockTensor: 16-byte aligned pointers,
                # which is what the caching allocator hands out).
                kernel = info.fn.warmup(*info.arg_dtypes, grid=info.grid, **info.constexprs,
                                        **info.options)
                static_launch.load(kernel)  # module and launcher now, otherwise lazy
                kernels.append(kernel)
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())  # what inputs say
        self._launcher.preload(device, kernels)  # the first call launches them directly
        return len(infos)

    def _compile_jobs(self, infos: list[LaunchInfo]) -> list[CompileJob]:
        """One compile job per distinct launch (identical kernels share one) that Triton
        has not loaded yet."""
        try:  # each job's cache key includes Triton's key of itself: the child's, not hashed here
            triton_key.ensure()
        except Exception as exc:  # noqa: BLE001 - the keys then fail alone (no binary fetched)
            log.debug("no Triton key of itself: %s", exc)
        kernels = {k.name: k for k in self.kernels}
        seen, jobs = set(), []
        for info in infos:
            kernel = kernels[info.kernel]
            ident = (kernel.source_hash, info.arg_dtypes, tuple(sorted(info.constexprs.items())),
                     tuple(sorted(info.options.items())))
            if ident in seen:
                continue
            seen.add(ident)
            spec = specialization(info.fn, info.arg_dtypes, info.grid,
                                  {**info.constexprs, **info.options})
            if spec is not None:
                jobs.append(CompileJob(info.kernel, kernel.source, kernel.source_hash,
                                       info.fn.fn.__name__, spec))
        return jobs

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


def _writes_inputs(graph: fx.Graph) -> bool:
    """Whether an op of `graph` writes into an input (or a view of one) in place."""
    for node in graph.nodes:
        target = node.target
        if not isinstance(target, torch._ops.OpOverload) or not target._schema.is_mutable:
            continue
        for arg, value in zip(target._schema.arguments, node.args, strict=False):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            base = value
            while isinstance(base, fx.Node) and base.op == "call_function" and base.args \
                    and isinstance(base.args[0], fx.Node) and op_name(base).split(".")[1] in VIEWS:
                base = base.args[0]
            if not isinstance(base, fx.Node) or base.op == "placeholder":
                return True
    return False


def _last_uses(execs: list[Any], outputs: Args, nslots: int) -> list[list[int]]:
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
    if isinstance(step, Launch):
        return step.in_slots + [o[0] for o in step.outs]
    if isinstance(step, Call):
        return [step.args.flat[i].index for i in step.args.refs] + [step.slot]
    reads = _reads(step.call)
    return reads + (_reads(step.epilogue) if step.epilogue is not None else [])


def _comment(program: Program, group: KernelGroup, variant: str) -> list[str]:
    """The kernel's opening comment: the aten ops it fuses, without node names, which
    depend on the kernel's place in the graph (they are in `BuiltKernel.nodes`)."""
    lines = [f"{group.kind} kernel, variant {variant}; fused aten ops:"]
    for name in program.origin_names(group.members + group.inlined):
        lines.append(f"  {program.original_ops[name]}")
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
        kind = kinds.kind_of(choice.kind, choice.variant)
        try:
            gen = generate_kernel(group, choice.variant, program.is_buffer,
                                  _comment(program, group, choice.variant))
        except (NotFusible, Unsupported) as exc:
            raise ValueError(f"{choice.name}: variant {choice.variant!r} cannot be generated "
                             f"for this group: {exc}") from exc
        digest = source_hash(gen.source)
        if choice.source_hash is not None and choice.source_hash != digest:
            raise ScheduleMismatch(f"{choice.name}: generated source hash {digest[:12]} differs "
                                   f"from the schedule's {choice.source_hash[:12]}")
        launch = None
        if gen.outputs:
            fn = getattr(load_kernel_module(gen.source, digest), gen.name)
            config = kind.launch_config(group, dict(choice.config), gpu)
            constexprs = {k: v for k, v in config.items() if k not in ("num_warps", "num_stages")}
            options = {k: config[k] for k in ("num_warps", "num_stages")}
            outs = [(slots[n], meta(n).shape, meta(n).stride, meta(n).dtype) for n in gen.outputs]
            launch = Launch(choice.name, fn, [slots[n] for n in gen.inputs], outs,
                             kind.grid(group, choice.variant, config), constexprs, options)
        if kind is aten_activation.KIND:
            activation, result = aten_activation.activation_of(group)
            call = ActivationCall(group.anchors[0], result, activation, slots)
            by_group[id(group)] = AtenMatmul(choice.name, call, None)
        elif kind.library:
            by_group[id(group)] = AtenMatmul(choice.name, Call(group.anchors[0], slots), launch)
        else:
            by_group[id(group)] = launch
        kernels.append(BuiltKernel(
            name=choice.name, kind=choice.kind, variant=choice.variant, config=dict(choice.config),
            source=gen.source, source_hash=digest, nodes=nodes,
            ops=tuple(program.original_ops[n] for n in nodes), triton=launch is not None))
        choices.append(replace(choice, source_hash=digest))
    aten_mms = [g.anchors[0] for g, c in zip(groups, choices, strict=True)
                if kinds.kind_of(c.kind, c.variant).library]
    needed = _needed_views(program, aten_mms)
    for step in program.steps:
        if isinstance(step, KernelGroup):
            if by_group[id(step)] is not None:
                execs.append(by_group[id(step)])
        elif isinstance(step, ExternStep) or step.node in needed:
            execs.append(Call(step.node, slots))
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
