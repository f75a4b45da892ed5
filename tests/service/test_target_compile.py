"""The CPU worker compiles every kernel of a CUDA target's heuristic build for the target's
architecture (no GPU here), stores what the compile gave, and fails a job whose kernel does
not compile or does not fit, at once and with a clear error."""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest
import torch

import compiler
from compiler.lowering.tracing import trace_training
from service import build_child, forkserver, pipeline, store
from service.context import ServiceContext
from service.intake import parse_submission
from service.queue import BUILD_STREAM
from service.target_compile import TargetCompileError, compile_schedule
from service.worker import Worker
from tests.compiler.oputil import rand, trace
from tests.service.helpers import gpu_target, job_dict, running, wait_for, wire_body

SM_90 = compiler.Target.named("sm_90", name="NVIDIA H200")
# fp32 tiles of 16x512 and 512x128 in 3 stages: more shared memory than an H200 block has.
TOO_BIG = {"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 512, "num_warps": 8, "num_stages": 3}


def _assert_facts(facts: dict[str, Any], arch: str) -> None:
    assert facts["arch"] == arch
    assert 0 < facts["registers"] <= 255 and facts["spills"] >= 0 and facts["local_bytes"] >= 0
    assert facts["binary_bytes"] > 1000 and facts["shared_bytes"] >= 0
    assert facts["num_warps"] in (1, 2, 4, 8, 16, 32) and facts["compile_s"] >= 0


@pytest.mark.slow
def test_shutdown_ends_the_compile_server_and_a_later_compile_starts_another() -> None:
    """`kiln serve` ends its fork servers when it stops (service.api.app's lifespan)."""
    import os

    server = forkserver.compiles.warm()
    assert os.path.exists(f"/proc/{server}")
    forkserver.shutdown()
    assert not os.path.exists(f"/proc/{server}")  # ended and reaped
    forkserver.shutdown()  # none running: nothing to do
    again = forkserver.compiles.warm()
    assert again != server
    forkserver.shutdown()


def test_heuristic_build_for_sm_90_compiles_every_kernel() -> None:
    body = wire_body("gpt_block.fwd", gpu_target())
    outcome = build_child.build_in_child(json.dumps(body["graph"]), body["target"], 0,
                                         timeout_s=600, memory_bytes=0)
    kinds = {k["kind"] for k in outcome.kernels}
    assert {"matmul", "reduction"} <= kinds, kinds
    for k in outcome.kernels:
        _assert_facts(k["compiled"], "sm_90")
        assert k["compiled"]["num_warps"] == k["config"]["num_warps"]
    matmul = next(k for k in outcome.kernels if k["kind"] == "matmul")
    assert matmul["compiled"]["shared_bytes"] > 0  # the template stages tiles in shared memory
    assert "compiled for sm_90" in outcome.note


def test_a_cuda_build_job_parses_builds_and_compiles_in_one_child(monkeypatch) -> None:
    """One child from the compiling fork server does the whole job: no second child
    rebuilds the graph to compile it, and none from the interpreting server."""
    started: list[tuple[str, str]] = []
    for name in ("checks", "compiles"):
        server = getattr(forkserver, name)

        def start(target: str, *args: Any, _real=server.start, _name=name, **kw: Any) -> Any:
            started.append((_name, target))
            return _real(target, *args, **kw)

        monkeypatch.setattr(server, "start", start)
    body = wire_body("mlp.fwd", gpu_target())
    outcome = build_child.build_in_child(json.dumps(body["graph"]), body["target"], 0,
                                         timeout_s=600, memory_bytes=4096 << 20)
    assert started == [("compiles", "service.build_child:_child")]
    assert outcome.binaries and all(k["compiled"] for k in outcome.kernels if k["kind"] != "aten")


def test_cpu_target_build_has_no_compile_facts() -> None:
    body = wire_body("mlp.fwd")
    outcome = build_child.build_in_child(json.dumps(body["graph"]), body["target"], 0,
                                         timeout_s=600, memory_bytes=0)
    assert outcome.kernels and all(k["compiled"] is None for k in outcome.kernels)


@pytest.mark.parametrize("variant", ["looped", "persistent", "online"])
def test_nan_aware_reduction_variants_compile_for_sm_90(variant: str) -> None:
    # amax/argmax/softmax kernels with NaN handling in each variant, through ptxas.
    x = rand((6, 300), seed=1)
    wire = compiler.to_wire(trace(lambda x: (torch.softmax(x, -1), x.argmax(-1), x.amin(-1)), x), [x])
    graph = compiler.from_wire(wire)
    base = compiler.heuristic_schedule(graph, SM_90)
    kernels = tuple(
        dataclasses.replace(k, variant=variant, config=dict(
            k.config, XBLOCK=2, RBLOCK=512 if variant == "persistent" else 64))
        if k.kind == "reduction" else k for k in base.kernels)
    built = compiler.build(graph, dataclasses.replace(base, kernels=kernels))
    compiled = compile_schedule(json.dumps(wire), built.schedule.to_json())
    assert set(compiled.facts) == {k.name for k in built.kernels}
    for f in compiled.facts.values():
        _assert_facts(f, "sm_90")
    # One binary per distinct kernel, under its Triton cache key: metadata and cubin.
    sources = {k.source_hash for k in built.kernels}
    assert {b["source_hash"] for b in compiled.binaries} == sources
    for b in compiled.binaries:
        assert re.fullmatch(r"[0-9a-f]{64}", b["key"]) and b["arch"] == "sm_90"
        assert sorted(n.rsplit(".", 1)[1] for n in b["files"]) == ["cubin", "json"]
        assert json.loads(next(d for n, d in b["files"].items() if n.endswith(".json")))["hash"] == b["key"]


def _too_big() -> tuple[str, dict[str, Any]]:
    """mlp.fwd's wire and a schedule whose matmul needs more shared memory than sm_90 has."""
    body = wire_body("mlp.fwd", gpu_target())
    graph = compiler.from_wire(body["graph"])
    schedule = compiler.heuristic_schedule(graph, SM_90)
    matmul = next(k for k in schedule.kernels if k.kind == "matmul")
    schedule = schedule.with_kernel(matmul.name, config=dict(matmul.config, **TOO_BIG))
    return json.dumps(body["graph"]), compiler.build(graph, schedule).schedule.to_json()


@pytest.mark.slow
def test_a_kernel_that_does_not_fit_the_target_is_a_clear_error() -> None:
    with pytest.raises(TargetCompileError, match=r"out_of_resources: kernel fused_addmm_relu_0 does "
                       r"not fit sm_90: needs \d+ B shared memory, the target allows 232448"):
        compile_schedule(*_too_big())


def test_a_kernel_that_does_not_compile_is_a_clear_error() -> None:
    from compiler.aot import launch_specs
    from tuner.aot import AotError, compile_launch

    body = wire_body("mlp.fwd", gpu_target())
    graph = compiler.from_wire(body["graph"])
    spec = launch_specs(compiler.build(graph, compiler.heuristic_schedule(graph, SM_90)))[0]
    # A launch whose block sizes went missing: Triton cannot trace the kernel.
    with pytest.raises(AotError, match=r"build_error: kernel fused_addmm_relu_0 does not "
                       r"compile for sm_90 \(config .*\): CompilationError at \d+:\d+: \S"):
        compile_launch(dataclasses.replace(spec, constexprs={}), SM_90)


def _submit(ctx: ServiceContext, body: dict[str, Any]) -> tuple[str, int]:
    sub, _graph = parse_submission(json.dumps(body).encode())
    with ctx.transaction() as session:
        _entry, job, _ = store.submit(session, sub)
    ctx.queue.enqueue(BUILD_STREAM, job.id, job.tenant)
    return sub.key, job.id


def _run_worker(ctx: ServiceContext, job_id: int, status: str, **kw: Any) -> None:
    with running(Worker(ctx, block_s=0.2, **kw), join_s=30):
        wait_for(lambda: job_dict(ctx, job_id)["status"] == status, 120)


@pytest.mark.services
def test_cpu_worker_stores_compile_facts_of_an_sm_90_schedule(pg_ctx: ServiceContext) -> None:
    from service.store.admin import entry_detail

    key, job_id = _submit(pg_ctx, wire_body("mlp.train_bwd", gpu_target()))
    _run_worker(pg_ctx, job_id, "done")
    with pg_ctx.transaction() as session:
        detail = entry_detail(session, key)
    assert detail["status"] == "heuristic" and detail["kernels"]
    for k in detail["kernels"]:
        _assert_facts(k["compiled"], "sm_90")
    assert "compiled for sm_90" in detail["jobs"][0]["history"][-1]["message"]
    # The dashboard's entry page shows them beside each kernel.
    from service.dashboard import views
    from service.dashboard.routes import templates

    page = templates.env.get_template("entry.html").render(
        **views.entry_context(detail), csrf="t", logged_in=True)
    facts = detail["kernels"][0]["compiled"]
    assert page.count("<dt>compiled for sm_90</dt>") == len(detail["kernels"])
    assert f"{facts['registers']} registers/thread" in page


@pytest.mark.slow
@pytest.mark.services
def test_a_job_whose_kernel_does_not_fit_fails_at_once(pg_ctx: ServiceContext) -> None:
    calls = []

    def build(_wire: str, _target: dict, _numel: int) -> pipeline.Outcome:
        calls.append(1)
        compile_schedule(*_too_big())
        raise AssertionError("the oversized kernel compiled")

    key, job_id = _submit(pg_ctx, wire_body("mlp.fwd", gpu_target()))
    _run_worker(pg_ctx, job_id, "failed", build=build)
    job = job_dict(pg_ctx, job_id)
    assert len(calls) == job["attempts"] == 1  # retrying cannot help
    assert job["error"].startswith("failed once; last error: TargetCompileError: out_of_resources: "
                                   "kernel fused_addmm_relu_0 does not fit sm_90: needs")
    with pg_ctx.transaction() as session:
        assert store.schedule_by_key(session, key).status == "failed"


class _LnMlp(torch.nn.Module):
    """LayerNorm, Linear + GELU, bias-free Linear: at d=1024 and 4096 rows its matmuls are
    cuBLAS-sized, so the heuristic makes them ATen calls (the bias-free one with no
    epilogue at all, as in every backward)."""

    def __init__(self, d: int = 1024) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(d)
        self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.nn.functional.gelu(self.fc(self.ln(x))))


