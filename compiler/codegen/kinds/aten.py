"""The ATen-call kind: a matmul group's mm/addmm/bmm runs as an ATen call (cuBLAS on a
GPU) into its own buffer, and its epilogue, if any, is a pointwise kernel reading that
buffer (template: `compiler.codegen.pointwise`). Variant `aten`.

Its schedule entry keeps the Triton template's heuristic config (`keeps_config_of`): the
config does not apply to the call, and the tuner starts the template's search from it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import fx

from compiler.codegen import pointwise
from compiler.codegen.access import Reads
from compiler.codegen.kinds import matmul as matmul_kind
from compiler.codegen.kinds import pointwise as pointwise_kind
from compiler.codegen.kinds.base import Config, KernelKind, Point, cdiv, writer
from compiler.codegen.kinds.matmul_choice import library_wins
from compiler.codegen.writer import Generated
from compiler.ir import Domain, KernelGroup


class AtenKind(KernelKind):
    name = "aten"
    group_kind = "matmul"
    variants = ("aten",)
    tie_order = variants
    configurable = False
    keeps_config_of = "triton"
    library = True
    anchor_op = "matmul"
    anchor_joins = False

    def validate(self, variant: str, config: dict[str, Any], sizes: dict[str, int], name: str) -> None:
        """Any config: it does not apply to the call (it is the template's, kept)."""

    def heuristic(self, group: KernelGroup, gpu: bool, arch: str = "") -> Point | None:
        """The library call on a GPU where the GPU class's measurements say it is at least
        as fast as the template (`matmul_choice`); never on the CPU (the interpreter)."""
        sizes = group.sizes
        epilogue = len(group.members) > len(group.anchors)
        if not gpu or not library_wins(arch, sizes["batch"], sizes["M"], sizes["N"], sizes["K"],
                                       epilogue):
            return None
        return "aten", matmul_kind.config_for(group, gpu, arch)

    def space(self, kernel: dict[str, Any]) -> list[Point]:
        return [("aten", {})]

    def sweep(self, sizes: dict[str, int]) -> list[Point]:
        return [("aten", {})]

    def launch_config(self, group: KernelGroup, config: Config, gpu: bool) -> Config:
        """The epilogue's: the pointwise heuristic over the matmul's output."""
        sizes = group.sizes
        return pointwise_kind.config_for(sizes["M"] * sizes["N"] * sizes["batch"], gpu)

    def grid(self, group: KernelGroup, variant: str, config: Config) -> tuple[int, ...]:
        sizes = group.sizes
        return (cdiv(sizes["M"] * sizes["N"] * sizes["batch"], config["XBLOCK"]),)

    def elements(self, group: KernelGroup) -> int:
        return matmul_kind.matmul_elements(group)

    def generate(self, group: KernelGroup, variant: str, is_buffer: Callable[[fx.Node], bool],
                 comment: list[str], int64: bool) -> Generated:
        """The epilogue alone, reading the call's result as a buffer (no outputs: none)."""
        mm = group.anchors[0]

        def buffer(n: fx.Node) -> bool:
            return n is mm or is_buffer(n)

        w = writer(set(group.members) - {mm}, buffer, int64)
        epilogue = [n for n in group.stored if n is not mm]
        return pointwise.generate(group, w, comment, members=epilogue)

    def start(self, node: fx.Node, name: str, position: int) -> KernelGroup:
        return matmul_kind.KIND.start(node, name, position)

    def joined(self, group: KernelGroup, node: fx.Node, reads: Reads) -> tuple[str, Domain] | None:
        return matmul_kind.KIND.joined(group, node, reads)

    def can_fuse(self, group: KernelGroup, node: fx.Node, reads: Reads) -> bool:
        """Any epilogue: it reads the call's result from memory, at any index."""
        return True


KIND = AtenKind()
