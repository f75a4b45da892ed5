"""Pointwise ops as Triton expressions: one output element from the same element of each
(broadcast) input, and generators (full, arange, ...) that read no input element.

`POINTWISE` maps an aten op to its rule: (writer, node, index, mask) -> the Triton
expression of the node's value at that index. Most rules are written over a `Call`, the
node with its operands already loaded at the index (`elementwise`).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
from torch import fx

from compiler.codegen.common import (
    Index,
    Unsupported,
    Var,
    broadcast_index,
    cast,
    compute_dtype,
    linear_expr,
    literal,
    paren,
    tl_dtype,
)
from compiler.codegen.writer import Writer
from compiler.ir import base_name, meta

PointwiseRule = Callable[[Writer, fx.Node, Index, str], str]

# ---- operands and casts --------------------------------------------------------------------


def promote(ops: list[object]) -> torch.dtype:
    """torch's type promotion over tensor operands (their dtypes) and Python scalars."""
    dtype: torch.dtype | None = None
    for op in ops:
        if isinstance(op, Var):
            dtype = op.dtype if dtype is None else torch.promote_types(dtype, op.dtype)
    for op in ops:
        if isinstance(op, float) and (dtype is None or not dtype.is_floating_point):
            dtype = torch.float32
        elif isinstance(op, int) and not isinstance(op, bool) and (dtype is None or dtype == torch.bool):
            dtype = torch.int64
    return dtype or torch.float32


def _round_to(expr: str, out: torch.dtype) -> str:
    """Value of `expr` (computed wider) rounded as a store to `out` would, kept wide."""
    if out in (torch.float16, torch.bfloat16):
        return f"{paren(expr)}.to({tl_dtype(out)}).to(tl.float32)"
    return expr


# ---- pointwise math ----------------------------------------------------------------------

# Only tl builtins: libdevice is an external library the Triton interpreter cannot run,
# and a kernel's source must be the same bytes wherever it is generated.
_UNARY_FLOAT = {
    "exp": "tl.exp({0})", "exp2": "tl.exp2({0})",
    "expm1": "tl.where(tl.abs({0}) < 1e-5, {0} + 0.5 * {0} * {0}, tl.exp({0}) - 1.0)",
    "log": "tl.log({0})", "log2": "tl.log2({0})", "log10": "tl.log({0}) * 0.4342944819032518",
    "log1p": "tl.where(tl.abs({0}) < 1e-4, {0} - 0.5 * {0} * {0}, tl.log(1.0 + {0}))",
    "sqrt": "tl.sqrt({0})", "rsqrt": "tl.rsqrt({0})", "sin": "tl.sin({0})", "cos": "tl.cos({0})",
    "tan": "tl.sin({0}) / tl.cos({0})",
    "sinh": "0.5 * (tl.exp({0}) - tl.exp(-{0}))", "cosh": "0.5 * (tl.exp({0}) + tl.exp(-{0}))",
    "tanh": "_kiln_tanh({0})",
    "asinh": "tl.where({0} < 0, -1.0, 1.0) * tl.log(tl.abs({0}) + tl.sqrt({0} * {0} + 1.0))",
    "acosh": "tl.log({0} + tl.sqrt({0} * {0} - 1.0))",
    "atanh": "0.5 * tl.log((1.0 + {0}) / (1.0 - {0}))",
    "sigmoid": "tl.sigmoid({0})", "erf": "tl.erf({0})", "erfc": "1.0 - tl.erf({0})",
    "reciprocal": "1.0 / {0}",
}
TANH_HELPER = ("@triton.jit\ndef _kiln_tanh(x):\n"
               "    # tanh from exp(-2|x|): no overflow, no external library\n"
               "    t = tl.exp(-2.0 * tl.abs(x))\n"
               "    r = (1.0 - t) / (1.0 + t)\n"
               "    return tl.where(x < 0, -r, r)\n")
_ROUNDING = {"floor": "tl.floor({0})", "ceil": "tl.ceil({0})",
             "trunc": "tl.where({0} < 0, tl.ceil({0}), tl.floor({0}))",
             "round": "_kiln_round({0})"}
ROUND_HELPER = ("@triton.jit\ndef _kiln_round(x):\n"
                "    # round half to even, as torch.round\n"
                "    r = tl.floor(x + 0.5)\n"
                "    return tl.where((r - x == 0.5) & (r % 2 != 0), r - 1.0, r)\n")