def _real_size_bodies() -> list[dict[str, Any]]:
    torch.manual_seed(0)
    fwd, bwd, fwd_in, bwd_in = trace_training(_LnMlp(), [torch.randn(4096, 1024)])
    target = gpu_target()
    return [{"graph": compiler.to_wire(gm, ins), "target": target}
            for gm, ins in ((fwd, fwd_in), (bwd, bwd_in))]


@pytest.mark.slow
@pytest.mark.services
def test_real_size_graphs_with_bare_cublas_matmuls_get_an_sm_90_schedule(
        pg_ctx: ServiceContext) -> None:
    from service.store.admin import entry_detail

    for body in _real_size_bodies():
        key, job_id = _submit(pg_ctx, body)
        _run_worker(pg_ctx, job_id, "done")
        with pg_ctx.transaction() as session:
            detail = entry_detail(session, key)
        assert detail["status"] == "heuristic"
        kernels = detail["kernels"]
        bare = [k for k in kernels if k["variant"] == "aten" and k["compiled"] is None]
        assert bare, [(k["name"], k["variant"]) for k in kernels]  # a bare cuBLAS call is there
        triton = [k for k in kernels if k not in bare]
        assert triton
        for k in triton:  # every kernel with Triton code (epilogues too) compiled for sm_90
            _assert_facts(k["compiled"], "sm_90")
