"""Verification: a candidate's outputs against the rebuilt aten graph's, before its time counts.

The reference is `graph.to_fx()` run on `compiler.random_inputs(graph, seed)` (index inputs
drawn inside their valid ranges). Inputs are restored from pristine copies before every run,
so in-place ops and aliased outputs see the same starting values each time; the RNG state is
saved once and restored before every run, so random ops (dropout, run as ATen calls) draw
the same numbers for the reference and for every candidate.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from tuner.exact import Slack, exact_output_slack

# Per dtype: relative error of the whole tensor (||out - ref|| / ||ref||), and an element
# bound |out - ref| <= rtol * |ref| + atol * max|ref| that catches a few wrong elements the
# norm would average away. fp32 allows tf32 dots (Triton's default for fp32 tl.dot).
TOLERANCES: dict[torch.dtype, tuple[float, float, float]] = {
    torch.float64: (1e-7, 1e-6, 1e-7),
    torch.float32: (2e-3, 2e-2, 2e-3),
    torch.float16: (5e-3, 2e-2, 5e-3),
    torch.bfloat16: (2e-2, 6e-2, 2e-2),
}


# A candidate may be this many times further from the float64 result than eager is.
FP64_MULTIPLIER = 3.0


def tolerance(dtype: torch.dtype) -> tuple[float, float, float]:
    """(norm, rtol, atol-fraction) for a floating dtype; exact (zeros) for the others."""
    return TOLERANCES.get(dtype, (0.0, 0.0, 0.0))


def mismatch(out: Any, ref: Any, where: str = "output") -> str | None:
    """Why `out` does not match `ref` (dtype-aware), or None when it does."""
    if ref is None or out is None:
        return (
            None
            if out is ref
            else f"{where}: expected {type(ref).__name__}, got {type(out).__name__}"
        )
    if not isinstance(ref, torch.Tensor):
        return None if out == ref else f"{where}: expected {ref!r}, got {out!r}"
    if not isinstance(out, torch.Tensor):
        return f"{where}: expected a tensor, got {type(out).__name__}"
    if tuple(out.shape) != tuple(ref.shape):
        return f"{where}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    if out.dtype != ref.dtype:
        return f"{where}: dtype {out.dtype} != {ref.dtype}"
    if out.numel() == 0:
        return None
    # Compared where the reference lives: on a GPU that is far faster than a host copy.
    r = ref.detach()
    o = out.detach().to(r.device)
    if not (r.is_floating_point() or r.is_complex()):
        bad = int((o != r).sum())
        return None if bad == 0 else f"{where}: {bad} of {r.numel()} elements differ (exact dtype)"
    o64, r64 = o.double(), r.double()
    nan_ref, nan_out = torch.isnan(r64), torch.isnan(o64)
    if not torch.equal(nan_ref, nan_out):
        return f"{where}: NaN in {int((nan_ref ^ nan_out).sum())} elements where the reference has none (or the reverse)"
    finite = torch.isfinite(r64)
    if not torch.equal(o64[~finite & ~nan_ref], r64[~finite & ~nan_ref]) or \
            not bool(torch.isfinite(o64[finite]).all()):
        return f"{where}: infinities differ from the reference"
    o64, r64 = o64[finite], r64[finite]
    if r64.numel() == 0:
        return None
    norm_tol, rtol, atol_frac = tolerance(r.dtype)
    diff = (o64 - r64).abs()
    ref_norm = float(r64.norm())
    rel = float(diff.norm()) / max(ref_norm, 1e-30)
    if rel > norm_tol and float(diff.max()) > 0:
        return f"{where}: relative error {rel:.3g} exceeds {norm_tol:g} for {r.dtype}"
    bound = rtol * r64.abs() + atol_frac * float(r64.abs().max()) + 1e-30
    bad = int((diff > bound).sum())
    if bad:
        worst = float(diff.max())
        return (
            f"{where}: {bad} of {r64.numel()} elements off (max abs error {worst:.3g}, {r.dtype})"
        )
    return None


def _clone(t: Any) -> Any:
    if not isinstance(t, torch.Tensor):
        return t
    out = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def _rng_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def _set_rng_state(state: tuple[torch.Tensor, torch.Tensor | None], device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


@dataclass
class Reference:
    """Seeded inputs, their pristine copies, the RNG state and the aten graph's outputs."""

    inputs: list[Any]
    pristine: list[Any]
    outputs: list[Any]
    mutated_after: list[Any]  # every input's value after the reference run
    rng: tuple[torch.Tensor, torch.Tensor | None]
    device: torch.device
    outputs64: list[Any] | None = None  # the same graph on float64 inputs, when it runs
    baseline: list[Any] | None = None  # the heuristic build's outputs (see adopt_baseline)
    baseline_misses: dict[int, str] = field(default_factory=dict)  # where it missed eager, why
    unchecked: dict[int, str] = field(default_factory=dict)  # output index -> why not compared
    slack: dict[int, Slack] = field(default_factory=dict)  # exact outputs' forgivable flips
    rule: str = "eager"  # which rule passed the last check: eager|float64|threshold|baseline

    @classmethod
    def compute(cls, graph: Any, seed: int = 0, device: str = "cpu") -> Reference:
        """Run the rebuilt aten graph once on seeded random inputs and keep what it gave."""
        import compiler

        inputs = list(compiler.random_inputs(graph, seed=seed, device=device))
        return cls.from_module(graph.to_fx().to(torch.device(device)), inputs, seed)

    @classmethod
    def from_module(cls, module: Callable[..., Any], inputs: list[Any], seed: int = 0) -> Reference:
        """The reference of any runnable aten module on given inputs (they become the live ones)."""
        tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
        dev = tensors[0].device if tensors else torch.device("cpu")
        pristine = [_clone(t) for t in inputs]
        torch.manual_seed(seed)
        rng = _rng_state(dev)
        with torch.no_grad():
            out = module(*inputs)
        outputs = [_clone(o) for o in _as_list(out)]
        mutated_after = [_clone(t) for t in inputs]
        ref = cls(inputs, pristine, outputs, mutated_after, rng, dev)
        ref.unchecked = unchecked_outputs(module)
        ref.restore()
        ref.outputs64 = _float64_outputs(module, ref)
        ref.restore()
        torch.manual_seed(seed)
        ref.slack = exact_output_slack(module, ref.inputs, tolerance)
        ref.restore()
        return ref

    def restore(self) -> None:
        """Put the inputs and the RNG back to where the reference started."""
        for live, saved in zip(self.inputs, self.pristine, strict=True):
            if isinstance(live, torch.Tensor):
                live.copy_(saved)
        _set_rng_state(self.rng, self.device)

    def check(self, run: Callable[..., Any]) -> str | None:
        """Run `run(*inputs)` from the reference's starting state; the first mismatch, or None."""
        self.restore()
        with torch.no_grad():
            got = _as_list(run(*self.inputs))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        if len(got) != len(self.outputs):
            return f"returned {len(got)} outputs, the graph has {len(self.outputs)}"
        self.rule = "eager"
        for i, (o, r) in enumerate(zip(got, self.outputs, strict=True)):
            reason = None if i in self.unchecked else mismatch(o, r, f"output {i}")
            if not reason:
                continue
            if self._flips_at_thresholds(i, o, r, reason):
                self.rule = "threshold" if self.rule == "eager" else self.rule
            elif self._closer_to_float64(i, o, r, reason) or self._overflow_as_float64(i, o, reason):
                self.rule = "float64" if self.rule in ("eager", "threshold") else self.rule
            elif self._like_baseline(i, o, r, reason):
                self.rule = "baseline"
            else:
                return reason
        for i, (live, after) in enumerate(zip(self.inputs, self.mutated_after, strict=True)):
            if isinstance(after, torch.Tensor):
                reason = mismatch(live, after, f"input {i} after the run (in-place)")
                if reason:
                    return reason
        return None

    def adopt_baseline(self, run: Callable[..., Any]) -> str | None:
        """Check the heuristic build and keep its outputs as a second reference.

        Where the heuristic misses eager, a candidate (the same graph with one kernel's
        variant or block sizes changed) is judged against the heuristic build instead: it
        must reproduce the heuristic's outputs, so tuning never makes a graph less right
        than the schedule clients already run, and one kernel's miss never blocks the
        tuning of the others. Returns the heuristic's first miss (to record), or None."""
        first = self.check(run)
        if first is None:
            return None
        self.restore()
        with torch.no_grad():
            got = [_clone(o) for o in _as_list(run(*self.inputs))]
        self.restore()
        if len(got) != len(self.outputs):
            return first  # not even the same outputs: nothing to compare candidates with
        for i, (o, r) in enumerate(zip(got, self.outputs, strict=True)):
            reason = None if i in self.unchecked else mismatch(o, r, f"output {i}")
            if reason and not self._flips_at_thresholds(i, o, r, reason):
                self.baseline_misses[i] = reason
        self.baseline = got
        return first

    def _like_baseline(self, i: int, out: Any, ref: Any, reason: str) -> bool:
        """`out` reproduces the heuristic build's output: within tolerance of it where the
        heuristic itself missed eager; elsewhere (a tolerance miss the heuristic shares)
        matching it and no further from eager than FP64_MULTIPLIER times the heuristic is."""
        if self.baseline is None:
            return False
        base = self.baseline[i]
        if not isinstance(base, torch.Tensor):
            return False
        if i in self.baseline_misses:
            again = mismatch(out, base)
            return again is None or self._flips_at_thresholds(i, out, base, again)
        if not _is_tolerance_miss(reason) or mismatch(out, base) is not None:
            return False
        r = ref.double()
        return _no_worse(out.detach().to(ref.device).double() - r, base.double() - r, r)

    def _flips_at_thresholds(self, i: int, out: Any, ref: Any, reason: str) -> bool:
        """An exact output (a mask, an argmax) that differs only where its float inputs sit
        within rounding of the threshold, or of a tie (tuner/exact.py)."""
        slack = self.slack.get(i)
        return slack is not None and "exact dtype" in reason and isinstance(out, torch.Tensor) \
            and slack.forgives(out, ref)

    def _overflow_as_float64(self, i: int, out: Any, reason: str) -> bool:
        """Infinities or NaN that differ from eager's, where eager's low-precision arithmetic
        overflowed (or did not): judged against the float64 run rounded to the output dtype,
        which overflows exactly where the true value does."""
        if self.outputs64 is None or not ("infinities" in reason or "NaN" in reason):
            return False
        r64 = self.outputs64[i]
        if not (isinstance(r64, torch.Tensor) and r64.is_floating_point()
                and isinstance(out, torch.Tensor) and out.is_floating_point()):
            return False
        rounded = r64.to(out.device).to(out.dtype)
        return mismatch(out, rounded) is None

    def _closer_to_float64(self, i: int, out: Any, ref: Any, reason: str) -> bool:
        """Whether a tolerance miss is only rounding: `out` is within FP64_MULTIPLIER times
        the reference's own distance from the float64 run (Inductor's rule). A kernel that
        keeps fp32 where eager rounds to bf16 is more accurate than eager, not wrong."""
        if self.outputs64 is None or not _is_tolerance_miss(reason):
            return False
        r64 = self.outputs64[i]
        if not (isinstance(r64, torch.Tensor) and r64.is_floating_point()):
            return False
        r64 = r64.to(ref.device, torch.float64)
        return _no_worse(out.detach().to(ref.device).double() - r64, ref.double() - r64, r64)


