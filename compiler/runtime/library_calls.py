"""Library calls that are no single ATen op: what a kernel kind runs instead of a kernel."""

from __future__ import annotations

import torch

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
