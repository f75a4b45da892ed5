"""A forward's input mutations written by kiln, so that AOTAutograd's runtime copies nothing.

A graph that updates an input (BatchNorm's running statistics) returns the new values
first, and AOTAutograd's runtime copies each into its input after the call: one `copy_`,
one launch and a few microseconds of host time each, outside any CUDA graph (resnet18's
training step: 60 of them, and the GPU waited for the host between them on an H200).
`InPlaceMutations` wraps the compiled forward: it writes the new values into their inputs
with one `_foreach_copy_` per dtype (`plans.write_back`) and returns the inputs themselves in their place, so that the
runtime's copies are copies of a tensor onto itself, which ATen skips. A plan's runner
does the same for the graphs it runs (`kiln.plans`).

Only where AOTAutograd's metadata says the mutations are plain data updates of inputs that
need no gradient (`kiln.plans.runtime_facts`); anything else stays AOTAutograd's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from kiln import plans


class InPlaceMutations:
    """`graph` (AOTAutograd's boxed convention), with the new values of the inputs at
    `mutated` written into them and returned as those inputs."""

    def __init__(self, graph: Callable[[list[Any]], Any], mutated: tuple[int, ...]) -> None:
        self.graph = graph
        self.mutated = mutated
        self._boxed_call = True

    def __call__(self, args: list[Any]) -> Any:
        targets = [args[i] for i in self.mutated]  # before the boxed call clears the list
        outs = self.graph(args)
        plans.write_back(targets, outs[:len(targets)])
        updated = [*targets, *outs[len(targets):]]
        return updated if isinstance(outs, list) else tuple(updated)


def wrapped(graph: Any, example_inputs: Sequence[Any]) -> Any:
    """`graph` as `InPlaceMutations` when AOTAutograd, compiling it now, says it mutates
    inputs kiln may update itself; else `graph` as it is."""
    try:
        facts = plans.runtime_facts(plans.shares_storage(
            [x for x in example_inputs if isinstance(x, torch.Tensor)]))
    except plans.NotPlannable:
        return graph
    if not facts.mutated_inputs:
        return graph
    return InPlaceMutations(graph, facts.mutated_inputs)