# Outputs that carry RNG bookkeeping, not values: with dropout off, attention kernels return
# them uninitialised (torch.empty), so no two runs agree; they are reported, not compared.
RNG_RETURNS = frozenset(
    {"rng_state", "unused", "philox_seed", "philox_offset", "seed", "offset", "debug_attn_mask"}
)


def unchecked_outputs(module: Any) -> dict[int, str]:
    """Output positions of an aten GraphModule that are RNG bookkeeping (see RNG_RETURNS)."""
    if not isinstance(module, torch.fx.GraphModule):
        return {}
    out_node = next((n for n in reversed(module.graph.nodes) if n.op == "output"), None)
    if out_node is None:
        return {}
    flat, _ = torch.utils._pytree.tree_flatten(out_node.args[0])
    found = {}
    for i, node in enumerate(flat):
        if not (isinstance(node, torch.fx.Node) and node.target is operator.getitem):
            continue
        source, index = node.args[0], node.args[1]
        schema = getattr(getattr(source, "target", None), "_schema", None)
        if schema is None or not isinstance(index, int) or index >= len(schema.returns):
            continue
        name = schema.returns[index].name
        if name in RNG_RETURNS:
            found[i] = f"{schema.name}.{name}"
    return found


def _is_tolerance_miss(reason: str) -> bool:
    return "relative error" in reason or "elements off" in reason


