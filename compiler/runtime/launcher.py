"""Per-graph launchers: one generated Python function runs all of a built graph's steps.

`Built._run` interprets its steps (a loop over step objects, arguments bound per call,
Triton's JIT dispatch per launch). A graph's call instead runs one flat function whose
source is generated here from the built graph, as Inductor's wrapper does: inputs
unpacked into locals and checked inline (shape, stride, dtype), buffers allocated with
their sizes and strides written out, ATen ops called directly with their arguments
written out, views of inputs and kernel buffers made as aliases of their recorded layout
(`reinterpret`, no dispatcher), a kernel launched with its grid and block sizes written
out, and each value deleted after its last use (a buffer whose value died is reused for a
later one with the same layout when only kernels ever read it, so no view can alias it).

The source is generated from the validated graph only (node slots, checked integers and
finite floats, names chosen here, keyword names of torch's op schemas; every other object,
strings included, is bound as a global of the function, never written as text),
deterministically (`source(device, mode)`; the same graph gives the same text), and
compiled with `compile()`. Nothing a client sent is executed.

Launch modes, per device:
- "jit": each launch calls the kernel's `fn[grid](*args, **constexprs, **options)`, the
  normal Triton path (always on the CPU, where kernels run in the interpreter).
- "record": as "jit", and each launch keeps what Triton's JIT returned (its
  `CompiledKernel`) and whether each argument it did not allocate was 16-byte aligned
  (what the JIT specialises a pointer on besides its dtype). The first call on a CUDA
  device runs this mode.
- "direct": from the second call on a CUDA device (from the first where the graph's
  kernels were loaded ahead, `GraphLauncher.preload`), each launch calls the compiled
  kernel's launcher itself, `kernel.run(gx, gy, gz, stream, kernel.function,
  kernel.packed_metadata, None, None, None, *args)` (Triton 3.6 and 3.9 both launch this
  way from `JITFunction.run`), skipping the JIT's argument binding, specialisation and
  cache lookup, and passes no launch metadata and no hooks (what the JIT's launch does
  with Triton's empty hook chains). It falls back to the "jit" function for the whole
  call when a Triton launch hook is set (a profiler), the current device is another one,
  or an input's alignment differs from the recorded call's, and to the JIT for one launch
  when an argument an ATen call produced is aligned differently. Any launch whose JIT
  result is not a compiled kernel keeps the whole device on "jit", and so does a first
  direct call that a launcher refuses (a trial: the call runs again through the JIT).
  The "jit" function a direct one falls back to is compiled at its first use.
"""

from __future__ import annotations

import keyword
import logging
import math
import operator
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from compiler.runtime.execution import AtenMatmul, Call, Launch, Slot, _poison, is_interpreted
from compiler.runtime.extern_layout import laid_out
from compiler.runtime.static_launch import hook_set

log = logging.getLogger(__name__)

MODES = ("jit", "record", "direct")
CPU = torch.device("cpu")

RunFn = Callable[[Sequence[Any], bool], Any]

# Single-result ATen views whose result is fully described by its size, strides and
# storage offset (what `_reinterpret_tensor` makes).
ALIAS_VIEWS = frozenset({
    "view.default", "_unsafe_view.default", "permute.default", "t.default", "transpose.int",
    "expand.default", "unsqueeze.default", "squeeze.default", "squeeze.dim", "squeeze.dims",
    "slice.Tensor", "select.int", "alias.default", "view_as.default", "expand_as.default",
    "numpy_T.default",
})


def _op_key(target: Any) -> str:
    if not isinstance(target, torch._ops.OpOverload):
        return ""
    name = str(target)
    return name[len("aten."):] if name.startswith("aten.") else ""


def _reinterpret() -> Callable[..., torch.Tensor]:
    """`reinterpret(t, size, stride, offset_increment)`: an alias of `t` with that layout,
    made in C++ without the dispatcher (Inductor's `reinterpret_tensor`)."""
    try:
        from torch._C._dynamo.guards import _reinterpret_tensor
    except ImportError:
        def _reinterpret_tensor(t: torch.Tensor, size: Any, stride: Any, inc: int) -> torch.Tensor:
            return t.as_strided(size, stride, t.storage_offset() + inc)
    return _reinterpret_tensor


