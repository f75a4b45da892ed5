"""What every kernel kind provides (`KernelKind`), and the pieces the kinds share.

A kind is one way to compute a kernel group of the IR (`KernelGroup.kind`: pointwise,
reduction or matmul): a Triton template or an ATen call. It owns its variants (the names
a schedule's `variant` takes), its config keys and their validation, its heuristic
config, its tuning space and pruning, its launch grid and its generator, and its fusion
rules: the kernel a node starts (`start`), the shape of a kernel that takes another node
(`joined`) and whether it can compute it there (`can_fuse`), all over metadata, no code
generated. The registry (`compiler.codegen.kinds`) maps group kinds and variant names to
kinds; schedules, the heuristic, fusion, the runtime, the tuner and the GPU checks loop
over it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from torch import fx

from compiler.codegen import rules
from compiler.codegen.access import Reads
from compiler.codegen.writer import Generated, Writer
from compiler.ir import Domain, KernelGroup

MAX_BLOCK_NUMEL = 1 << 20  # Triton's limit on the elements of one block
WARPS = (1, 2, 4, 8, 16, 32)
# Elements a thread may hold live in registers for one tensor of the block; past this it spills.
MAX_ELEMENTS_PER_THREAD = 64

Config = dict[str, int]
Point = tuple[str, Config]  # (variant, config): one point of a tuning space


class BlockLimits(Protocol):
    """The target's per-block limits that pruning reads (`compiler.codegen.limits.TargetLimits`)."""

    shared_memory: int
    max_threads: int
    max_block_elements: int


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (1 for n <= 1)."""
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def clip(domain: tuple[int, ...], upper: int) -> list[int]:
    """Values of a domain up to `upper` (always at least the smallest)."""
    kept = [v for v in domain if v <= upper]
    return kept or [domain[0]]


def writer(members: set[fx.Node], is_buffer: Callable[[fx.Node], bool], int64: bool) -> Writer:
    """A Writer for one kernel, evaluating nodes with the op registry's rules."""
    return Writer(members=members, is_buffer=is_buffer, int64=int64, evaluate=rules.evaluate)


