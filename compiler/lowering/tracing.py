"""Capture the aten graphs AOTAutograd makes of a module, with the inputs each receives.

Test and benchmark helpers: they run AOTAutograd with kiln's decomposition table, record
each graph handed to the compiler hooks, and record the real tensors each graph is then
called with (forward: parameters, buffers and user inputs; backward: saved activations
and tangents, captured by running a backward with all-ones gradients).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import fx, nn
from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func

from compiler.lowering.decomposition_table import decompositions
from compiler.lowering.partition import partition


class _TupleOutputs(nn.Module):
    """Wraps a module or function so that it returns a flat tuple, as AOTAutograd requires."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn  # an nn.Module here registers as a submodule: its parameters get lifted

    def forward(self, *args: Any) -> tuple[Any, ...]:
        leaves, _ = torch.utils._pytree.tree_flatten(self.fn(*args))
        return tuple(leaves)


class _Capture:
    """A compiler hook that keeps the graph and the first real inputs it is called with."""

    def __init__(self) -> None:
        self.gm: fx.GraphModule | None = None
        self.inputs: list[Any] | None = None

    def __call__(self, gm: fx.GraphModule, _fake_inputs: Sequence[Any]) -> Callable:
        self.gm = gm

        def run(*args: Any) -> Any:
            if self.inputs is None:
                self.inputs = [_snapshot(a) for a in args]
            return gm(*args)

        return make_boxed_func(run)


def _snapshot(value: Any) -> Any:
    """A detached copy, so that later in-place updates (optimizer, BN stats) leave it alone."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    return value


def flat_tensors(out: Any) -> list[torch.Tensor]:
    """The tensors among the leaves of a (nested) output, in order."""
    leaves, _ = torch.utils._pytree.tree_flatten(out)
    return [t for t in leaves if isinstance(t, torch.Tensor)]


def trace_inference(
    module_or_fn: nn.Module | Callable[..., Any], example_inputs: Sequence[Any]
) -> tuple[fx.GraphModule, list[Any]]:
    """The inference aten graph of `module_or_fn` (run under `no_grad`) and its inputs.

    The module is used in whatever mode it is in (call `.eval()` first for eval graphs).
    The returned inputs are the parameters and buffers AOTAutograd lifted, then the
    example inputs, in the graph's placeholder order.
    """
    capture = _Capture()
    # AOTAutograd picks inference vs training when it traces, so no_grad covers both steps.
    with torch.no_grad():
        compiled = aot_module_simplified(
            _TupleOutputs(module_or_fn),
            list(example_inputs),
            fw_compiler=capture,
            decompositions=decompositions(),
        )
        compiled(*example_inputs)
    if capture.gm is None or capture.inputs is None:
        raise RuntimeError("AOTAutograd produced no inference graph")
    return capture.gm, capture.inputs


def trace_training(
    module: nn.Module | Callable[..., Any], example_inputs: Sequence[Any],
    through_dynamo: bool = False,
) -> tuple[fx.GraphModule, fx.GraphModule, list[Any], list[Any]]:
    """The forward and backward aten graphs of one training step, and their inputs.

    Runs the forward with gradients on, then a backward with all-ones gradients for every
    output that requires grad, so the backward graph's inputs (saved activations +
    tangents) are real tensors; parameters' `.grad` stay untouched (a train-mode forward
    still updates BatchNorm running stats). Returns `(fwd_gm, bwd_gm, fwd_inputs, bwd_inputs)`.
    `through_dynamo`: AOTAutograd runs on dynamo's graph of the module (one graph, no break),
    as under `torch.compile`: a module whose Python reads tensor values (Hugging Face's
    models check masks and inputs) cannot be traced by AOTAutograd alone.
    """
    fwd, bwd = _Capture(), _Capture()
    with torch.enable_grad():
        wrapped = _TupleOutputs(module)
        if through_dynamo:
            from torch._dynamo.backends.common import aot_autograd

            compiled = torch.compile(wrapped, fullgraph=True, backend=aot_autograd(
                fw_compiler=fwd, bw_compiler=bwd, partition_fn=partition,
                decompositions=decompositions()))
        else:
            compiled = aot_module_simplified(
                wrapped,
                list(example_inputs),
                fw_compiler=fwd,
                bw_compiler=bwd,
                partition_fn=partition,
                decompositions=decompositions(),
            )
        outputs = [t for t in flat_tensors(compiled(*example_inputs)) if t.requires_grad]
        if not outputs:
            raise ValueError("no output requires grad: nothing to train")
        # autograd.grad rather than backward: the module's .grad fields stay untouched.
        leaves = [p for p in wrapped.parameters() if p.requires_grad]
        leaves += [t for t in example_inputs if isinstance(t, torch.Tensor) and t.requires_grad]
        torch.autograd.grad(outputs, leaves, [torch.ones_like(t) for t in outputs], allow_unused=True)
    if fwd.gm is None or bwd.gm is None or fwd.inputs is None or bwd.inputs is None:
        raise RuntimeError("AOTAutograd produced no forward/backward pair")
    return fwd.gm, bwd.gm, fwd.inputs, bwd.inputs