class _Namespace:
    """Globals of a generated function: every object the source refers to by name."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}
        self._by_id: dict[tuple[str, int], str] = {}
        self._counts: dict[str, int] = {}  # names given per prefix

    def bind(self, prefix: str, value: Any) -> str:
        """A global name for `value` (one name per object, numbered in order of use)."""
        key = (prefix, id(value))
        name = self._by_id.get(key)
        if name is None:
            count = self._counts.get(prefix, 0)
            name = self._by_id[key] = f"{prefix}{count}"
            self._counts[prefix] = count + 1
            self.values[name] = value
        return name

    def literal(self, value: Any) -> str:
        """Source for a constant argument: Python literals for ints, finite floats, bools
        and None; a global name for anything else (strings, dtypes, devices, NaN, ...)."""
        kind = type(value)
        if value is None or kind is bool or kind is int:
            return repr(value)
        if kind is float and math.isfinite(value):
            return repr(value)
        return self.bind("k", value)


def _var(slot: int) -> str:
    return f"v{operator.index(slot)}"


def _ints(values: Sequence[Any]) -> str:
    """A tuple literal of integers (sizes, strides), each checked to be one."""
    return _tuple([str(operator.index(v)) for v in values])


def _tuple(items: list[str]) -> str:
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def _comment(text: Any) -> str:
    """A name for a comment: letters, digits, '_' and '.' only."""
    return "".join(c for c in str(text) if c.isalnum() or c in "_.")[:80]


def _render(tree: Any, ns: _Namespace) -> str:
    """Source of an argument tree whose node references are `Slot`s."""
    if type(tree) is Slot:
        return _var(tree.index)
    if isinstance(tree, tuple):
        return _tuple([_render(a, ns) for a in tree])
    if isinstance(tree, list):
        return f"[{', '.join(_render(a, ns) for a in tree)}]"
    if isinstance(tree, dict):
        return "{" + ", ".join(f"{ns.literal(k)}: {_render(v, ns)}" for k, v in tree.items()) + "}"
    return ns.literal(tree)


def _call_source(step: Call, ns: _Namespace) -> str:
    """`v<slot> = <op>(args)`: the ATen op's C++ entry point called directly."""
    args, kwargs = step.tree
    if step.target is operator.getitem and not kwargs and len(args) == 2:
        return f"{_var(step.slot)} = {_render(args[0], ns)}[{_render(args[1], ns)}]"
    target = step.target
    entry = getattr(target, "_op", None) if isinstance(target, torch._ops.OpOverload) else None
    name = ns.bind("op", entry if entry is not None else target)
    parts = [_render(a, ns) for a in args]
    schema = getattr(target, "_schema", None)
    declared = {a.name for a in schema.arguments} if schema is not None else set()
    for key, value in kwargs.items():
        if key in declared and key.isidentifier() and not keyword.iskeyword(key):
            parts.append(f"{key}={_render(value, ns)}")  # a name of torch's op schema
        else:
            parts.append(f"**{{{ns.literal(key)}: {_render(value, ns)}}}")
    line = f"{_var(step.slot)} = {name}({', '.join(parts)})  # {_comment(target)}"
    if step.layout is not None:  # the library may lay it out otherwise (extern_layout.py)
        line += f"\n    {_var(step.slot)} = laid_out({_var(step.slot)}, {ns.bind('layout', step.layout)})"
    return line