def _no_worse(diff: torch.Tensor, allowed: torch.Tensor, scale: torch.Tensor) -> bool:
    """`diff` is within FP64_MULTIPLIER times `allowed` (plus a slack relative to `scale`) in
    both the typical error and the worst element: a few wrong rows raise the second."""
    if bool((~torch.isfinite(diff) & torch.isfinite(allowed)).any()):
        return False  # an infinity or NaN where the allowed error is finite is no rounding
    slack = 1e-7 * _rms(scale)
    return all(
        measure(diff) <= FP64_MULTIPLIER * measure(allowed) + slack for measure in (_rms, _max_abs)
    )


def _rms(t: torch.Tensor) -> float:
    finite = t[torch.isfinite(t)]
    return float(finite.pow(2).mean().sqrt()) if finite.numel() else 0.0


def _max_abs(t: torch.Tensor) -> float:
    finite = t[torch.isfinite(t)]
    return float(finite.abs().max()) if finite.numel() else 0.0


class _Float64Interpreter(torch.fx.Interpreter):
    """Runs an aten graph in float64; an op with no float64 kernel (flash attention) runs
    in float32, else bfloat16, and its floating results come back as float64."""

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        try:
            return super().call_function(target, args, kwargs)
        except Exception:
            for dtype in (torch.float32, torch.bfloat16):
                try:
                    a, k = _cast(args, torch.float64, dtype), _cast(kwargs, torch.float64, dtype)
                    return _cast(target(*a, **k), None, torch.float64)
                except Exception:  # noqa: S112 - try the next precision
                    continue
            raise


