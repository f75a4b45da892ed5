"""Ahead-of-time compile for an H100/H200 target on a machine without a GPU."""

from __future__ import annotations

import torch

from tuner.aot import compile_kernel, launch_specs
from tuner.builder import precompile
from tuner.records import Candidate
from tuner.space import TargetLimits


def _softmax_graph():
    import compiler
    from compiler.tracing import trace_inference

    gm, ins = trace_inference(lambda x: torch.softmax(x * 0.5, -1), [torch.randn(32, 256)])
    return compiler.from_wire(compiler.to_wire(gm, ins))


def test_kernels_compile_for_sm90_without_a_gpu_and_shared_memory_is_checked() -> None:
    import compiler

    graph = _softmax_graph()
    target = compiler.Target.named("sm_90", name="NVIDIA H200")
    built = compiler.build(graph, compiler.heuristic_schedule(graph, target))
    specs = launch_specs(built)
    assert specs and all(s.signature and s.options for s in specs)
    name = built.kernels[0].name
    assert compile_kernel(built, name, target) is None
    tiny = TargetLimits(
        shared_memory=1, registers_per_thread=255, registers_per_block=65536, max_threads=1024
    )
    error = compile_kernel(built, name, target, limits=tiny)
    assert error and error.startswith("out_of_resources")


def test_precompile_reports_each_candidate() -> None:
    import compiler

    graph = _softmax_graph()
    target = compiler.Target.named("sm_90", name="NVIDIA H200")
    schedule = compiler.heuristic_schedule(graph, target).to_json()
    kernel = schedule["kernels"][0]
    good = Candidate.make(kernel["name"], kernel["variant"], kernel["config"])
    bad = Candidate.make(
        kernel["name"], "persistent", {**kernel["config"], "RBLOCK": 16}
    )  # < rnumel
    verdicts = precompile(graph.to_json(), schedule, target, [good, bad], workers=1)
    assert verdicts[good] is None
    assert verdicts[bad].startswith("build_error")