class Plan:
    """What a graph's launcher needs from its `Built`, computed once: the steps, which
    slots are inputs, constants and outputs, where each value dies, and which buffers
    may be reused."""

    def __init__(self, execs: list[Any], inputs: list[tuple[int, Any]], consts: list[int],
                 outputs: Any, frees: list[list[int]]) -> None:
        self.execs, self.inputs, self.consts = execs, inputs, consts
        self.input_slots = {slot for slot, _ in inputs}
        self.outputs, self.frees = outputs, frees
        launches = [s.epilogue if isinstance(s, AtenMatmul) else s for s in execs]
        self.launches: list[Launch] = [s for s in launches if isinstance(s, Launch)]
        # Slots our launches allocate (aligned by the caching allocator; never foreign).
        self.allocated = {o[0] for launch in self.launches for o in launch.outs}
        self.reuse = self._plan_reuse()
        self.views = self._plan_views()

    def _plan_views(self) -> dict[int, tuple[int, tuple[int, ...], tuple[int, ...], int]]:
        """View slot -> (base slot, size, strides, storage offset from the base's): views
        made without an ATen call (a C++ alias with the recorded layout), for views of
        buffers whose layout is known for certain: inputs (checked each call), buffers our
        launches allocate, and such views of them. A view of an ATen call's result stays an
        ATen call (its layout is the library's)."""
        known = {slot: (tuple(m.shape), tuple(m.stride), m.offset, m.dtype)
                 for slot, m in self.inputs if m is not None}
        for launch in self.launches:
            for slot, shape, stride, dtype in launch.outs:
                known[slot] = (tuple(shape), tuple(stride), 0, dtype)
        views = {}
        for step in self.execs:
            if not isinstance(step, Call) or _op_key(step.target) not in ALIAS_VIEWS:
                continue
            base = step.tree[0][0] if step.tree[0] else None
            m = step.meta
            if type(base) is not Slot or base.index not in known or not hasattr(m, "stride"):
                continue
            _, _, offset, dtype = known[base.index]
            if m.dtype != dtype:
                continue
            known[step.slot] = (tuple(m.shape), tuple(m.stride), m.offset, m.dtype)
            views[step.slot] = (base.index, tuple(m.shape), tuple(m.stride), m.offset - offset)
        return views

    def _plan_reuse(self) -> dict[int, int]:
        """Allocation slot -> the dead slot whose buffer it takes over: a buffer of the
        exact same shape, strides and dtype that kernels alone read (no ATen call or view
        could have made an alias of it) and that is no output."""
        read_by_other: set[int] = set()
        for step in self.execs:
            call = step.call if isinstance(step, AtenMatmul) else step
            if isinstance(call, Call):
                read_by_other |= _tree_slots(call.tree)
        read_by_other |= _tree_slots(self.outputs)
        private = self.allocated - read_by_other
        layouts = {o[0]: (tuple(o[1]), tuple(o[2]), o[3]) for launch in self.launches
                   for o in launch.outs}
        pool: dict[Any, list[int]] = {}
        reuse: dict[int, int] = {}
        for i, step in enumerate(self.execs):
            launch = step.epilogue if isinstance(step, AtenMatmul) else step
            if isinstance(launch, Launch):
                for slot, *_ in launch.outs:
                    free = pool.get(layouts[slot])
                    if free:
                        reuse[slot] = free.pop()
            for slot in self.frees[i]:
                if slot in private:
                    pool.setdefault(layouts[slot], []).append(slot)
        return reuse


def _tree_slots(tree: Any) -> set[int]:
    if type(tree) is Slot:
        return {tree.index}
    if isinstance(tree, (list, tuple)):
        return set().union(*(_tree_slots(a) for a in tree)) if tree else set()
    if isinstance(tree, dict):
        return set().union(*(_tree_slots(a) for a in tree.values())) if tree else set()
    return set()


class Recorded:
    """One launch's first call on a CUDA device: what the JIT returned, and for each
    argument the launch did not allocate, whether it was 16-byte aligned."""

    __slots__ = ("aligned", "kernel")

    def __init__(self, kernel: Any, aligned: tuple[bool, ...]) -> None:
        self.kernel, self.aligned = kernel, aligned


def is_compiled_kernel(kernel: Any) -> bool:
    """Whether the JIT handed back a loaded compiled kernel whose launcher we can call."""
    return (type(kernel).__name__ == "CompiledKernel"
            and all(hasattr(kernel, a) for a in ("run", "function", "packed_metadata")))


def _arg_order(launch: Launch, nargs: int) -> list[Any] | None:
    """The kernel's parameters in order: ints for positional argument positions, constexpr
    values for the rest (what the JIT's binder hands the launcher). None when a parameter
    is neither (the launch then stays on the JIT path)."""
    names = getattr(launch.fn, "arg_names", None)
    if names is None or len(names) < nargs:
        return None
    order: list[Any] = list(range(nargs))
    for name in names[nargs:]:
        if name not in launch.constexprs:
            return None  # a defaulted parameter: leave binding to the JIT
        order.append(_Constexpr(launch.constexprs[name]))
    return order


