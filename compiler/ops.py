"""Which aten ops kiln lowers to Triton, by kind. Everything else is an ATen call."""

from __future__ import annotations

import operator

import torch
from torch import fx

# ---- pointwise: one output element from the same element of each (broadcast) input ----
POINTWISE = frozenset({
    # arithmetic
    "add", "sub", "rsub", "mul", "div", "neg", "abs", "reciprocal", "pow", "remainder", "fmod",
    "floor_divide", "maximum", "minimum", "fmax", "fmin", "clamp", "clamp_min", "clamp_max",
    "sign", "sgn", "square", "lerp", "addcmul", "addcdiv",
    # transcendental
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "sin", "cos",
    "tan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
    "sigmoid", "erf", "erfc", "floor", "ceil", "trunc", "round", "frac",
    # activations and their gradients
    "relu", "gelu", "silu", "hardtanh", "leaky_relu", "elu", "softplus", "mish", "hardsigmoid",
    "hardswish", "sigmoid_backward", "tanh_backward", "threshold_backward", "gelu_backward",
    "silu_backward", "threshold",
    # comparisons and logic
    "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
    "logical_not", "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_not", "isnan",
    "isinf", "isfinite", "isneginf", "isposinf", "signbit", "nan_to_num",
    # selection, casts, copies
    "where", "masked_fill", "_to_copy", "convert_element_type", "clone", "copy", "alias",
    "lift_fresh_copy", "detach", "positive", "_conj", "resolve_conj", "resolve_neg",
    # generators (no tensor input, or only a shape from one)
    "full", "full_like", "scalar_tensor", "zeros", "ones", "zeros_like", "ones_like",
    "empty_like", "empty", "fill", "new_zeros", "new_ones", "new_full", "new_empty",
    "arange", "iota", "empty_strided", "empty_permuted", "new_empty_strided",
})

# ---- views: index arithmetic over their input, no copy ----
VIEWS = frozenset({
    "view", "reshape", "_unsafe_view", "permute", "t", "transpose", "expand", "unsqueeze",
    "squeeze", "slice", "select", "alias", "numpy_T", "view_as", "expand_as",
    "split", "split_with_sizes", "unbind", "getitem",
})

# ---- index ops: loads at computed positions (gather, padding, concatenation) ----
INDEXING = frozenset({
    "gather", "index_select", "embedding", "cat", "constant_pad_nd", "index", "slice_scatter",
    "select_scatter", "flip",
})

# ---- reductions over a set of dims ----
REDUCTIONS = frozenset({
    "sum", "mean", "amax", "amin", "max", "min", "argmax", "argmin", "prod", "any", "all",
    "var", "std", "var_mean", "logsumexp",
})

MATMULS = frozenset({"mm", "addmm", "bmm"})

# Ops whose results are random or data-dependent in shape: always ATen calls.
NEVER_LOWER = frozenset({
    "rand", "rand_like", "randn", "randn_like", "randint", "randint_like", "bernoulli",
    "native_dropout", "uniform", "normal", "randperm", "nonzero", "unique", "sort", "topk",
    "multinomial", "item", "_local_scalar_dense",
})


def op_name(node: fx.Node) -> str:
    """`aten.add.Tensor` style name of a call_function node's target."""
    target = node.target
    if target is operator.getitem:
        return "operator.getitem"
    if isinstance(target, torch._ops.OpOverload):
        ns = target.namespace
        return f"{ns}.{target._opname}.{target._overloadname}"
    return getattr(target, "__name__", str(target))


def base_name(node: fx.Node) -> str:
    """The op's name without namespace and overload: `add` for `aten.add.Tensor`."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return target._opname
    return getattr(target, "__name__", str(target))
