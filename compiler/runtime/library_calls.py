"""Library calls that are no single ATen op: what a kernel kind runs instead of a kernel,
and what an ATen call of the graph runs instead of its op where ATen's kernel is slow."""

from __future__ import annotations

from typing import Any

import torch

aten = torch.ops.aten

ACTIVATIONS = ("relu", "gelu_tanh")


class AddmmActivation:
    """`activation(addmm(bias, a, b))` as one library call (`kinds.aten_activation`).

    On a GPU, `torch._addmm_activation`: cuBLASLt applies the activation in its epilogue
    (ATen falls back to the addmm and the tanh GELU where cuBLASLt cannot). On the CPU, the
    addmm and then the activation: ATen's CPU `_addmm_activation` computes the erf GELU,
    not the tanh one the graph asked for."""

    def __init__(self, activation: str, shape: tuple[int, ...] | None = None) -> None:
        if activation not in ACTIVATIONS:
            raise ValueError(f"unknown activation {activation!r}: expected one of {ACTIVATIONS}")
        self.activation = activation
        self.shape = shape  # the graph's view of the (row-major) result, if another shape

    def __call__(self, bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        gelu = self.activation == "gelu_tanh"
        if a.is_cuda:
            out = torch._addmm_activation(bias, a, b, use_gelu=gelu)
        else:
            out = torch.addmm(bias, a, b)
            out = torch.nn.functional.gelu(out, approximate="tanh") if gelu else torch.relu(out)
        return out.view(self.shape) if self.shape is not None else out

    def __repr__(self) -> str:  # generated launchers' comments name the call
        return f"kiln.addmm_{self.activation}"


# Where the compact embedding backward applies (estimates from ATen's kernel times in GPT-2's
# step, to be replaced by `bench.embedding_backward`'s measurements). It saves ATen's radix
# sort of the indices, whose cost grows with the table's index bits: worth it for a
# vocabulary, not for a table with fewer rows than twice the tokens (GPT-2's 1024
# positions). It pays about 40 bytes of traffic per gradient element (float32 sums, the
# cast, the gather, the scatter) where ATen pays about 12: past ~8M elements (a
# Llama-sized 8192 tokens x 4096) those passes cost more than the sort saves.
COMPACT_MIN_ROWS_PER_INDEX = 2
COMPACT_MAX_ELEMENTS = 1 << 23


def embedding_dense_backward(grad: torch.Tensor, indices: torch.Tensor, num_weights: int,
                             padding_idx: int, scale_grad_by_freq: bool) -> torch.Tensor:
    """`aten.embedding_dense_backward`, summed into the rows the indices name alone.

    ATen's CUDA kernel sorts the indices (a radix sort over the table's index bits), then
    segments and scatters them: about 120 us for GPT-2's 50257x768 vocabulary and 4096
    tokens on an H200. Here each index is mapped to the first position that holds the same
    index (a scatter of positions with `amin`), the rows are summed into that position of
    an n x D float32 buffer (atomic adds: `index_add_`), and the sums, cast once, are
    written into the zeroed table at every position that names their row (duplicates write
    the same values). The table is written once in its own dtype, never in float32.

    ATen's op runs instead off CUDA, with `scale_grad_by_freq`, under
    `torch.use_deterministic_algorithms` (the atomic sums' order varies between runs), for
    tables with few rows per index and for many gradient elements (COMPACT_* above).
    """
    width = grad.shape[-1] if grad.dim() else 1
    if not compact_applies(grad.device, indices.numel(), num_weights, width,
                           scale_grad_by_freq):
        return aten.embedding_dense_backward(grad, indices, num_weights, padding_idx,
                                             scale_grad_by_freq)
    return compact_embedding_backward(grad, indices, num_weights, padding_idx)


def compact_applies(device: torch.device, n: int, num_weights: int, width: int,
                    scale_grad_by_freq: bool) -> bool:
    """Whether `embedding_dense_backward` of `n` indices into a `num_weights` x `width`
    table takes the compact algorithm."""
    return (device.type == "cuda" and not scale_grad_by_freq
            and not torch.are_deterministic_algorithms_enabled()
            and num_weights >= COMPACT_MIN_ROWS_PER_INDEX * n
            and n * width <= COMPACT_MAX_ELEMENTS)


def compact_embedding_backward(grad: torch.Tensor, indices: torch.Tensor, num_weights: int,
                               padding_idx: int) -> torch.Tensor:
    """The compact algorithm of `embedding_dense_backward`, on any device."""
    n = indices.numel()
    width = grad.shape[-1] if grad.dim() else 1
    table = torch.zeros((num_weights, width), dtype=grad.dtype, device=grad.device)
    if n == 0:
        return table
    flat = indices.reshape(n).long()
    rows = grad.reshape(n, width)
    positions = torch.arange(n, dtype=torch.long, device=grad.device)
    first = torch.full((num_weights,), n, dtype=torch.long, device=grad.device)
    first.scatter_reduce_(0, flat, positions, "amin")
    slot = first[flat]
    sums = torch.zeros((n, width), dtype=torch.float32, device=grad.device)
    sums.index_add_(0, slot, rows.float())
    table.index_put_((flat,), sums[slot].to(grad.dtype))
    if padding_idx >= 0:
        table[padding_idx].zero_()
    return table


class _Replaced:
    """A library function standing in for an ATen op in a graph's ATen call; generated
    launchers' comments name it."""

    def __init__(self, name: str, fn: Any) -> None:
        self.name, self.fn = name, fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"kiln.{self.name}"


_REPLACEMENTS = {aten.embedding_dense_backward.default:
                 _Replaced("embedding_dense_backward", embedding_dense_backward)}


def library_call(target: Any) -> Any:
    """What an ATen call of `target` runs: kiln's library function where it has one."""
    return _REPLACEMENTS.get(target, target)