class _Constexpr:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def generate(plan: Plan, device: torch.device, mode: str,
             kernel_for: Callable[[Launch], Any],
             recorded: list[Recorded | None] | None = None) -> tuple[str, dict[str, Any]]:
    """The source of `run(inputs, boxed)` for `device` in `mode`, and its globals.

    `kernel_for(launch)` is the jitted function a launch calls on the JIT path;
    `recorded` (mode "direct") holds each launch's `Recorded` first call."""
    if mode not in MODES:
        raise ValueError(f"unknown launcher mode {mode!r}")
    ns = _Namespace()
    ns.values.update(empty_strided=torch.empty_strided, poison=_poison, dev=device,
                     reinterpret=_reinterpret(), laid_out=laid_out)
    lines = ["def run(inputs, boxed):"]
    emit = lines.append
    lines.extend(_input_lines(plan, ns))
    index = {id(launch): i for i, launch in enumerate(plan.launches)}
    if mode == "direct":
        assert recorded is not None
        dev_index = "None" if device.index is None else str(operator.index(device.index))
        guards = ["hooked()", f"current_device() != {dev_index}"]
        seen: set[int] = set()
        for launch, rec in zip(plan.launches, recorded, strict=True):
            for slot, ok in zip(_foreign(plan, launch), rec.aligned if rec else (), strict=False):
                if slot in plan.input_slots and slot not in seen:
                    seen.add(slot)
                    guards.append(f"{'' if ok else 'not '}{_var(slot)}.data_ptr() & 15")
        emit("    if (" + "\n            or ".join(guards) + "):")
        emit("        return fallback(inputs, boxed)")
        emit(f"    stream = current_stream({dev_index})")
    emit("    if boxed:")
    emit("        inputs.clear()")
    for slot in plan.consts:
        emit(f"    {_var(slot)} = const{slot}")  # bound per device
    kept = set(plan.reuse.values())
    for i, step in enumerate(plan.execs):
        if isinstance(step, Launch):
            _launch_lines(step, index[id(step)], plan, ns, mode, kernel_for, recorded, emit)
        elif isinstance(step, AtenMatmul):
            emit(f"    {_call_source(step.call, ns)}")
            if step.epilogue is not None:
                _launch_lines(step.epilogue, index[id(step.epilogue)], plan, ns, mode,
                              kernel_for, recorded, emit)
        elif step.slot in plan.views:
            base, size, stride, delta = plan.views[step.slot]
            emit(f"    {_var(step.slot)} = reinterpret({_var(base)}, {_ints(size)}, {_ints(stride)}, "
                 f"{operator.index(delta)})  # {_comment(step.target)}")
        else:
            emit(f"    {_call_source(step, ns)}")
        dead = [_var(s) for s in plan.frees[i] if s not in kept]
        if dead:
            emit(f"    del {', '.join(dead)}")
    outs = plan.outputs
    if isinstance(outs, (list, tuple)):
        emit(f"    return {_render(tuple(outs), ns)}")
    else:
        emit(f"    return {_render(outs, ns)}")
    return "\n".join(lines) + "\n", ns.values


def _input_lines(plan: Plan, ns: _Namespace) -> list[str]:
    """Unpack the inputs into locals and check their count, shapes, strides and dtypes."""
    lines = []
    n = len(plan.inputs)
    lines.append(f"    if len(inputs) != {n}:")
    lines.append(f"        raise ValueError(f'built graph takes {n} inputs, got {{len(inputs)}}')")
    if n:
        names = ", ".join(_var(slot) for slot, _ in plan.inputs)
        lines.append(f"    {names}{',' if n == 1 else ''} = inputs")
    checks = []
    for pos, (slot, m) in enumerate(plan.inputs):
        if m is None:
            continue
        v = _var(slot)
        checks.append(f"        if {v}.shape != {_ints(m.shape)} or {v}.stride() != "
                      f"{_ints(m.stride)} or {v}.dtype != {ns.literal(m.dtype)}:")
        checks.append(f"            check({pos}, {v})")
    if checks:
        lines.append("    try:")
        lines.extend(checks)
        lines.append("    except AttributeError:")
        lines.append("        check_all(inputs)")
        lines.append("        raise")
    return lines