_COMPARE = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}
_LOGICAL = {"logical_and": "&", "logical_or": "|", "logical_xor": "^"}
_BITWISE = {"bitwise_and": "&", "bitwise_or": "|", "bitwise_xor": "^"}
def _trunc_div(a: str, b: str) -> str:
    return (f"tl.where((({a} - ({a} // {b}) * {b}) != 0) & ((({a} - ({a} // {b}) * {b}) < 0) "
            f"!= ({a} < 0)), {a} // {b} + 1, {a} // {b})")


def _floor_div(a: str, b: str) -> str:
    return (f"tl.where((({a} - ({a} // {b}) * {b}) != 0) & ((({a} - ({a} // {b}) * {b}) < 0) "
            f"!= ({b} < 0)), {a} // {b} - 1, {a} // {b})")


def _max_min(name: str, a: str, b: str, dtype: torch.dtype) -> str:
    fn = "tl.maximum" if name in ("maximum", "fmax") else "tl.minimum"
    if not dtype.is_floating_point:
        return f"{fn}({a}, {b})"
    if name in ("fmax", "fmin"):  # NaN only when both are NaN
        return f"tl.where({a} != {a}, {b}, tl.where({b} != {b}, {a}, {fn}({a}, {b})))"
    return f"tl.where({a} != {a}, {a}, tl.where({b} != {b}, {b}, {fn}({a}, {b})))"


def _float_pow(x: str, e: str) -> str:
    """x ** e from exp2/log2; negative bases take the sign of odd integer exponents."""
    mag = f"tl.exp2({e} * tl.log2(tl.abs({x})))"
    odd = f"(tl.floor({e}) == {e}) & (tl.floor({e} * 0.5) != {e} * 0.5)"
    neg = f"tl.where(tl.floor({e}) == {e}, tl.where({odd}, -{mag}, {mag}), float(\"nan\"))"
    return f"tl.where({e} == 0, 1.0, tl.where({x} < 0, {neg}, {mag}))"


def _pow(a: Var, e: object, cd: torch.dtype) -> str:
    x = cast(a, cd)
    if isinstance(e, (int, float)) and not isinstance(e, bool):
        if e == 0:
            return literal(1, cd)
        if e == 1:
            return x
        if e == 2:
            return f"{x} * {x}"
        if e == 3:
            return f"{x} * {x} * {x}"
        if e == 0.5 and cd.is_floating_point:
            return f"tl.sqrt({x})"
        if e == -0.5 and cd.is_floating_point:
            return f"tl.rsqrt({x})"
        if e == -1 and cd.is_floating_point:
            return f"1.0 / {x}"
        if cd.is_floating_point:
            return _float_pow(x, literal(e, cd))
        if isinstance(e, int) and 0 < e <= 8:
            return " * ".join([x] * e)
    if isinstance(e, Var) and cd.is_floating_point:
        return _float_pow(x, cast(e, cd))
    raise Unsupported(f"pow with exponent {e!r} on {cd}")


# ---- elementwise rules: the node's operands are loaded first ------------------------------


class Call:
    """A pointwise node at one index: its arguments (tensors loaded as `Var`s, scalars as
    they are), its output dtype and compute dtype."""

    def __init__(self, w: Writer, node: fx.Node, args: list[object]) -> None:
        self.w, self.node, self.args, self.kw = w, node, args, node.kwargs
        self.out = meta(node).dtype
        self.cd = compute_dtype(self.out)

    @property
    def name(self) -> str:
        return base_name(self.node)

    @property
    def operands(self) -> list[object]:
        """Tensor and number arguments: what type promotion sees."""
        return [a for a in self.args if isinstance(a, (Var, bool, int, float))]

    def c(self, i: int, dtype: torch.dtype | None = None) -> str:
        """Argument i cast to `dtype` (default: the compute dtype)."""
        return cast(self.args[i], self.cd if dtype is None else dtype)


