"""Fusion plans of the corpus and the kernel suite as JSON, to compare a refactor against.

`python -m tests.compiler.fusion_plans --out before.json` before a change to fusion or code
generation, `--out after.json --compare before.json` after: it exits 1 and names every graph
whose classification, kernel groups or generated kernels (every variant of every group, or
the error that variant raises) differ.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch import fx

from compiler.codegen import generate_kernel, kinds
from compiler.ir import ExternStep, KernelGroup, Program, ViewStep
from compiler.lowering.frontend import lower_graph
from compiler.lowering.fusion import classify


def graphs() -> Iterator[tuple[str, fx.GraphModule, list[Any]]]:
    """Every corpus graph and every kernel suite case at its tiny and small sizes."""
    from bench.cases import traced_graphs
    from tests.corpus import corpus
    for case in corpus():
        yield f"corpus/{case.name}", case.gm, case.example_inputs
    for scale in ("tiny", "small"):
        for name, gm, inputs in traced_graphs(scale):
            yield f"bench/{scale}/{name}", gm, inputs


def _names(nodes: list[fx.Node]) -> list[str]:
    return [n.name for n in nodes]


def _kernel(program: Program, group: KernelGroup) -> dict[str, Any]:
    sources = {}
    for variant in kinds.variants_of(group.kind):
        try:
            gen = generate_kernel(group, variant, program.is_buffer, [])
        except Exception as exc:  # noqa: BLE001 - which error a variant raises is part of the plan
            sources[variant] = f"error {type(exc).__name__}"
        else:
            sources[variant] = hashlib.sha256(gen.source.encode()).hexdigest()[:16]
    d = group.domain
    return {"name": group.name, "kind": group.kind, "domain": [list(d.shape), list(d.rdims), d.k],
            "dtype": str(group.dtype), "members": _names(group.members),
            "anchors": _names(group.anchors), "stored": _names(group.stored),
            "inlined": _names(group.inlined), "reads": _names(group.reads), "sources": sources}


def plan(gm: fx.GraphModule, inputs: list[Any]) -> dict[str, Any]:
    """The lowered program's steps; each kernel with the source hash of every variant."""
    program, _ = lower_graph(gm, inputs)
    steps: list[Any] = []
    for step in program.steps:
        if isinstance(step, ExternStep):
            steps.append(["aten", step.node.name])
        elif isinstance(step, ViewStep):
            steps.append(["view", step.node.name])
        else:
            steps.append(_kernel(program, step))
    kinds = {n.name: kind.name for n, kind in classify(program.gm).items()}
    return {"kinds": kinds, "steps": steps, "buffers": sorted(n.name for n in program.buffers)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--compare", type=Path, help="an earlier --out file")
    args = parser.parse_args(argv)
    plans = {name: plan(gm, inputs) for name, gm, inputs in graphs()}
    args.out.write_text(json.dumps(plans, indent=1, sort_keys=True))
    print(f"{len(plans)} graphs, {sum(len(p['steps']) for p in plans.values())} steps -> {args.out}")
    if args.compare is None:
        return 0
    before = json.loads(args.compare.read_text())
    differ = sorted(n for n in before.keys() | plans.keys() if before.get(n) != plans.get(n))
    for name in differ:
        print(f"differs: {name}")
    print("identical" if not differ else f"{len(differ)} graphs differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
