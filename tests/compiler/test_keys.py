"""graph_hash, Target and tuning_key: stable where they must be, sensitive where they must be."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from compiler import (
    COMPILER_VERSION,
    Target,
    WireError,
    decompositions,
    from_wire,
    graph_hash,
    to_wire,
    tuning_key,
)
from tests.corpus import case, corpus

ROOT = Path(__file__).resolve().parents[2]

_HASHES_IN_A_CHILD = """
import json
from compiler import graph_hash, to_wire
from tests.corpus import corpus
print(json.dumps({c.name: graph_hash(to_wire(c.gm, c.example_inputs)) for c in corpus()}))
"""


def _hash(fn, *inputs: torch.Tensor) -> str:
    gm = make_fx(fn, decomposition_table=decompositions())(*inputs)
    return graph_hash(to_wire(gm, list(inputs)))


@pytest.mark.slow
def test_hash_is_the_same_in_a_separate_process() -> None:
    here = {c.name: graph_hash(to_wire(c.gm, c.example_inputs)) for c in corpus()}
    child = subprocess.run(
        [sys.executable, "-c", _HASHES_IN_A_CHILD], cwd=ROOT, capture_output=True, text=True, timeout=300, check=True
    )
    there = json.loads(child.stdout.strip().splitlines()[-1])
    assert there == here
    assert len(set(here.values())) == len(here)  # every corpus graph hashes differently
    assert all(len(h) == 64 and int(h, 16) >= 0 for h in here.values())


def _renamed(wire: dict, rename) -> dict:
    """The same graph with every name passed through `rename`."""
    names = [e["name"] for section in ("inputs", "constants", "nodes") for e in wire[section]]
    doc = json.loads(json.dumps(wire))
    mapping = {old: rename(old) for old in names}

    def walk(value):
        if isinstance(value, dict):
            if set(value) == {"ref"}:
                return {"ref": mapping[value["ref"]]}
            return {k: (mapping[v] if k == "name" else walk(v)) for k, v in value.items()}
        if isinstance(value, list):
            return [walk(v) for v in value]
        return value

    return walk(doc)


def test_renaming_nodes_keeps_the_hash() -> None:
    c = case("gpt_block.train_bwd")
    wire = to_wire(c.gm, c.example_inputs)
    renamed = _renamed(wire, lambda n: f"user_{n}_renamed")
    assert renamed != wire
    assert graph_hash(renamed) == graph_hash(wire)
    # Swap the names of two independent nodes (the two first view/permute of distinct inputs).
    first, second = wire["nodes"][0]["name"], wire["nodes"][1]["name"]
    swapped = _renamed(wire, lambda n: {first: second, second: first}.get(n, n))
    assert swapped["nodes"][0]["name"] == second
    assert graph_hash(swapped) == graph_hash(wire)


def test_changing_shape_stride_dtype_scalar_or_op_changes_the_hash() -> None:
    x = torch.randn(4, 6)
    base = _hash(lambda t: torch.relu(t * 2.0), x)
    variants = {
        "shape": _hash(lambda t: torch.relu(t * 2.0), torch.randn(5, 6)),
        "stride": _hash(lambda t: torch.relu(t * 2.0), torch.randn(6, 4).t()),
        "dtype": _hash(lambda t: torch.relu(t * 2.0), x.double()),
        "scalar": _hash(lambda t: torch.relu(t * 3.0), x),
        "op": _hash(lambda t: torch.sigmoid(t * 2.0), x),
    }
    assert base not in variants.values()
    assert len(set(variants.values())) == len(variants)


def test_editing_one_wire_field_changes_the_hash() -> None:
    gm = make_fx(lambda t: torch.relu(t * 2.0), decomposition_table=decompositions())(torch.randn(4, 6))
    wire = to_wire(gm, [torch.randn(4, 6)])
    scalar = json.loads(json.dumps(wire))
    scalar["nodes"][0]["args"][1] = 2.5
    op = json.loads(json.dumps(wire))
    op["nodes"][1]["op"] = "aten.sigmoid.default"
    grad = json.loads(json.dumps(wire))
    grad["inputs"][0]["requires_grad"] = True
    hashes = {graph_hash(d) for d in (wire, scalar, op, grad)}
    assert len(hashes) == 4


def _target(**changes: str) -> Target:
    fields = {"arch": "sm_90", "name": "NVIDIA H200", "torch": "2.11", "triton": "3.6.0", "compiler": COMPILER_VERSION}
    fields.update(changes)
    return Target.named(fields.pop("arch"), **fields)


def test_tuning_key_changes_with_arch_name_and_versions() -> None:
    graph = from_wire(to_wire(case("mlp.fwd").gm, case("mlp.fwd").example_inputs))
    base = tuning_key(graph, _target())
    others = {
        tuning_key(graph, _target(arch="sm_80")),
        tuning_key(graph, _target(name="NVIDIA H100 80GB HBM3")),
        tuning_key(graph, _target(torch="2.13")),
        tuning_key(graph, _target(triton="3.9.0")),
        tuning_key(graph, _target(compiler=COMPILER_VERSION + ".1")),
    }
    assert base not in others and len(others) == 5
    assert tuning_key(graph_hash(graph), _target()) == base  # a hash may stand for the graph
    other_graph = from_wire(to_wire(case("mlp.train_fwd").gm, case("mlp.train_fwd").example_inputs))
    assert tuning_key(other_graph, _target()) != base


def _fake_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two identical H200s at indices 0 and 3 (no GPU here)."""
    props = SimpleNamespace(major=9, minor=0, name="NVIDIA H200")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props if index in (0, 3) else None)
    monkeypatch.setattr(torch.version, "hip", None)


