"""GPU twins of the CPU tests: the real runner, compile workers and timing on CUDA."""

from __future__ import annotations

import pytest
import torch

import tuner

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
    pytest.mark.xdist_group("tuner_runner"),
]


def test_tune_on_cuda_with_parallel_compile() -> None:
    import compiler
    from compiler.lowering.tracing import trace_inference
    from tuner.runner import Runner

    x = torch.randn(4096, 1024, device="cuda")
    gm, ins = trace_inference(lambda t: torch.softmax(t * 0.125, -1), [x])
    graph = compiler.from_wire(compiler.to_wire(gm, ins))
    target = compiler.Target.detect("cuda")
    with Runner("cuda", compile_workers=2) as runner:
        result = tuner.tune(graph, target, tuner.Budget(trials=8), runner=runner)
        assert runner.builder.prepared  # candidates went through the compile workers
    assert 1 <= result.trials <= 8
    assert all(m["verified"] for m in result.measurements if m["ms"] is not None)
    assert result.best_ms and result.heuristic_ms and result.eager_ms
    built = compiler.build(graph, result.schedule)
    (out,) = built(*ins)
    torch.testing.assert_close(out, torch.softmax(x * 0.125, -1))


def test_warm_kernel_fills_the_cache_the_launch_reads() -> None:
    import compiler
    from compiler.lowering.tracing import trace_inference
    from tuner.aot import warm_kernel
    from tuner.space import limits_for

    gm, ins = trace_inference(lambda t: t.sum(-1), [torch.randn(64, 512, device="cuda")])
    graph = compiler.from_wire(compiler.to_wire(gm, ins))
    target = compiler.Target.detect("cuda")
    built = compiler.build(graph, compiler.heuristic_schedule(graph, target))
    name = built.kernels[0].name
    assert warm_kernel(built, name, limits_for(target)) is None
    (out,) = built(*ins)
    torch.testing.assert_close(out, ins[0].sum(-1))
