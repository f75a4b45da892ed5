"""The steps a built graph runs on each call: kernel launches, ATen calls, views.

Each step reads and writes slots of an environment list (one slot per graph node);
`Built` (compiler/runtime/built.py) runs them in order and frees slots at their last use.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx
from torch.utils._pytree import tree_flatten, tree_unflatten

from compiler.runtime.extern_layout import laid_out, layouts, returns_fresh
from compiler.runtime.interpreter_fixes import patch_interpreter_bf16_dot
from compiler.runtime.library_calls import AddmmActivation, library_call


@dataclass
class KernelCall:
    """One kernel launch of a run; `launch()` re-launches it alone on the same buffers."""

    name: str
    launch: Callable[[], None]


class Const:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class Slot:
    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


class Args:
    """Arguments of a call with node references replaced by environment slots.

    Binding is on every call's path, so the usual shapes (positional nodes, constants and
    flat lists of them; constant keyword arguments) bind without pytree walks."""

    def __init__(self, args: Any, slots: dict[fx.Node, int]) -> None:
        flat, self.spec = tree_flatten(args)
        self.flat = [(Slot(slots[a]) if isinstance(a, fx.Node) else a) for a in flat]
        self.refs = [i for i, a in enumerate(self.flat) if isinstance(a, Slot)]
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
            return Slot(slots[arg])
        if isinstance(arg, (list, tuple)):
            if any(isinstance(a, (list, tuple, dict)) for a in arg):
                return _COMPLEX
            return _List([Slot(slots[a]) if isinstance(a, fx.Node) else a for a in arg],
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
    if kind is Slot:
        return env[a.index]
    if kind is _List:
        return a.kind(env[x.index] if type(x) is Slot else x for x in a.items)
    return a


class Launch:
    """A generated kernel with its grid, block sizes and buffers."""

    def __init__(self, name: str, fn: Any, in_slots: list[int], outs: list[tuple],
                 grid: tuple[int, ...], constexprs: dict[str, int], options: dict[str, int]) -> None:
        self.name, self.fn = name, fn
        self.in_slots, self.outs = in_slots, outs
        self.grid, self.constexprs, self.options = grid, constexprs, options
        self.empty = any(g == 0 for g in grid)
        self.poison: bool | float = False
        self._interpreted: Any = None

    def kernel_for(self, device: torch.device) -> Any:
        if device.type == "cpu" or is_interpreted(self.fn):
            patch_interpreter_bf16_dot()
        if device.type == "cpu" and not is_interpreted(self.fn):
            if self._interpreted is None:
                from triton.runtime.interpreter import InterpretedFunction

                self._interpreted = InterpretedFunction(self.fn.fn)
            return self._interpreted
        return self.fn

    def run(self, env: list[Any], device: torch.device, record: list | None) -> Callable[[], None]:
        """Launch on `env`'s buffers; returns a closure that launches again on the same ones."""
        for slot, shape, stride, dtype in self.outs:
            env[slot] = torch.empty_strided(shape, stride, dtype=dtype, device=device)
            if self.poison is not False:
                _poison(env[slot], self.poison)
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


def _poison(t: torch.Tensor, fill: bool | float) -> None:
    """Fill a fresh buffer with NaN (or `fill` when it is a number; an unlikely integer
    for integer dtypes) so unwritten elements show."""
    if t.dtype.is_floating_point:
        t.fill_(float("nan") if fill is True else float(fill))
    elif t.dtype == torch.bool:
        t.view(torch.uint8).fill_(0x5A) if t.numel() else None
    else:
        t.fill_(torch.iinfo(t.dtype).min + 7)


def runs_on_cpu() -> bool:
    """Whether built kernels can run on CPU tensors in this process: only on Triton's
    interpreter, that is with TRITON_INTERPRET=1 set before Triton was imported (otherwise
    `tl.sum` and the other library functions stay compiled-only and fail there)."""
    from triton import knobs

    return bool(knobs.runtime.interpret)


def is_interpreted(fn: Any) -> bool:
    return type(fn).__name__ == "InterpretedFunction"


class Call:
    """An ATen call (extern op, view, getitem) on environment values."""

    def __init__(self, node: fx.Node, slots: dict[fx.Node, int]) -> None:
        self.target = library_call(node.target)
        self.args = Args((node.args, node.kwargs), slots)
        self.tree = slot_tree((node.args, dict(node.kwargs)), slots)  # for generated launchers
        self.meta = node.meta.get("kiln_meta")  # the result's dtype and layout, when a tensor
        self.slot = slots[node]
        # the layout kernels read the result in, enforced on what the library returns
        self.layout = layouts(self.meta) if returns_fresh(node.target) else None

    def run(self, env: list[Any], device: torch.device, record: list | None) -> None:
        args, kwargs = self.args.bind(env)
        env[self.slot] = laid_out(self.target(*args, **kwargs), self.layout)


def slot_tree(tree: Any, slots: dict[fx.Node, int]) -> Any:
    """`tree` (fx arguments: tuples, lists, dicts, constants) with its nodes as `Slot`s."""
    if isinstance(tree, fx.Node):
        return Slot(slots[tree])
    if isinstance(tree, tuple):
        return tuple(slot_tree(a, slots) for a in tree)
    if isinstance(tree, list):
        return [slot_tree(a, slots) for a in tree]
    if isinstance(tree, dict):
        return {k: slot_tree(v, slots) for k, v in tree.items()}
    return tree


class ActivationCall(Call):
    """An addmm and its activation as one library call (`kinds.aten_activation`), its
    result in the activation's slot (the product's own is never written)."""

    def __init__(self, mm: fx.Node, result: fx.Node, activation: str,
                 slots: dict[fx.Node, int]) -> None:
        self.meta = result.meta.get("kiln_meta")
        self.target = AddmmActivation(activation, tuple(self.meta.shape))
        self.args = Args((mm.args, {}), slots)
        self.tree = slot_tree((mm.args, {}), slots)
        self.slot = slots[result]
        self.layout = layouts(self.meta)


class AtenMatmul:
    """A matmul run as an ATen call, then its epilogue kernel (if the group has one)."""

    def __init__(self, name: str, call: Call, epilogue: Launch | None) -> None:
        self.name, self.call, self.epilogue = name, call, epilogue

    def run(self, env: list[Any], device: torch.device, record: list | None) -> None:
        args, kwargs = self.call.args.bind(env)
        target, layout = self.call.target, self.call.layout
        env[self.call.slot] = laid_out(target(*args, **kwargs), layout)
        epilogue = self.epilogue.run(env, device, None) if self.epilogue is not None else _nothing
        if record is not None:
            def launch() -> None:  # the ATen call's result is dropped: the epilogue's input stays
                target(*args, **kwargs)
                epilogue()
            record.append(KernelCall(self.name, launch))