def generate_check(plan: Plan) -> tuple[str, dict[str, Any]]:
    """The source of `check_inputs(inputs)` (the launcher's input checks alone: what a
    CUDA graph replay, which runs no launcher, checks), and its globals."""
    ns = _Namespace()
    lines = ["def check_inputs(inputs):", *_input_lines(plan, ns), "    return None"]
    return "\n".join(lines) + "\n", ns.values


def _foreign(plan: Plan, launch: Launch) -> list[int]:
    """The launch's argument slots it did not allocate itself, in argument order."""
    return [s for s in launch.in_slots if s not in plan.allocated]


def _launch_lines(launch: Launch, i: int, plan: Plan, ns: _Namespace, mode: str,
                  kernel_for: Callable[[Launch], Any], recorded: list[Recorded | None] | None,
                  emit: Callable[[str], None]) -> None:
    emit(f"    # {_comment(launch.name)}")
    for slot, shape, stride, dtype in launch.outs:
        v = _var(slot)
        if slot in plan.reuse:
            old = _var(plan.reuse[slot])
            emit(f"    {v} = {old}  # reused")
            emit(f"    del {old}")
        else:
            emit(f"    {v} = empty_strided({_ints(shape)}, {_ints(stride)}, "
                 f"dtype={ns.literal(dtype)}, device=dev)")
        if launch.poison is not False:
            emit(f"    poison({v}, {ns.literal(launch.poison)})")
    if launch.empty:
        return
    args = [_var(s) for s in launch.in_slots] + [_var(o[0]) for o in launch.outs]
    jit_call = _jit_call(launch, args, ns, kernel_for)
    if mode == "jit":
        emit(f"    {jit_call}")
        return
    foreign = _foreign(plan, launch)
    if mode == "record":
        aligned = "".join(f"{_var(s)}.data_ptr() & 15 == 0, " for s in foreign)
        emit(f"    R[{i}] = ({jit_call}, ({aligned}))")
        return
    assert recorded is not None
    rec = recorded[i]
    order = _arg_order(launch, len(args))
    if rec is None or order is None:
        emit(f"    {jit_call}")
        return
    kernel = rec.kernel
    grid = [operator.index(g) for g in launch.grid] + [1] * (3 - len(launch.grid))
    values = [args[o] if isinstance(o, int) else ns.literal(o.value) for o in order]
    direct = (f"{ns.bind('L', kernel.run)}({grid[0]}, {grid[1]}, {grid[2]}, stream, "
              f"{ns.bind('F', kernel.function)}, {ns.bind('M', kernel.packed_metadata)}, "
              f"None, None, None, {', '.join(values)})")
    guards = [f"{'' if ok else 'not '}{_var(s)}.data_ptr() & 15"
              for s, ok in zip(foreign, rec.aligned, strict=True) if s not in plan.input_slots]
    if guards:
        emit(f"    if {' or '.join(guards)}:")
        emit(f"        {jit_call}")
        emit("    else:")
        emit(f"        {direct}")
    else:
        emit(f"    {direct}")


def _jit_call(launch: Launch, args: list[str], ns: _Namespace,
              kernel_for: Callable[[Launch], Any]) -> str:
    fn = ns.bind("K", kernel_for(launch)[launch.grid])
    keywords = [f"{k}={ns.literal(v)}" for k, v in {**launch.constexprs, **launch.options}.items()]
    return f"{fn}({', '.join(args + keywords)})"


