"""Op coverage: `python -m bench.coverage` prints, for the test corpus and the kernel
suite (small shapes), how many aten nodes ran in Triton kernels and how many as ATen calls,
by op. It counts what lowering decides; a schedule may still run a big matmul kernel as
its `aten` variant (cuBLAS, with the fused epilogue as a Triton kernel) on a GPU target.
Exit status 1 when a pointwise, reduction or matmul op fell back to an ATen call."""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Iterator

import torch
from torch import fx

from compiler.ir import ExternStep, Program, ViewStep
from compiler.lowering.frontend import lower_graph

WHERE = ("triton", "aten", "view", "removed")


def node_placement(program: Program) -> dict[str, str]:
    """Input-graph node name -> where it ended: triton | aten | view | removed."""
    placed: dict[str, str] = {}
    for step in program.steps:
        if isinstance(step, ExternStep):
            origin = program.origins.get(step.node.name, step.node.name)
            placed.setdefault(origin, "aten")
        elif isinstance(step, ViewStep):
            placed.setdefault(program.origins.get(step.node.name, step.node.name), "view")
        else:
            for name in program.origin_names(step.members + step.inlined):
                placed[name] = "triton"
    return {name: placed.get(name, "removed") for name in program.original_ops}


def count(program: Program) -> Counter[tuple[str, str]]:
    """(op name, placement) counts of one lowered graph."""
    ops = program.original_ops
    return Counter((ops[name], where) for name, where in node_placement(program).items()
                   if ops[name] != "operator.getitem")  # tuple plumbing, not an op


def _graphs(suites: list[str]) -> Iterator[tuple[str, fx.GraphModule, list[torch.Tensor]]]:
    if "corpus" in suites:  # bench/ runs from the repository root, beside tests/
        from tests.corpus import corpus

        for case in corpus():
            yield f"corpus/{case.name}", case.gm, case.example_inputs
    if "bench" in suites:
        from bench.cases import traced_graphs

        for name, gm, inputs in traced_graphs("small"):
            yield f"bench/{name}", gm, inputs


def main(argv: list[str] | None = None) -> int:
    """Print the coverage table; exit status 1 if a pointwise/reduction/matmul op fell back."""
    from compiler.lowering import ops

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--suites", default="corpus,bench", help="comma list: corpus,bench")
    args = parser.parse_args(argv)
    total: Counter[tuple[str, str]] = Counter()
    for name, gm, inputs in _graphs(args.suites.split(",")):
        program, _ = lower_graph(gm, inputs)
        c = count(program)
        total += c
        triton = sum(v for (op, w), v in c.items() if w == "triton")
        aten = sum(v for (op, w), v in c.items() if w == "aten")
        print(f"{name:<34} triton {triton:4d}  aten {aten:3d}")
    print()
    print(f"{'op':<48} " + " ".join(f"{w:>7}" for w in WHERE))
    bad = []
    for op in sorted({op for op, _ in total}):
        row = [total[(op, w)] for w in WHERE]
        print(f"{op:<48} " + " ".join(f"{v:7d}" for v in row))
        base = op.split(".")[1] if op.count(".") >= 2 else op
        if total[(op, "aten")] and base in ops.POINTWISE | ops.REDUCTIONS | ops.MATMULS:
            bad.append(op)
    sums = [sum(v for (_, w), v in total.items() if w == where) for where in WHERE]
    print(f"{'total':<48} " + " ".join(f"{v:7d}" for v in sums))
    if bad:
        print(f"\npointwise/reduction/matmul ops run as ATen calls: {', '.join(bad)}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