def _cast(tree: Any, source: torch.dtype | None, dtype: torch.dtype) -> Any:
    """Cast floating tensors in a pytree (only those of `source` dtype, when given)."""

    def one(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.is_floating_point():
            if source is None or t.dtype == source:
                return t.to(dtype)
        return t

    return torch.utils._pytree.tree_map(one, tree)


def _float64_outputs(module: Callable[..., Any], ref: Reference) -> list[Any] | None:
    """The graph's outputs with every floating input upcast to float64, or None if it fails."""
    inputs = [
        t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
        for t in ref.inputs
    ]
    try:
        with torch.no_grad():
            if isinstance(module, torch.fx.GraphModule):
                out = _as_list(_Float64Interpreter(module).run(*inputs))
            else:
                out = _as_list(module(*inputs))
    except Exception:  # nothing runs at higher precision: verify by tolerance alone
        return None
    if len(out) != len(ref.outputs):
        return None
    return [o.detach() if isinstance(o, torch.Tensor) else o for o in out]


def _as_list(out: Any) -> list[Any]:
    if isinstance(out, (list, tuple)):
        return list(out)
    return [out]


def check_outputs(outputs: Sequence[Any], reference: Sequence[Any]) -> str | None:
    """Compare two output lists element by element; the first mismatch, or None."""
    if len(outputs) != len(reference):
        return f"returned {len(outputs)} outputs, expected {len(reference)}"
    for i, (o, r) in enumerate(zip(outputs, reference, strict=True)):
        reason = mismatch(o, r, f"output {i}")
        if reason:
            return reason
    return None