class GraphLauncher:
    """A built graph's generated launchers, one per device (and launch mode)."""

    def __init__(self, plan: Plan, kernel_for: Callable[[Launch, torch.device], Any],
                 constants: Callable[[torch.device], list[tuple[int, torch.Tensor]]],
                 check: Callable[[int, Any], None], check_all: Callable[[Sequence[Any]], None],
                 device_inputs: Sequence[int],
                 direct: Callable[[torch.device], bool] = lambda device: device.type == "cuda",
                 runtime: Callable[[RunFn], dict[str, Any]] | None = None) -> None:
        """`device_inputs`: the inputs that may say where the graph runs (the first call
        picks one, `_pick_device_input`); `direct(device)`: whether launches on `device` may go to compiled kernels'
        launchers; `runtime(fallback)`: the direct function's globals that ask Triton's
        driver (hooks, current device and stream) and its fallback (tests stand them in)."""
        self.plan = plan
        self._direct = direct
        self._runtime = runtime or _direct_globals
        self._kernel_for = kernel_for
        self._constants = constants
        self._check, self._check_all = check, check_all
        self._candidates = list(device_inputs)
        self._device_input = None if self._candidates else -1  # picked on the first call
        self._fns: dict[torch.device, RunFn] = {}
        self._preloaded: dict[torch.device, list[Recorded | None]] = {}
        self._checker: Callable[[Sequence[Any]], None] | None = None
        self._lock = threading.Lock()
        self.modes: dict[torch.device, str] = {}  # the mode each device runs now

    def _pick_device_input(self, inputs: Sequence[Any]) -> int:
        """The input whose device the graph runs on: the first tensor input off the CPU (a
        CPU scalar tensor beside CUDA ones does not make a CPU graph), else the last one;
        -1 for none."""
        for i in self._candidates:
            if i < len(inputs) and isinstance(inputs[i], torch.Tensor) and inputs[i].device.type != "cpu":
                return i
        return self._candidates[-1] if self._candidates else -1

    def reset(self) -> None:
        """Forget generated functions (after a change that alters the source: poison)."""
        with self._lock:
            self._fns.clear()
            self.modes.clear()

    def __call__(self, inputs: Sequence[Any], boxed: bool) -> Any:
        pos = self._device_input
        if pos is None:
            pos = self._device_input = self._pick_device_input(inputs)
        device = inputs[pos].device if 0 <= pos < len(inputs) else CPU
        fn = self._fns.get(device)
        if fn is None:
            fn = self._prepare(device)
        return fn(inputs, boxed)

    def preload(self, device: torch.device, kernels: Sequence[Any]) -> None:
        """Kernels loaded ahead of the first call on `device` (`Built.precompile`), one per
        launch in order, each compiled for 16-byte aligned pointers: the first call then
        launches them directly, as a recorded call would have found them, instead of
        recording through the JIT (the direct function's alignment guards send any other
        argument to the JIT). Nothing changes where one is not a loaded compiled kernel."""
        entries: list[Recorded | None] = []
        for launch, kernel in zip(self.plan.launches, kernels, strict=True):
            if launch.empty:
                entries.append(None)
            elif is_compiled_kernel(kernel) and getattr(kernel, "function", None) is not None:
                entries.append(Recorded(kernel, (True,) * len(_foreign(self.plan, launch))))
            else:
                return
        with self._lock:
            self._preloaded[device] = entries

    def source(self, device: torch.device | str, mode: str = "jit",
               recorded: list[Recorded | None] | None = None) -> str:
        """The generated source for `device` in `mode` (deterministic: tests, debugging)."""
        device = torch.device(device)
        return generate(self.plan, device, mode, lambda launch: self._kernel_for(launch, device),
                        recorded)[0]

    def check(self, inputs: Sequence[Any]) -> None:
        """Check the inputs' count, shapes, strides and dtypes (ValueError), as a call does."""
        fn = self._checker
        if fn is None:
            source, values = generate_check(self.plan)
            fn = self._checker = self._exec(source, values, "<kiln input check>", "check_inputs")
        fn(inputs)

    def _exec(self, source: str, values: dict[str, Any], filename: str, name: str,
              extra: dict[str, Any] | None = None) -> Any:
        """Compile generated `source` with its globals `values` (and `extra`, and the
        input checks it calls) and return its function `name`."""
        namespace: dict[str, Any] = {"__builtins__": __builtins__, **values,
                                     "check": self._check, "check_all": self._check_all,
                                     **(extra or {})}
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - our own generated source (module docstring)
        return namespace[name]

    def compile(self, device: torch.device, mode: str,
                recorded: list[Recorded | None] | None = None,
                extra: dict[str, Any] | None = None) -> RunFn:
        """Generate, compile and bind the function for `device` in `mode`."""
        source, values = generate(self.plan, device, mode,
                                  lambda launch: self._kernel_for(launch, device), recorded)
        bound = {f"const{slot}": value for slot, value in self._constants(device)}
        return self._exec(source, values, f"<kiln launcher {mode} {device}>", "run",
                          {**bound, **(extra or {})})

    def _prepare(self, device: torch.device) -> RunFn:
        with self._lock:
            fn = self._fns.get(device)
            if fn is not None:
                return fn
            interpreted = not self._direct(device) or any(
                is_interpreted(self._kernel_for(launch, device)) for launch in self.plan.launches)
            if interpreted or not self.plan.launches:
                self._fns[device], self.modes[device] = self.compile(device, "jit"), "jit"
            elif device in self._preloaded:
                self._go_direct(device, self._preloaded[device])
            else:
                self._fns[device], self.modes[device] = self._recording(device), "record"
            return self._fns[device]

    def _recording(self, device: torch.device) -> RunFn:
        recorded: list[Any] = [None] * len(self.plan.launches)
        record = self.compile(device, "record", extra={"R": recorded})

        def first(inputs: Sequence[Any], boxed: bool) -> Any:
            out = record(inputs, boxed)
            self._after_record(device, recorded)
            return out

        return first

    def _after_record(self, device: torch.device, recorded: list[Any]) -> None:
        with self._lock:
            if self.modes.get(device) != "record":
                return
            entries: list[Recorded | None] = []
            for launch, value in zip(self.plan.launches, recorded, strict=True):
                if launch.empty:  # nothing to launch (a zero-size grid)
                    entries.append(None)
                    continue
                if value is None or not is_compiled_kernel(value[0]):
                    self._fns[device], self.modes[device] = self.compile(device, "jit"), "jit"
                    return
                entries.append(Recorded(value[0], tuple(value[1])))
            self._go_direct(device, entries)

    def _go_direct(self, device: torch.device, entries: list[Recorded | None]) -> None:
        """Put `device` on the direct function for these kernels (its first call a trial),
        or on the JIT where that function cannot be made. Called holding the lock."""
        jit = self._jit_later(device)
        try:
            direct = self.compile(device, "direct", entries, extra=self._runtime(jit))
        except Exception:  # an unknown Triton: launches stay on the JIT path
            self._fns[device], self.modes[device] = self.compile(device, "jit"), "jit"
            return
        self._fns[device] = self._trial(device, direct, jit)
        self.modes[device] = "direct"

    def _jit_later(self, device: torch.device) -> RunFn:
        """The device's "jit" function, compiled at its first call: the fallback of a
        direct function, which most runs never take."""
        compiled: list[RunFn] = []

        def jit(inputs: Sequence[Any], boxed: bool) -> Any:
            if not compiled:
                compiled.append(self.compile(device, "jit"))
            return compiled[0](inputs, boxed)

        return jit

    def _trial(self, device: torch.device, direct: RunFn, jit: RunFn) -> RunFn:
        """The first direct call keeps its inputs (a boxed list is cleared only after it)
        and, should a launcher refuse its arguments (a Triton whose launch convention
        differs), runs again on the JIT path, which the device then keeps."""

        def trial(inputs: Sequence[Any], boxed: bool) -> Any:
            try:
                out = direct(inputs, False)
            except Exception as exc:  # noqa: BLE001 - any refusal: the JIT path is correct
                log.warning("kiln: direct kernel launches failed (%s: %s); launching through "
                            "Triton's JIT", type(exc).__name__, exc)
                with self._lock:
                    self._fns[device], self.modes[device] = jit, "jit"
                return jit(inputs, boxed)
            with self._lock:
                if self._fns.get(device) is trial:
                    self._fns[device] = direct
            if boxed:
                inputs.clear()  # type: ignore[attr-defined]
            return out

        return trial


def _direct_globals(fallback: RunFn) -> dict[str, Any]:
    from triton import knobs
    from triton.runtime.driver import driver

    def hooked() -> bool:
        """Whether a launch hook is set (a profiler's)."""
        runtime = knobs.runtime
        return hook_set(runtime.launch_enter_hook) or hook_set(runtime.launch_exit_hook)

    active = driver.active
    return {"hooked": hooked, "current_device": active.get_current_device,
            "current_stream": active.get_current_stream, "fallback": fallback}
