"""Ahead-of-time compile for an H100/H200 target on a machine without a GPU.

The checks run in a spawned process with TRITON_INTERPRET=0: a process that imported
Triton under the interpreter (CI sets it) has interpreted triton.language helpers and
cannot compile for a real GPU.
"""

from __future__ import annotations

import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor

import pytest
import torch

from tuner.builder import precompile
from tuner.records import Candidate


def _softmax_graph():
    import compiler
    from compiler.lowering.tracing import trace_inference

    gm, ins = trace_inference(lambda x: torch.softmax(x * 0.5, -1), [torch.randn(32, 256)])
    return compiler.from_wire(compiler.to_wire(gm, ins))


def _aot_checks() -> tuple[bool, str | None, str | None]:
    import os

    os.environ["TRITON_INTERPRET"] = "0"  # before Triton loads (see tuner.builder._init_worker)
    import compiler
    from compiler.aot import launch_specs
    from tuner.aot import compile_kernel
    from tuner.space import TargetLimits

    graph = _softmax_graph()
    target = compiler.Target.named("sm_90", name="NVIDIA H200")
    built = compiler.build(graph, compiler.heuristic_schedule(graph, target))
    specs = launch_specs(built)
    name = built.kernels[0].name
    tiny = TargetLimits(
        shared_memory=1, registers_per_thread=255, registers_per_block=65536, max_threads=1024
    )
    return (
        bool(specs) and all(s.signature and s.options for s in specs),
        compile_kernel(built, name, target),
        compile_kernel(built, name, target, limits=tiny),
    )


def test_kernels_compile_for_sm90_without_a_gpu_and_shared_memory_is_checked() -> None:
    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as pool:
        specs_ok, fits, too_big = pool.submit(_aot_checks).result()
    assert specs_ok
    assert fits is None
    assert too_big and too_big.startswith("out_of_resources: kernel ")
    assert "does not fit sm_90: needs" in too_big


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


def test_interpreted_kernels_are_reimported_from_the_built_source_not_the_kernel_dir(
    tmp_path, monkeypatch
) -> None:
    """Under TRITON_INTERPRET=1 the launch's function is interpreted: `launch_specs` gives a
    JIT function made from `built.kernels[i].source`, never from the (writable) kernel dir."""
    import compiler
    from compiler.aot import AotUnavailable, launch_specs
    from compiler.aot.target import _compilable
    from compiler.runtime import built as runtime

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("KILN_KERNEL_DIR", str(tmp_path / "k"))
    monkeypatch.setattr(runtime, "_MODULES", {})
    graph = _softmax_graph()
    built = compiler.build(graph)
    kernel = built.kernels[0]
    for path in (tmp_path / "k").rglob("kiln_*.py"):
        path.write_text("raise SystemExit('the kernel dir was read')\n")
    specs = launch_specs(built)
    assert [s.kernel for s in specs] == [kernel.name]
    assert type(specs[0].fn).__name__ == "JITFunction"
    assert specs[0].signature == {"in_ptr0": "*fp32", "out_ptr0": "*fp32",
                                  **{k: "constexpr" for k in specs[0].constexprs}}
    assert "def " + specs[0].fn.__name__ in kernel.source and specs[0].fn.src in kernel.source
    object.__setattr__(kernel, "source", kernel.source + "\n# changed\n")
    with pytest.raises(AotUnavailable, match="sha256"):
        _compilable(built, kernel.name, kernel.name)
