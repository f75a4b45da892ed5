"""Shared pieces of the injection tests: tiny wire graphs and the marker an exploit would create."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")

# What every injection attempt tries to run; the marker file must never appear.
MARKER = Path("/tmp/kiln-security-pwned")
PAYLOAD = f"x'); __import__('os').system('touch {MARKER}') #"


@pytest.fixture(autouse=True)
def _no_marker() -> Any:
    MARKER.unlink(missing_ok=True)
    yield
    assert not MARKER.exists(), "an injected payload ran"


def tensor(dtype: str = "float32", shape: tuple[int, ...] = (4,)) -> dict[str, Any]:
    stride, acc = [], 1
    for size in reversed(shape):
        stride.insert(0, acc)
        acc *= size
    return {"dtype": dtype, "shape": list(shape), "stride": stride}


def inp(name: str = "x", dtype: str = "float32", shape: tuple[int, ...] = (4,)) -> dict[str, Any]:
    return {"name": name, **tensor(dtype, shape), "storage_offset": 0, "requires_grad": False}


def node(name: str, op: str, args: list[Any], kwargs: dict[str, Any] | None = None,
         meta: Any = "default") -> dict[str, Any]:
    return {"name": name, "op": op, "args": args, "kwargs": kwargs or {},
            "meta": tensor() if meta == "default" else meta}


def graph(nodes: list[dict[str, Any]], inputs: list[dict[str, Any]] | None = None,
          constants: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    doc = {"format": "kiln.graph/1", "inputs": [inp()] if inputs is None else inputs,
           "nodes": nodes, "outputs": [{"ref": nodes[-1]["name"]}]}
    if constants is not None:
        doc["constants"] = constants
    return doc


def relu_graph() -> dict[str, Any]:
    return graph([node("y", "aten.relu.default", [{"ref": "x"}])])
