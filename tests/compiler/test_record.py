"""compiler.lowering.record: decompositions traced without touching process-wide state, so that a
build on a background thread (the client's poller, KILN_BACKGROUND=1) cannot hijack the
training thread's module calls the way make_fx's tracer would."""

from __future__ import annotations

import torch
import torch.fx._symbolic_trace as symbolic_trace
import torch.nn.functional as F
from torch.fx.experimental.proxy_tensor import make_fx

import compiler
from compiler.lowering.decomposition_table import decompositions
from compiler.lowering.record import record
from tests.compiler.oputil import assert_matches, rand, trace

aten = torch.ops.aten


def _meta(*shape: int) -> torch.Tensor:
    return torch.empty(shape, device="meta")


def _call_ops(gm: torch.fx.GraphModule) -> list[object]:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_record_gives_the_ops_make_fx_gives():
    table = decompositions()

    def fn(x):
        return aten.var_mean.correction(x, [1], correction=1, keepdim=True)

    def logsumexp(x):
        return aten.logsumexp.default(x, [0])

    for f in (fn, logsumexp):
        want = make_fx(f, decomposition_table=table)(_meta(4, 8))
        got = record(f, [_meta(4, 8)], table)
        assert _call_ops(got) == _call_ops(want)
    x = rand((4, 8), seed=3)  # (logsumexp's graph makes a constant on the meta device)
    assert_matches(record(fn, [_meta(4, 8)], table)(x), fn(x))


def test_record_decomposes_with_the_table_and_keeps_other_ops():
    table = {aten.addcmul.default: lambda a, b, c, value=1: aten.add.Tensor(
        a, aten.mul.Tensor(aten.mul.Tensor(b, c), value))}

    def fn(a, b, c):
        return aten.addcmul.default(a, b, c, value=2).exp()

    gm = record(fn, [_meta(3), _meta(3), _meta(3)], table)
    assert _call_ops(gm) == [aten.mul.Tensor, aten.mul.Tensor, aten.add.Tensor, aten.exp.default]
    a, b, c = (rand((3,), seed=s) for s in range(3))
    assert_matches(gm(a, b, c), torch.addcmul(a, b, c, value=2).exp())


def test_record_sets_no_process_wide_tracing_state():
    seen = {}
    module_call = torch.nn.Module.__call__

    def spy(x):
        seen["fx_tracing"] = symbolic_trace.is_fx_tracing()
        seen["module_call_patched"] = torch.nn.Module.__call__ is not module_call
        return aten.neg.default(x)

    record(lambda x: aten.abs.default(x), [_meta(2)], {aten.abs.default: spy})
    assert seen == {"fx_tracing": False, "module_call_patched": False}


def test_lowering_a_layer_norm_never_runs_the_fx_tracer(monkeypatch):
    """var_mean is decomposed at build time; the build must not go through fx's Tracer."""
    w, b = rand((37,), seed=1), rand((37,), seed=2)

    def fn(x):
        return F.layer_norm(x, (37,), w, b)

    x = rand((5, 37), seed=11)
    gm = trace(fn, x)

    def no_tracing(*args, **kwargs):
        raise AssertionError("the fx Tracer ran during a build")

    monkeypatch.setattr(symbolic_trace.Tracer, "trace", no_tracing)
    built = compiler.build(gm, None, [x])
    assert built.fallback_ops == []
    assert_matches(built(x), fn(x))