def elementwise(rule: Callable[[Call], str]) -> PointwiseRule:
    """A rule over a `Call`: every argument is loaded at the index, in order, first."""
    def emit(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
        return rule(Call(w, node, [w.operand(a, node, idx, mask) for a in node.args]))
    return emit


def _copy_of(p: Call) -> str:
    src = p.args[0]
    if not isinstance(src, Var):
        raise Unsupported(f"{p.name} of a non-tensor")
    if src.dtype.is_complex or p.out.is_complex:
        raise Unsupported("complex")
    return _round_to(cast(src, p.cd), p.out)


def _copy(p: Call) -> str:
    return _round_to(p.c(1), p.out)


def _unary_float(template: str, p: Call) -> str:
    if not p.cd.is_floating_point:
        raise Unsupported(f"{p.name} producing {p.out}")
    if "_kiln_tanh" in template:
        p.w.helpers.add(TANH_HELPER)
    return template.format(p.c(0))


def _rounding(template: str, p: Call) -> str:
    if "decimals" in p.kw or len(p.args) > 1:
        raise Unsupported("round with decimals")
    if "_kiln_round" in template:
        p.w.helpers.add(ROUND_HELPER)
    return template.format(p.c(0)) if p.cd.is_floating_point else p.c(0)


def _frac(p: Call) -> str:
    return f"{p.c(0)} - {_ROUNDING['trunc'].format(p.c(0))}"


def _add_sub(p: Call) -> str:
    alpha = p.kw.get("alpha", 1)
    a, b = (p.c(1), p.c(0)) if p.name == "rsub" else (p.c(0), p.c(1))
    if alpha != 1:
        b = f"{b} * {literal(alpha, p.cd)}"
    if p.cd == torch.bool:
        return f"{a} | {b}"
    return f"{a} - {paren(b)}" if p.name in ("sub", "rsub") else f"{a} + {b}"


def _mul(p: Call) -> str:
    return f"{p.c(0)} & {p.c(1)}" if p.cd == torch.bool else f"{p.c(0)} * {p.c(1)}"


def _div(p: Call) -> str:
    mode = p.kw.get("rounding_mode")
    if mode is None:
        return f"{p.c(0)} / {paren(p.c(1))}"
    common = promote(p.operands)
    a, b = cast(p.args[0], common), cast(p.args[1], common)
    if common.is_floating_point:
        q = p.w.tmp(f"{a} / {paren(b)}")
        return f"tl.floor({q})" if mode == "floor" else _ROUNDING["trunc"].format(q)
    return (_floor_div if mode == "floor" else _trunc_div)(a, b)


def _floor_divide(p: Call) -> str:
    if p.cd.is_floating_point:
        return f"tl.floor({p.c(0)} / {paren(p.c(1))})"
    return _floor_div(p.c(0), p.c(1))


def _remainder(p: Call) -> str:
    a, b = p.c(0), p.c(1)
    if p.cd.is_floating_point:
        return f"{a} - tl.floor({a} / {paren(b)}) * {paren(b)}"
    return f"{a} - ({_floor_div(a, b)}) * {paren(b)}"


def _fmod(p: Call) -> str:
    a, b = p.c(0), p.c(1)
    if p.cd.is_floating_point:
        q = p.w.tmp(f"{a} / {paren(b)}")
        return f"{a} - {paren(_ROUNDING['trunc'].format(q))} * {paren(b)}"
    return f"{a} - ({_trunc_div(a, b)}) * {paren(b)}"


def _pow_rule(p: Call) -> str:
    if isinstance(p.args[0], Var):
        return _pow(p.args[0], p.args[1], p.cd)
    base = p.args[0]
    if isinstance(base, (int, float)) and p.cd.is_floating_point:
        if base == 2:
            return f"tl.exp2({p.c(1)})"
        return _float_pow(literal(base, p.cd), p.c(1))
    raise Unsupported("pow")


def _max_min_rule(p: Call) -> str:
    return _max_min(p.name, p.c(0), p.c(1), p.cd)


def _clamp(p: Call) -> str:
    args, kw, cd = p.args, p.kw, p.cd
    x = p.c(0)
    if p.name == "hardtanh":
        lo, hi = (args[1] if len(args) > 1 else kw.get("min_val", -1.0),
                  args[2] if len(args) > 2 else kw.get("max_val", 1.0))
    elif p.name == "clamp":
        lo = args[1] if len(args) > 1 else kw.get("min")
        hi = args[2] if len(args) > 2 else kw.get("max")
    elif p.name == "clamp_min":
        lo, hi = args[1], None
    else:
        lo, hi = None, args[1]
    if lo is not None:
        x = p.w.tmp(f"tl.where({x} < {cast(lo, cd)}, {cast(lo, cd)}, {x})")
    if hi is not None:
        x = f"tl.where({x} > {cast(hi, cd)}, {cast(hi, cd)}, {x})"
    return x


def _abs(p: Call) -> str:
    return f"tl.abs({p.c(0)})" if p.cd != torch.bool else p.c(0)


def _neg(p: Call) -> str:
    return f"-{paren(p.c(0))}"


def _sign(p: Call) -> str:
    x, cd = p.c(0), p.cd
    zero = f"{x} * 0" if cd.is_floating_point else literal(0, cd)
    return f"tl.where({x} > 0, {literal(1, cd)}, tl.where({x} < 0, {literal(-1, cd)}, {zero}))"


def _square(p: Call) -> str:
    return f"{p.c(0)} * {p.c(0)}"


def _lerp(p: Call) -> str:
    return f"{p.c(0)} + {p.c(2)} * ({p.c(1)} - {p.c(0)})"


def _addc(p: Call) -> str:
    value = p.kw.get("value", 1)
    op = "*" if p.name == "addcmul" else "/"
    return f"{p.c(0)} + {literal(value, p.cd)} * {p.c(1)} {op} {paren(p.c(2))}"


def _relu(p: Call) -> str:
    return f"tl.where({p.c(0)} < 0, {literal(0, p.cd)}, {p.c(0)})"


def _gelu(p: Call) -> str:
    x = p.c(0)
    if p.kw.get("approximate", "none") == "tanh":
        inner = f"0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})"
        p.w.helpers.add(TANH_HELPER)
        return f"0.5 * {x} * (1.0 + _kiln_tanh({inner}))"
    return f"0.5 * {x} * (1.0 + tl.erf({x} * 0.7071067811865476))"


def _gelu_backward(p: Call) -> str:
    if p.kw.get("approximate", "none") != "none":
        raise Unsupported("tanh gelu_backward")
    g, x = p.c(0), p.c(1)
    cdf = f"0.5 * (1.0 + tl.erf({x} * 0.7071067811865476))"
    pdf = f"tl.exp(-0.5 * {x} * {x}) * 0.3989422804014327"
    return f"{g} * ({cdf} + {x} * {pdf})"


def _silu(p: Call) -> str:
    return f"{p.c(0)} * tl.sigmoid({p.c(0)})"


def _silu_backward(p: Call) -> str:
    g, x = p.c(0), p.c(1)
    s = p.w.tmp(f"tl.sigmoid({x})")
    return f"{g} * {s} * (1.0 + {x} * (1.0 - {s}))"


def _leaky_relu(p: Call) -> str:
    slope = p.args[1] if len(p.args) > 1 else p.kw.get("negative_slope", 0.01)
    return f"tl.where({p.c(0)} > 0, {p.c(0)}, {p.c(0)} * {literal(slope, p.cd)})"


def _elu(p: Call) -> str:
    alpha, scale, iscale = (list(p.args[1:]) + [1.0, 1.0, 1.0])[:3]
    x, cd = p.c(0), p.cd
    return (f"tl.where({x} > 0, {x} * {literal(scale, cd)}, {literal(alpha * scale, cd)} * "
            f"(tl.exp({x} * {literal(iscale, cd)}) - 1.0))")


def _softplus(p: Call) -> str:
    beta, threshold = (list(p.args[1:]) + [1.0, 20.0])[:2]
    x, cd = p.c(0), p.cd
    return (f"tl.where({x} * {literal(beta, cd)} > {literal(threshold, cd)}, {x}, "
            f"tl.log(1.0 + tl.exp({x} * {literal(beta, cd)})) / {literal(beta, cd)})")


def _mish(p: Call) -> str:
    x = p.c(0)
    p.w.helpers.add(TANH_HELPER)
    return f"{x} * _kiln_tanh(tl.where({x} > 20.0, {x}, tl.log(1.0 + tl.exp({x}))))"


def _hardsigmoid(p: Call) -> str:
    return f"tl.minimum(tl.maximum({p.c(0)} / 6.0 + 0.5, 0.0), 1.0)"


def _hardswish(p: Call) -> str:
    x = p.c(0)
    return f"{x} * tl.minimum(tl.maximum({x} + 3.0, 0.0), 6.0) / 6.0"


def _sigmoid_backward(p: Call) -> str:
    return f"{p.c(0)} * {p.c(1)} * (1.0 - {p.c(1)})"


def _tanh_backward(p: Call) -> str:
    return f"{p.c(0)} * (1.0 - {p.c(1)} * {p.c(1)})"


def _threshold_backward(p: Call) -> str:
    common = promote([p.args[1], p.args[2]])
    return (f"tl.where({cast(p.args[1], common)} <= {cast(p.args[2], common)}, "
            f"{literal(0, p.cd)}, {p.c(0)})")


def _threshold(p: Call) -> str:
    return f"tl.where({p.c(0)} <= {p.c(1)}, {p.c(2)}, {p.c(0)})"


def _compare(op: str, p: Call) -> str:
    common = compute_dtype(promote(p.operands))
    return f"{cast(p.args[0], common)} {op} {cast(p.args[1], common)}"


def _logical(op: str, p: Call) -> str:
    return f"{p.c(0, torch.bool)} {op} {p.c(1, torch.bool)}"


def _logical_not(p: Call) -> str:
    return f"{p.c(0, torch.bool)} == 0"


def _bitwise(op: str, p: Call) -> str:
    if p.cd.is_floating_point:
        raise Unsupported("bitwise op on floats")
    return f"{p.c(0)} {op} {p.c(1)}"


def _bitwise_not(p: Call) -> str:
    return f"{p.c(0)} == 0" if p.cd == torch.bool else f"~{paren(p.c(0))}"


_FLOAT_CLASSES = {
    "isnan": "{0} != {0}",
    "isinf": "tl.abs({0}) == float(\"inf\")",
    "isfinite": "tl.abs({0}) < float(\"inf\")",
    "isneginf": "{0} == float(\"-inf\")",
    "isposinf": "{0} == float(\"inf\")",
    "signbit": "({0} < 0) | (({0} == 0) & (1.0 / {0} < 0))",
}


def _float_class(p: Call) -> str:
    src = p.args[0]
    if not isinstance(src, Var) or not src.dtype.is_floating_point:
        value = "1" if p.name == "isfinite" else "0"
        if p.name == "signbit" and isinstance(src, Var):
            return f"{src.name} < 0"
        return f"tl.full([], {value}, tl.int1)"
    return _FLOAT_CLASSES[p.name].format(src.name)


def _nan_to_num(p: Call) -> str:
    args, kw, cd = p.args, p.kw, p.cd
    if not cd.is_floating_point:
        return p.c(0)
    info = torch.finfo(p.out)
    nan = args[1] if len(args) > 1 and args[1] is not None else kw.get("nan", 0.0)
    posinf = args[2] if len(args) > 2 and args[2] is not None else kw.get("posinf") or info.max
    neginf = args[3] if len(args) > 3 and args[3] is not None else kw.get("neginf") or info.min
    x = p.c(0)
    return (f"tl.where({x} != {x}, {literal(nan or 0.0, cd)}, tl.where({x} == float(\"inf\"), "
            f"{literal(posinf, cd)}, tl.where({x} == float(\"-inf\"), {literal(neginf, cd)}, {x})))")


def _where(p: Call) -> str:
    return f"tl.where({p.c(0, torch.bool)}, {p.c(1)}, {p.c(2)})"


def _masked_fill(p: Call) -> str:
    return f"tl.where({p.c(1, torch.bool)}, {p.c(2)}, {p.c(0)})"


# ---- generators: a value from the index alone ---------------------------------------------


def _arange(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    cd = compute_dtype(meta(node).dtype)
    args, kw = node.args, node.kwargs
    if base_name(node) == "iota":
        start, step = kw.get("start", args[1] if len(args) > 1 else 0), kw.get("step", 1)
    elif len(args) == 1:
        start, step = 0, 1
    else:
        start, step = args[0], (args[2] if len(args) > 2 else kw.get("step", 1))
    pos = idx[0]
    expr = linear_expr(pos, step, start)
    return f"tl.full([], 0, {tl_dtype(cd)}) + ({expr})" if pos == "0" else f"({expr}).to({tl_dtype(cd)})"


def _fill_value(node: fx.Node) -> object:
    """The constant a `full`-like generator fills with."""
    name, args = base_name(node), node.args
    if name in ("full", "new_full"):
        return args[1] if name == "full" else args[2]
    if name in ("full_like", "fill"):
        return args[1]
    if name == "scalar_tensor":
        return args[0]
    return 1 if name in ("ones", "ones_like", "new_ones") else 0


def _full(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    cd = compute_dtype(meta(node).dtype)
    if base_name(node) == "fill" and isinstance(node.args[1], fx.Node):
        v = w.value(node.args[1], (), mask)
        return cast(Var(v, compute_dtype(meta(node.args[1]).dtype)), cd)
    value = _fill_value(node)
    if isinstance(value, fx.Node):
        raise Unsupported(f"{base_name(node)} with a tensor value")
    return f"tl.full([], {literal(value, cd)}, {tl_dtype(cd)})"


_ELEMENTWISE: dict[str, Callable[[Call], str]] = {
    # copies and casts
    **dict.fromkeys(("_to_copy", "convert_element_type", "clone", "detach", "positive",
                     "lift_fresh_copy", "_conj", "resolve_conj", "resolve_neg"), _copy_of),
    "copy": _copy,
    # arithmetic
    "add": _add_sub, "sub": _add_sub, "rsub": _add_sub, "mul": _mul, "div": _div,
    "floor_divide": _floor_divide, "remainder": _remainder, "fmod": _fmod, "pow": _pow_rule,
    **dict.fromkeys(("maximum", "minimum", "fmax", "fmin"), _max_min_rule),
    **dict.fromkeys(("clamp", "clamp_min", "clamp_max", "hardtanh"), _clamp),
    "abs": _abs, "neg": _neg, "sign": _sign, "sgn": _sign, "square": _square, "lerp": _lerp,
    "addcmul": _addc, "addcdiv": _addc,
    # transcendental and rounding
    **{name: partial(_unary_float, t) for name, t in _UNARY_FLOAT.items()},
    **{name: partial(_rounding, t) for name, t in _ROUNDING.items()},
    "frac": _frac,
    # activations and their gradients
    "relu": _relu, "gelu": _gelu, "gelu_backward": _gelu_backward, "silu": _silu,
    "silu_backward": _silu_backward, "leaky_relu": _leaky_relu, "elu": _elu,
    "softplus": _softplus, "mish": _mish, "hardsigmoid": _hardsigmoid, "hardswish": _hardswish,
    "sigmoid_backward": _sigmoid_backward, "tanh_backward": _tanh_backward,
    "threshold_backward": _threshold_backward, "threshold": _threshold,
    # comparisons and logic
    **{name: partial(_compare, op) for name, op in _COMPARE.items()},
    **{name: partial(_logical, op) for name, op in _LOGICAL.items()},
    "logical_not": _logical_not,
    **{name: partial(_bitwise, op) for name, op in _BITWISE.items()},
    "bitwise_not": _bitwise_not,
    **dict.fromkeys(_FLOAT_CLASSES, _float_class), "nan_to_num": _nan_to_num,
    # selection
    "where": _where, "masked_fill": _masked_fill,
}

_GENERATORS: dict[str, PointwiseRule] = {
    "arange": _arange, "iota": _arange,
    **dict.fromkeys(("full", "full_like", "scalar_tensor", "zeros", "ones", "zeros_like",
                     "ones_like", "empty_like", "empty", "new_zeros", "new_ones", "new_full",
                     "new_empty", "fill", "empty_strided", "empty_permuted",
                     "new_empty_strided"), _full),
}

POINTWISE: dict[str, PointwiseRule] = {
    **{name: elementwise(rule) for name, rule in _ELEMENTWISE.items()},
    **_GENERATORS,
}


# ---- what each rule reads, and what it refuses: metadata, no code emitted ------------------


def reads(node: fx.Node, idx: Index) -> list[tuple[fx.Node, Index]]:
    """Where the value of pointwise `node` at `idx` reads each input: an elementwise op its
    positional tensor arguments at the broadcast index (as `elementwise` loads them), a
    generator nothing but `fill`'s tensor value (one element)."""
    name = base_name(node)
    if name in _GENERATORS:
        value = node.args[1] if name == "fill" and len(node.args) > 1 else None
        return [(value, ())] if isinstance(value, fx.Node) else []
    shape = meta(node).shape
    return [(a, broadcast_index(idx, shape, meta(a).shape)) for a in node.args if isinstance(a, fx.Node)]


def refusal(node: fx.Node) -> str | None:
    """Why pointwise `node` cannot be computed in a kernel (an ATen call computes it), or
    None: each rule's `Unsupported` cases, read from the node's arguments and metadata."""
    name = base_name(node)
    out = meta(node)
    if name in _GENERATORS:
        return _generator_refusal(node, compute_dtype(out.dtype))
    for a in node.args:
        if isinstance(a, fx.Node) and len(meta(a).shape) > len(out.shape):
            return f"cannot broadcast {meta(a).shape} to {out.shape}"
    special = _REFUSALS.get(name)
    reason = special(node) if special is not None else None
    return reason or _scalar_refusal(node)


def _operand_dtypes(node: fx.Node) -> list[object]:
    """The node's positional operands as type promotion sees them (tensors as `Var`s)."""
    return [Var("", compute_dtype(meta(a).dtype)) if isinstance(a, fx.Node) else a
            for a in node.args if isinstance(a, (fx.Node, bool, int, float))]


def _scalar_refusal(node: fx.Node) -> str | None:
    """An integer constant that does not fit the integer dtype it is cast to (`literal`)."""
    scalars = [a for a in (*node.args, node.kwargs.get("alpha"), node.kwargs.get("value"))
               if isinstance(a, int) and not isinstance(a, bool)]
    if not scalars:
        return None
    targets = {compute_dtype(meta(node).dtype), compute_dtype(promote(_operand_dtypes(node)))}
    for dtype in targets:
        if dtype.is_floating_point or dtype == torch.bool:
            continue
        info = torch.iinfo(dtype)
        if any(not info.min <= v <= info.max for v in scalars):
            return f"an integer constant does not fit {dtype}"
    return None


def _generator_refusal(node: fx.Node, cd: torch.dtype) -> str | None:
    if base_name(node) in ("arange", "iota") or base_name(node) == "fill" and isinstance(node.args[1], fx.Node):
        return None
    value = _fill_value(node)
    if isinstance(value, fx.Node):
        return f"{base_name(node)} with a tensor value"
    if isinstance(value, int) and not isinstance(value, bool) and not cd.is_floating_point \
            and cd != torch.bool and not torch.iinfo(cd).min <= value <= torch.iinfo(cd).max:
        return f"an integer constant does not fit {cd}"
    return None


def _cd(node: fx.Node) -> torch.dtype:
    return compute_dtype(meta(node).dtype)


def _copy_refusal(node: fx.Node) -> str | None:
    return None if isinstance(node.args[0], fx.Node) else f"{base_name(node)} of a non-tensor"


def _float_refusal(node: fx.Node) -> str | None:
    return None if _cd(node).is_floating_point else f"{base_name(node)} producing {meta(node).dtype}"


def _rounding_refusal(node: fx.Node) -> str | None:
    return "round with decimals" if "decimals" in node.kwargs or len(node.args) > 1 else None


def _pow_refusal(node: fx.Node) -> str | None:
    base, e = node.args[0], node.args[1]
    cd = _cd(node)
    if not isinstance(base, fx.Node):
        ok = isinstance(base, (int, float)) and cd.is_floating_point
    elif isinstance(e, (int, float)) and not isinstance(e, bool):
        ok = e in (0, 1, 2, 3) or cd.is_floating_point or isinstance(e, int) and 0 < e <= 8
    else:
        ok = isinstance(e, fx.Node) and cd.is_floating_point
    return None if ok else f"pow with exponent {e!r} on {cd}"


def _bitwise_refusal(node: fx.Node) -> str | None:
    return "bitwise op on floats" if _cd(node).is_floating_point else None


def _gelu_backward_refusal(node: fx.Node) -> str | None:
    return "tanh gelu_backward" if node.kwargs.get("approximate", "none") != "none" else None


def _sign_refusal(node: fx.Node) -> str | None:  # -1 has no unsigned literal
    return "an integer constant does not fit torch.uint8" if _cd(node) == torch.uint8 else None


# Each op's own `Unsupported` cases (beyond broadcasting and integer constants), by name.
_REFUSALS: dict[str, Callable[[fx.Node], str | None]] = {
    **{name: _copy_refusal for name, rule in _ELEMENTWISE.items() if rule is _copy_of},
    **dict.fromkeys(_UNARY_FLOAT, _float_refusal), **dict.fromkeys(_ROUNDING, _rounding_refusal),
    **dict.fromkeys(_BITWISE, _bitwise_refusal), "pow": _pow_refusal,
    "gelu_backward": _gelu_backward_refusal, "sign": _sign_refusal, "sgn": _sign_refusal,
}
