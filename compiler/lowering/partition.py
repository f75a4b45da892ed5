"""How a training step's joint graph is split into the forward and backward kiln compiles.

AOTAutograd's min-cut partitioner, as Inductor uses it: the forward saves what is cheapest
to keep and the backward recomputes pointwise work from it. Its default partitioner saves
every intermediate the backward reads: a GPT-2 MLP's tanh-GELU saved four tensors of the
hidden size (the matmul's result, half of it, the tanh and one plus the tanh), which the
forward wrote and the backward read back; cut at the matmul's result, the forward stores
one and the backward recomputes the rest inside the kernel that reads it.
"""

from __future__ import annotations

from typing import Any

from torch import fx


def partition(joint: fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> tuple[fx.GraphModule, fx.GraphModule]:
    """AOTAutograd's `partition_fn`: (forward, backward) of `joint`."""
    from torch._functorch.partitioners import min_cut_rematerialization_partition

    return min_cut_rematerialization_partition(joint, joint_inputs, **kwargs)
