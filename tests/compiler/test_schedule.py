"""Schedules: JSON shape, validation, determinism, source hashes and retuning."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import compiler
from compiler.scheduling.schedule import FORMAT, Schedule
from tests.compiler.oputil import assert_matches, rand, trace


def _ln_graph() -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    x, w, b = rand((6, 40), seed=1), rand((40,), seed=2), rand((40,), seed=3)
    gm = trace(lambda x, w, b: F.gelu(F.layer_norm(x, (40,), w, b)) + x, x, w, b)
    return gm, [x, w, b]


def _wire_graph() -> compiler.Graph:
    gm, inputs = _ln_graph()
    return compiler.from_wire(compiler.to_wire(gm, inputs))


def test_json_shape_matches_the_contract() -> None:
    graph = _wire_graph()
    target = compiler.Target.named("sm_90", name="NVIDIA H200")
    s = compiler.heuristic_schedule(graph, target).to_json()
    assert s["format"] == FORMAT and s["status"] == "heuristic"
    assert s["graph_hash"] == compiler.graph_hash(graph)
    assert s["target"] == target.to_json()
    (k,) = s["kernels"]
    assert set(k) == {"name", "kind", "variant", "nodes", "sizes", "dtype", "config", "source_hash"}
    assert k["kind"] == "reduction" and k["variant"] in ("persistent", "looped", "online")
    assert k["name"].startswith("fused_") and k["name"].endswith("_0")
    assert set(k["config"]) == {"XBLOCK", "RBLOCK", "num_warps", "num_stages"}
    assert k["sizes"] == {"xnumel": 6, "rnumel": 40}
    assert all(n.startswith("n") for n in k["nodes"]) and k["source_hash"] is None
    assert Schedule.from_json(json.dumps(s)).to_json() == s


def test_build_fills_hashes_and_checks_them() -> None:
    graph = _wire_graph()
    built = compiler.build(graph, compiler.heuristic_schedule(graph, None))
    filled = built.schedule
    assert all(len(k.source_hash) == 64 for k in filled.kernels)
    assert built.kernels[0].source_hash == filled.kernels[0].source_hash
    compiler.build(graph, filled.to_json())  # the filled schedule rebuilds
    k = filled.kernels[0]
    with pytest.raises(compiler.ScheduleMismatch):
        compiler.build(graph, filled.with_kernel(k.name, source_hash="0" * 64))


def test_retuning_changes_config_not_source() -> None:
    graph = _wire_graph()
    inputs = compiler.random_inputs(graph, seed=0)
    base = compiler.build(graph, compiler.heuristic_schedule(graph, None))
    k = base.schedule.kernels[0]
    tuned = base.schedule.with_kernel(k.name, variant="looped", config=dict(k.config, RBLOCK=16, XBLOCK=4))
    looped = compiler.build(graph, tuned.with_kernel(k.name, source_hash=None))
    other = compiler.build(graph, looped.schedule.with_kernel(
        k.name, config=dict(k.config, RBLOCK=8, XBLOCK=2, num_warps=2)))  # same hash: accepted
    assert other.kernels[0].source_hash == looped.kernels[0].source_hash
    assert looped.kernels[0].source_hash != base.kernels[0].source_hash
    for built in (looped, other):
        assert_matches(built(*inputs), base(*inputs))


@pytest.mark.parametrize("config,message", [
    ({"XBLOCK": 3, "RBLOCK": 64, "num_warps": 4, "num_stages": 1}, "power of two"),
    ({"XBLOCK": 1, "RBLOCK": 64, "num_warps": 3, "num_stages": 1}, "num_warps"),
    ({"XBLOCK": 1, "RBLOCK": 64, "num_warps": 4}, "missing"),
    ({"XBLOCK": 1, "RBLOCK": 64, "num_warps": 4, "num_stages": 1, "BLOCK_M": 16}, "unknown"),
    ({"XBLOCK": 1, "RBLOCK": "64", "num_warps": 4, "num_stages": 1}, "integer"),
])
def test_bad_configs_raise_value_error(config: dict, message: str) -> None:
    graph = _wire_graph()
    s = compiler.heuristic_schedule(graph, None)
    with pytest.raises(ValueError, match=message):
        compiler.build(graph, s.with_kernel(s.kernels[0].name, config=config))


def test_bad_variant_and_other_graph() -> None:
    graph = _wire_graph()
    s = compiler.heuristic_schedule(graph, None)
    with pytest.raises(ValueError, match="variant"):
        compiler.build(graph, s.with_kernel(s.kernels[0].name, variant="triton"))
    x = rand((3, 4), seed=9)
    other = compiler.from_wire(compiler.to_wire(trace(lambda x: x.sum(-1), x), [x]))
    with pytest.raises(compiler.ScheduleMismatch):
        compiler.build(other, s)
    with pytest.raises(ValueError):
        Schedule.from_json({"format": "nope"})


_SUBPROCESS = """
import json, sys, torch
import compiler
from tests.compiler.test_schedule import _wire_graph
g = _wire_graph()
b = compiler.build(g, compiler.heuristic_schedule(g, None))
print(json.dumps([k.source_hash for k in b.kernels]))
"""


def test_sources_are_identical_in_another_process() -> None:
    graph = _wire_graph()
    here = [k.source_hash for k in compiler.build(graph, compiler.heuristic_schedule(graph, None)).kernels]
    out = subprocess.run([sys.executable, "-c", _SUBPROCESS], capture_output=True, text=True,
                         check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == here


def test_kernel_calls_relaunch_in_isolation() -> None:
    graph = _wire_graph()
    built = compiler.build(graph, compiler.heuristic_schedule(graph, None))
    inputs = compiler.random_inputs(graph, seed=1)
    calls = built.kernel_calls(*inputs)
    assert [c.name for c in calls] == [k.name for k in built.kernels]
    for call in calls:
        call.launch()
    (info,) = built.launches()
    assert info.kernel == built.kernels[0].name and set(info.constexprs) == {"XBLOCK", "RBLOCK"}
    assert info.arg_dtypes == (torch.float32,) * 4 and info.grid[0] >= 1


def test_wrong_input_layout_is_refused() -> None:
    graph = _wire_graph()
    built = compiler.build(graph, None)
    inputs = compiler.random_inputs(graph, seed=1)
    with pytest.raises(ValueError, match="expected"):
        built(inputs[0].t().contiguous().t(), *inputs[1:])
    with pytest.raises(ValueError, match="inputs"):
        built(*inputs[:2])


def test_64_bit_indexing_only_where_sizes_need_it() -> None:
    from compiler.ir import TensorMeta

    small = TensorMeta(torch.float16, (1024, 1024), (1024, 1))
    big = TensorMeta(torch.float16, (65536, 65536), (65536, 1))  # 2^32 elements: metas only
    x = rand((2, 2), torch.float16, seed=20)
    gm = trace(lambda x: torch.relu(x) * 2, x)
    for m, wide in ((small, False), (big, True)):
        s = compiler.heuristic_schedule(gm, None, [m])
        source = compiler.build(gm, s, [m]).kernels[0].source
        assert ("tl.program_id(0).to(tl.int64)" in source) == wide


def test_gpu_target_schedule_runs_under_the_interpreter() -> None:
    """A CPU worker checks heuristic builds for GPU targets with the Triton interpreter."""
    graph = _wire_graph()
    target = compiler.Target.named("sm_90", name="NVIDIA H200")
    s = compiler.heuristic_schedule(graph, target)
    k = s.kernels[0]
    built = compiler.build(graph, s.with_kernel(k.name, config=dict(k.config, num_warps=8, num_stages=3)))
    assert built.schedule.target["device_type"] == "cuda"
    inputs = compiler.random_inputs(graph, seed=2)
    assert_matches(built(*inputs), graph.to_fx()(*inputs))
