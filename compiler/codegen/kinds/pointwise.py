"""The pointwise kind: one program per XBLOCK elements of the output's flat index
(template: `compiler.codegen.pointwise`)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

from torch import fx

from compiler.codegen import pointwise
from compiler.codegen.access import Reads
from compiler.codegen.kinds.base import (
    WARPS,
    BlockLimits,
    Config,
    KernelKind,
    Point,
    clip,
    next_pow2,
    prune_block,
    writer,
)
from compiler.codegen.writer import Generated
from compiler.ir import Domain, KernelGroup, meta, storage_order

XBLOCKS = (64, 128, 256, 512, 1024, 2048, 4096)  # the tuning space's XBLOCK domain


def config_for(xnumel: int, gpu: bool) -> Config:
    """1024 elements per program on big tensors; fewer (more programs) on small ones."""
    xblock = min(1024, max(16, next_pow2(xnumel)))
    warps = 4 if xblock >= 512 else 2 if xblock >= 128 else 1
    return {"XBLOCK": xblock, "num_warps": warps if gpu else 1, "num_stages": 1}


class PointwiseKind(KernelKind):
    name = "pointwise"
    group_kind = "pointwise"
    variants = ("pointwise",)
    tie_order = variants
    config_keys = ("XBLOCK", "num_warps", "num_stages")

    def heuristic(self, group: KernelGroup, gpu: bool, arch: str = "") -> Point:
        return "pointwise", config_for(group.domain.xnumel, gpu)

    def space(self, kernel: dict[str, Any]) -> list[Point]:
        sizes = kernel.get("sizes", {})
        stages = int(kernel.get("config", {}).get("num_stages", 1))
        xs = clip(XBLOCKS, max(64, next_pow2(sizes.get("xnumel", 1))))
        return [("pointwise", {"XBLOCK": x, "num_warps": w, "num_stages": stages})
                for x, w in itertools.product(xs, WARPS)]

    def prune(self, variant: str, config: Config, sizes: dict[str, int], dtype: str,
              limits: BlockLimits) -> str | None:
        return prune_block(int(config.get("XBLOCK", 1)), int(config.get("num_warps", 4)), limits)

    def sweep(self, sizes: dict[str, int]) -> list[Point]:
        return [("pointwise", {"XBLOCK": x, "num_warps": w, "num_stages": 1})
                for x, w in ((512, 4), (1024, 4), (1024, 8), (2048, 8), (4096, 8))]

    def generate(self, group: KernelGroup, variant: str, is_buffer: Callable[[fx.Node], bool],
                 comment: list[str], int64: bool) -> Generated:
        return pointwise.generate(group, writer(set(group.members), is_buffer, int64), comment)

    def start(self, node: fx.Node, name: str, position: int) -> KernelGroup:
        """A value's kernel: over its shape, walking its memory's order."""
        m = meta(node)
        return KernelGroup(name, self.group_kind, Domain(m.shape, order=storage_order(m)), [node],
                           position, dtype=m.dtype)

    def joined(self, group: KernelGroup, node: fx.Node, reads: Reads) -> tuple[str, Domain] | None:
        """Any value of as many elements (it is read at the same flat index)."""
        if math.prod(meta(node).shape) != math.prod(group.domain.shape):
            return None
        return self.group_kind, group.domain


KIND = PointwiseKind()
