"""Triton expressions for pointwise ops, views and index ops (see `evaluate`)."""

from __future__ import annotations

import torch
from torch import fx

from compiler.codegen.common import (
    Index,
    Unsupported,
    Var,
    Writer,
    cast,
    compute_dtype,
    literal,
    paren,
    tl_dtype,
)
from compiler.codegen.indexing import INDEX_OPS, index_op, is_view, linear_expr, view_source
from compiler.ir import meta
from compiler.ops import base_name

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
_COPIES = frozenset({"_to_copy", "convert_element_type", "clone", "alias", "detach", "positive",
                     "lift_fresh_copy", "_conj", "resolve_conj", "resolve_neg"})
_GENERATORS = frozenset({"full", "full_like", "scalar_tensor", "zeros", "ones", "zeros_like",
                         "ones_like", "empty_like", "empty", "new_zeros", "new_ones", "new_full",
                         "new_empty", "fill", "empty_strided", "empty_permuted", "arange", "iota",
                         "new_empty_strided"})


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


def _pointwise(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    name = base_name(node)
    out = meta(node).dtype
    cd = compute_dtype(out)
    args = [w.operand(a, node, idx, mask) for a in node.args]
    kw = node.kwargs
    ops = [a for a in args if isinstance(a, (Var, bool, int, float))]

    def c(i: int, dtype: torch.dtype = cd) -> str:
        return cast(args[i], dtype)

    if name in _COPIES:
        src = args[0]
        if not isinstance(src, Var):
            raise Unsupported(f"{name} of a non-tensor")
        if src.dtype.is_complex or out.is_complex:
            raise Unsupported("complex")
        return _round_to(cast(src, cd), out)
    if name == "copy":
        return _round_to(c(1), out)
    if name in _UNARY_FLOAT:
        if not cd.is_floating_point:
            raise Unsupported(f"{name} producing {out}")
        if name == "tanh":
            w.helpers.add(TANH_HELPER)
        return _UNARY_FLOAT[name].format(c(0))
    if name in _ROUNDING:
        if "decimals" in kw or len(args) > 1:
            raise Unsupported("round with decimals")
        if name == "round":
            w.helpers.add(ROUND_HELPER)
        return _ROUNDING[name].format(c(0)) if cd.is_floating_point else c(0)
    if name == "frac":
        return f"{c(0)} - {_ROUNDING['trunc'].format(c(0))}"
    if name in ("add", "sub", "rsub"):
        alpha = kw.get("alpha", 1)
        a, b = (c(1), c(0)) if name == "rsub" else (c(0), c(1))
        if alpha != 1:
            b = f"{b} * {literal(alpha, cd)}"
        if cd == torch.bool:
            return f"{a} | {b}"
        return f"{a} - {paren(b)}" if name in ("sub", "rsub") else f"{a} + {b}"
    if name == "mul":
        return f"{c(0)} & {c(1)}" if cd == torch.bool else f"{c(0)} * {c(1)}"
    if name == "div":
        mode = kw.get("rounding_mode")
        if mode is None:
            return f"{c(0)} / {paren(c(1))}"
        common = promote(ops)
        a, b = cast(args[0], common), cast(args[1], common)
        if common.is_floating_point:
            q = w.tmp(f"{a} / {paren(b)}")
            return f"tl.floor({q})" if mode == "floor" else _ROUNDING["trunc"].format(q)
        return (_floor_div if mode == "floor" else _trunc_div)(a, b)
    if name == "floor_divide":
        if cd.is_floating_point:
            return f"tl.floor({c(0)} / {paren(c(1))})"
        return _floor_div(c(0), c(1))
    if name == "remainder":
        a, b = c(0), c(1)
        if cd.is_floating_point:
            return f"{a} - tl.floor({a} / {paren(b)}) * {paren(b)}"
        return f"{a} - ({_floor_div(a, b)}) * {paren(b)}"
    if name == "fmod":
        a, b = c(0), c(1)
        if cd.is_floating_point:
            q = w.tmp(f"{a} / {paren(b)}")
            return f"{a} - {paren(_ROUNDING['trunc'].format(q))} * {paren(b)}"
        return f"{a} - ({_trunc_div(a, b)}) * {paren(b)}"
    if name == "pow":
        if isinstance(args[0], Var):
            return _pow(args[0], args[1], cd)
        base = args[0]
        if isinstance(base, (int, float)) and cd.is_floating_point:
            if base == 2:
                return f"tl.exp2({c(1)})"
            return _float_pow(literal(base, cd), c(1))
        raise Unsupported("pow")
    if name in ("maximum", "minimum", "fmax", "fmin"):
        return _max_min(name, c(0), c(1), cd)
    if name in ("clamp", "clamp_min", "clamp_max", "hardtanh"):
        x = c(0)
        if name == "hardtanh":
            lo, hi = (args[1] if len(args) > 1 else kw.get("min_val", -1.0),
                      args[2] if len(args) > 2 else kw.get("max_val", 1.0))
        elif name == "clamp":
            lo = args[1] if len(args) > 1 else kw.get("min")
            hi = args[2] if len(args) > 2 else kw.get("max")
        elif name == "clamp_min":
            lo, hi = args[1], None
        else:
            lo, hi = None, args[1]
        if lo is not None:
            x = w.tmp(f"tl.where({x} < {cast(lo, cd)}, {cast(lo, cd)}, {x})")
        if hi is not None:
            x = f"tl.where({x} > {cast(hi, cd)}, {cast(hi, cd)}, {x})"
        return x
    if name in ("abs",):
        return f"tl.abs({c(0)})" if cd != torch.bool else c(0)
    if name == "neg":
        return f"-{paren(c(0))}"
    if name in ("sign", "sgn"):
        x = c(0)
        zero = f"{x} * 0" if cd.is_floating_point else literal(0, cd)
        return f"tl.where({x} > 0, {literal(1, cd)}, tl.where({x} < 0, {literal(-1, cd)}, {zero}))"
    if name == "square":
        return f"{c(0)} * {c(0)}"
    if name == "lerp":
        return f"{c(0)} + {c(2)} * ({c(1)} - {c(0)})"
    if name in ("addcmul", "addcdiv"):
        value = kw.get("value", 1)
        op = "*" if name == "addcmul" else "/"
        return f"{c(0)} + {literal(value, cd)} * {c(1)} {op} {paren(c(2))}"
    if name == "relu":
        return f"tl.where({c(0)} < 0, {literal(0, cd)}, {c(0)})"
    if name == "gelu":
        x = c(0)
        if kw.get("approximate", "none") == "tanh":
            inner = f"0.7978845608028654 * ({x} + 0.044715 * {x} * {x} * {x})"
            w.helpers.add(TANH_HELPER)
            return f"0.5 * {x} * (1.0 + _kiln_tanh({inner}))"
        return f"0.5 * {x} * (1.0 + tl.erf({x} * 0.7071067811865476))"
    if name == "gelu_backward":
        if kw.get("approximate", "none") != "none":
            raise Unsupported("tanh gelu_backward")
        g, x = c(0), c(1)
        cdf = f"0.5 * (1.0 + tl.erf({x} * 0.7071067811865476))"
        pdf = f"tl.exp(-0.5 * {x} * {x}) * 0.3989422804014327"
        return f"{g} * ({cdf} + {x} * {pdf})"
    if name == "silu":
        return f"{c(0)} * tl.sigmoid({c(0)})"
    if name == "silu_backward":
        g, x = c(0), c(1)
        s = w.tmp(f"tl.sigmoid({x})")
        return f"{g} * {s} * (1.0 + {x} * (1.0 - {s}))"
    if name == "leaky_relu":
        slope = args[1] if len(args) > 1 else kw.get("negative_slope", 0.01)
        return f"tl.where({c(0)} > 0, {c(0)}, {c(0)} * {literal(slope, cd)})"
    if name == "elu":
        alpha, scale, iscale = (list(args[1:]) + [1.0, 1.0, 1.0])[:3]
        x = c(0)
        return (f"tl.where({x} > 0, {x} * {literal(scale, cd)}, {literal(alpha * scale, cd)} * "
                f"(tl.exp({x} * {literal(iscale, cd)}) - 1.0))")
    if name == "softplus":
        beta, threshold = (list(args[1:]) + [1.0, 20.0])[:2]
        x = c(0)
        return (f"tl.where({x} * {literal(beta, cd)} > {literal(threshold, cd)}, {x}, "
                f"tl.log(1.0 + tl.exp({x} * {literal(beta, cd)})) / {literal(beta, cd)})")
    if name == "mish":
        x = c(0)
        w.helpers.add(TANH_HELPER)
        return f"{x} * _kiln_tanh(tl.where({x} > 20.0, {x}, tl.log(1.0 + tl.exp({x}))))"
    if name == "hardsigmoid":
        x = c(0)
        return f"tl.minimum(tl.maximum({x} / 6.0 + 0.5, 0.0), 1.0)"
    if name == "hardswish":
        x = c(0)
        return f"{x} * tl.minimum(tl.maximum({x} + 3.0, 0.0), 6.0) / 6.0"
    if name == "sigmoid_backward":
        return f"{c(0)} * {c(1)} * (1.0 - {c(1)})"
    if name == "tanh_backward":
        return f"{c(0)} * (1.0 - {c(1)} * {c(1)})"
    if name == "threshold_backward":
        common = promote([args[1], args[2]])
        return f"tl.where({cast(args[1], common)} <= {cast(args[2], common)}, {literal(0, cd)}, {c(0)})"
    if name == "threshold":
        return f"tl.where({c(0)} <= {c(1)}, {c(2)}, {c(0)})"
    if name in _COMPARE:
        common = compute_dtype(promote(ops))
        return f"{cast(args[0], common)} {_COMPARE[name]} {cast(args[1], common)}"
    if name in _LOGICAL:
        return f"{c(0, torch.bool)} {_LOGICAL[name]} {c(1, torch.bool)}"
    if name == "logical_not":
        return f"{c(0, torch.bool)} == 0"
    if name in _BITWISE:
        if cd.is_floating_point:
            raise Unsupported("bitwise op on floats")
        return f"{c(0)} {_BITWISE[name]} {c(1)}"
    if name == "bitwise_not":
        return f"{c(0)} == 0" if cd == torch.bool else f"~{paren(c(0))}"
    if name in ("isnan", "isinf", "isfinite", "isneginf", "isposinf", "signbit"):
        src = args[0]
        if not isinstance(src, Var) or not src.dtype.is_floating_point:
            value = "1" if name == "isfinite" else "0"
            if name == "signbit" and isinstance(src, Var):
                return f"{src.name} < 0"
            return f"tl.full([], {value}, tl.int1)"
        x = src.name
        return {
            "isnan": f"{x} != {x}",
            "isinf": f"tl.abs({x}) == float(\"inf\")",
            "isfinite": f"tl.abs({x}) < float(\"inf\")",
            "isneginf": f"{x} == float(\"-inf\")",
            "isposinf": f"{x} == float(\"inf\")",
            "signbit": f"({x} < 0) | (({x} == 0) & (1.0 / {x} < 0))",
        }[name]
    if name == "nan_to_num":
        if not cd.is_floating_point:
            return c(0)
        info = torch.finfo(out)
        nan = args[1] if len(args) > 1 and args[1] is not None else kw.get("nan", 0.0)
        posinf = args[2] if len(args) > 2 and args[2] is not None else kw.get("posinf") or info.max
        neginf = args[3] if len(args) > 3 and args[3] is not None else kw.get("neginf") or info.min
        x = c(0)
        return (f"tl.where({x} != {x}, {literal(nan or 0.0, cd)}, tl.where({x} == float(\"inf\"), "
                f"{literal(posinf, cd)}, tl.where({x} == float(\"-inf\"), {literal(neginf, cd)}, {x})))")
    if name == "where":
        return f"tl.where({c(0, torch.bool)}, {c(1)}, {c(2)})"
    if name == "masked_fill":
        return f"tl.where({c(1, torch.bool)}, {c(2)}, {c(0)})"
    raise Unsupported(f"no Triton lowering for {name}")


def _generator(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    name = base_name(node)
    cd = compute_dtype(meta(node).dtype)
    args, kw = node.args, node.kwargs
    if name in ("arange", "iota"):
        if name == "iota":
            start, step = kw.get("start", args[1] if len(args) > 1 else 0), kw.get("step", 1)
        elif len(args) == 1:
            start, step = 0, 1
        else:
            start, step = args[0], (args[2] if len(args) > 2 else kw.get("step", 1))
        pos = idx[0]
        expr = linear_expr(pos, step, start)
        return f"tl.full([], 0, {tl_dtype(cd)}) + ({expr})" if pos == "0" else f"({expr}).to({tl_dtype(cd)})"
    if name in ("fill",) and isinstance(args[1], fx.Node):
        v = w.value(args[1], (), mask)
        return cast(Var(v, compute_dtype(meta(args[1]).dtype)), cd)
    if name in ("full", "new_full"):
        value = args[1] if name == "full" else args[2]
    elif name in ("full_like", "fill"):
        value = args[1]
    elif name == "scalar_tensor":
        value = args[0]
    elif name in ("ones", "ones_like", "new_ones"):
        value = 1
    else:
        value = 0
    if isinstance(value, fx.Node):
        raise Unsupported(f"{name} with a tensor value")
    return f"tl.full([], {literal(value, cd)}, {tl_dtype(cd)})"


def evaluate(w: Writer, node: fx.Node, idx: Index, mask: str) -> str:
    """Emit the computation of `node` at `idx`; returns the variable holding it."""
    if node.op != "call_function":
        raise Unsupported(f"{node.name} is not computed in kernels")
    out = meta(node)
    if out.dtype.is_complex:
        raise Unsupported("complex values")
    tl_dtype(out.dtype)
    name = base_name(node)
    if is_view(node):
        src, sidx = view_source(node, idx)
        return w.value(src, sidx, mask)
    if name in INDEX_OPS:
        return w.tmp(index_op(w, node, idx, mask))
    if name in _GENERATORS:
        return w.tmp(_generator(w, node, idx, mask))
    return w.tmp(_pointwise(w, node, idx, mask))