def test_device_index_never_enters_the_target_or_key(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_cuda(monkeypatch)
    t0, t3, plain = Target.detect("cuda:0"), Target.detect("cuda:3"), Target.detect("cuda")
    assert t0 == t3 == plain
    assert (t0.arch, t0.name, t0.cc, t0.queue_class) == ("sm_90", "NVIDIA H200", (9, 0), "cuda-sm_90-nvidia-h200")
    assert t0 == Target.named("sm_90", name="NVIDIA H200")
    graph = from_wire(to_wire(case("mlp.fwd").gm, case("mlp.fwd").example_inputs))
    assert tuning_key(graph, t0) == tuning_key(graph, t3)


def test_compute_capability_is_parsed_from_the_arch_name() -> None:
    from compiler.wire.keys import compute_capability

    assert [compute_capability(a) for a in ("sm_90", "sm_90a", "sm_86", "sm_100", "sm_120a")] == [
        (9, 0), (9, 0), (8, 6), (10, 0), (12, 0)]
    assert [compute_capability(a) for a in ("cpu", "gfx90a", "sm_", "sm_9", "90")] == [None] * 5
    assert (Target.named("sm_100a", name="B200").cuda_arch, Target.named("sm_86", name="A10").cuda_arch) == (100, 86)
    assert Target.detect("cpu").cuda_arch is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_detect_on_a_real_gpu() -> None:
    target = Target.detect("cuda")
    assert target.device_type == "cuda" and target.cc is not None
    assert Target.detect(f"cuda:{torch.cuda.device_count() - 1}").arch.startswith("sm_")


def test_cpu_target_and_json_round_trip() -> None:
    cpu = Target.detect("cpu")
    assert (cpu.device_type, cpu.arch, cpu.name, cpu.cc, cpu.queue_class) == ("cpu", "cpu", "cpu", None, "cpu")
    assert cpu.torch == ".".join(torch.__version__.split("+")[0].split(".")[:2])
    h200 = _target()
    assert set(h200.to_json()) == {"device_type", "arch", "name", "torch", "triton", "compiler"}
    assert Target.from_json(json.loads(json.dumps(h200.to_json()))) == h200


@pytest.mark.parametrize(
    "change, message",
    [
        ({"extra": "x"}, "unknown"),
        ({"arch": None}, "must be a string"),
        ({"device_type": "tpu"}, "device_type"),
        ({"torch": "2.13.0"}, "major.minor"),
        ({"arch": "sm_90; rm -rf /"}, "arch"),
        ({"name": ""}, "name"),
    ],
)
def test_malformed_target_json_is_a_wire_error(change: dict, message: str) -> None:
    doc = {**_target().to_json(), **change}
    with pytest.raises(WireError, match=message):
        Target.from_json(doc)
    with pytest.raises(WireError, match="JSON object"):
        Target.from_json(["sm_90"])