class KernelKind:
    """One kind of kernel. Subclasses set the class attributes and override the methods
    that apply; the defaults describe a Triton template with blocks and launch options."""

    name: str = ""  # the registry's name of this kind
    group_kind: str = ""  # the IR group kind it computes (compiler.ir.KINDS)
    variants: tuple[str, ...] = ()  # schedule variant names, unique across kinds
    tie_order: tuple[str, ...] = ()  # variants in tie-break order (default: `variants`)
    config_keys: tuple[str, ...] = ()
    # The node kind (`rules.NodeKind.name`) whose nodes start a kernel of this kind as its
    # anchor; None: the kind that values (pointwise, index) start.
    anchor_op: str | None = None
    anchor_joins: bool = True  # False: a node of `anchor_op` always starts its own kernel
    siblings: bool = False  # an anchor joins a kernel of this kind that reads what it reads
    configurable: bool = True  # False: the schedule's config does not apply to it
    keeps_config_of: str | None = None  # variant whose config a schedule keeps for this one
    library: bool = False  # the kernel's main work is an ATen (library) call

    def alongside(self, group: KernelGroup, node: fx.Node) -> bool:
        """Whether anchor `node` may join `group` of this kind though the two read nothing
        in common: only a launch is saved (default: never)."""
        return False

    def serves(self, group: KernelGroup) -> bool:
        """Whether this kind can compute `group` at all (its group kind aside): a kind made
        for one pattern of group serves only those, and never refuses a fusion."""
        return True

    def validate(self, variant: str, config: dict[str, Any], sizes: dict[str, int], name: str) -> None:
        """Raise ValueError, naming the kernel and the key, for a config invalid for this kind."""
        validate_keys(self.config_keys, config, name)

    def heuristic(self, group: KernelGroup, gpu: bool, arch: str = "") -> Point | None:
        """(variant, config) chosen without measuring, or None when this kind leaves the
        group to the next kind serving it; `arch` names the GPU class (`sm_90`), or is empty."""
        raise NotImplementedError

    def space(self, kernel: dict[str, Any]) -> list[Point]:
        """Every (variant, config) of a schedule kernel (its JSON entry), clipped to its
        sizes, unpruned."""
        raise NotImplementedError

    def prune(self, variant: str, config: Config, sizes: dict[str, int], dtype: str,
              limits: BlockLimits) -> str | None:
        """Why this point cannot (or should not) run on a target with `limits`, or None."""
        return None

    def sweep(self, sizes: dict[str, int]) -> list[Point]:
        """A few points around the heuristic's, for a quick GPU check (bench.gpu_check)."""
        return []

    def launch_config(self, group: KernelGroup, config: Config, gpu: bool) -> Config:
        """The block sizes and launch options its generated kernel launches with."""
        return dict(config)

    def grid(self, group: KernelGroup, variant: str, config: Config) -> tuple[int, ...]:
        """The launch grid of its generated kernel under `config` (a launch config)."""
        return (cdiv(group.sizes["xnumel"], config["XBLOCK"]),)

    def elements(self, group: KernelGroup) -> int:
        """The largest flat index its kernel computes (past 2**31 - 1: 64-bit indexing)."""
        d = group.domain
        return d.xnumel * max(d.rnumel, 1)

    def generate(self, group: KernelGroup, variant: str, is_buffer: Callable[[fx.Node], bool],
                 comment: list[str], int64: bool) -> Generated:
        """The Triton module of `group` in `variant`."""
        raise NotImplementedError

    def start(self, node: fx.Node, name: str, position: int) -> KernelGroup:
        """The kernel `node` starts (one of `anchor_op`'s, or a value for the value kind)."""
        raise NotImplementedError

    def joined(self, group: KernelGroup, node: fx.Node, reads: Reads) -> tuple[str, Domain] | None:
        """The group kind and domain `group` would have with `node` added (this kind
        serves `group`, or anchors `node`), or None when the shapes do not fit; fusion asks
        only nodes that read something `group` computes. By default: none fits."""
        return None

    def can_fuse(self, group: KernelGroup, node: fx.Node, reads: Reads) -> bool:
        """Whether this kind can compute `group` (of its group kind) with its new last
        member `node`, from metadata alone (`reads`: no code is generated): every anchor
        `node` reads (a reduction's result, a matmul's accumulator) read at the anchor's
        own index, and every member where the kernel computes it. The members before
        `node` passed when they joined, and cannot read it. By default: only a kernel
        without anchors (nothing is valid at one index alone)."""
        return not group.anchors


def validate_keys(keys: tuple[str, ...], config: dict[str, Any], name: str) -> None:
    """The checks every Triton template's config passes: exactly `keys`, integers, a
    warp count and stage count Triton takes, power-of-two block sizes."""
    missing = [k for k in keys if k not in config]
    extra = [k for k in config if k not in keys]
    if missing or extra:
        raise ValueError(f"{name}: config keys must be {list(keys)} (missing {missing}, unknown {extra})")
    for key in keys:
        value = config[key]
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"{name}: config {key} must be an integer, got {value!r}")
    if config["num_warps"] not in WARPS:
        raise ValueError(f"{name}: num_warps must be one of {WARPS}, got {config['num_warps']}")
    if not 1 <= config["num_stages"] <= 8:
        raise ValueError(f"{name}: num_stages must be in 1..8, got {config['num_stages']}")
    blocks = [k for k in keys if k.endswith("BLOCK") or k.startswith("BLOCK")]
    for key in blocks:
        if not pow2(config[key]) or config[key] > MAX_BLOCK_NUMEL:
            raise ValueError(f"{name}: {key} must be a power of two <= {MAX_BLOCK_NUMEL}, got {config[key]}")


def prune_block(elements: int, warps: int, limits: BlockLimits) -> str | None:
    """Why a block of `elements` over `warps` warps should not run, or None."""
    threads = warps * 32
    if elements > limits.max_block_elements:
        return f"block of {elements} elements exceeds {limits.max_block_elements}"
    if elements // threads > MAX_ELEMENTS_PER_THREAD:
        return f"{elements // threads} elements per thread would spill registers"
    if elements < threads and warps > 1:
        return f"block of {elements} elements leaves {threads} threads idle"
    return None
