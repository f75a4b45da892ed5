"""The library call with its activation: an addmm whose only use is a ReLU or a tanh-GELU
runs as one cuBLASLt call with that epilogue (`torch._addmm_activation`), variant
`aten_act`, and no kernel of its own.

The `aten` kind runs the addmm into a buffer and its activation as a pointwise kernel that
reads it back: on an H200, GPT-2's 4096x768x3072 MLP product with its bias took 34.5 us and
the GELU kernel after it 13.6 us more; with the GELU in cuBLASLt's epilogue the call took
38.6 us (`torch._addmm_activation`, L2 flushed). The epilogue applies the activation to the
fp32 accumulator before rounding, where the two-kernel path rounds the product first: its
error against a float64 reference was 0.0017 against 0.0024 (relative, bf16).

A group qualifies when its anchor is `addmm(bias, a, b)` (a 1-D bias, no scaling) whose
result nothing else reads, and its epilogue is a function of that result alone that equals
ReLU or the tanh approximation of GELU (HF GPT-2's `gelu_new`, `gelu(approximate="tanh")`):
the chain is evaluated in float64 on probe values, so any spelling of either matches and
the exact (erf) GELU, 4.7e-4 away at its farthest, does not. The call itself is
`compiler.runtime.library_calls.AddmmActivation`.

The heuristic takes it on a GPU where the library call beats the template (as `aten`);
the tuner's space holds it beside `aten` and the template for the kernels whose heuristic
it is.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from compiler.codegen.common import Unsupported
from compiler.codegen.kinds import aten as aten_kind
from compiler.codegen.kinds.base import Config, Point
from compiler.codegen.writer import Generated
from compiler.ir import KernelGroup, contiguous_strides, meta

aten = torch.ops.aten

# Casts are identities in the float64 probe (the chain's rounding is not what is compared).
_CASTS = (torch.ops.prims.convert_element_type.default, aten._to_copy.default)
# Row-major to row-major reshapes (GPT-2's Conv1D views the 2-D product back to 3-D).
_RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
_PROBE = torch.cat([torch.linspace(-12.0, 12.0, 4801, dtype=torch.float64),
                    torch.tensor([0.0, -0.0, 1e-6, -1e-6, 30.0, -30.0], dtype=torch.float64)])
_SQRT_2_OVER_PI = (2.0 / torch.pi) ** 0.5


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x ** 3)))


# The activations `compiler.runtime.library_calls.AddmmActivation` runs, by name.
REFERENCES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": torch.relu, "gelu_tanh": _gelu_tanh}


def activation_of(group: KernelGroup) -> tuple[str, fx.Node] | None:
    """(activation name, the node it computes) when `group` qualifies (module docstring)."""
    if group.kind != "matmul" or len(group.anchors) != 1:
        return None
    mm = group.anchors[0]
    if mm.target is not aten.addmm.default or mm.kwargs or len(mm.args) != 3:
        return None
    bias, a, b = mm.args
    if not all(isinstance(v, fx.Node) for v in (bias, a, b)):
        return None
    out, bias_meta = meta(mm), meta(bias)
    if (len(meta(a).shape) != 2 or len(meta(b).shape) != 2 or len(out.shape) != 2
            or bias_meta.shape != (out.shape[1],) or bias_meta.stride != (1,)
            or bias_meta.dtype != out.dtype or not out.dtype.is_floating_point):
        return None
    if mm in group.stored or len(group.stored) != 1:
        return None
    (result,) = group.stored
    chain = _downstream(mm, set(group.members) | set(group.inlined))
    if result not in chain or meta(result).dtype != out.dtype:
        return None
    for node in chain:
        if any(i is not mm and i not in chain for i in node.all_input_nodes):
            return None  # reads another tensor: not a function of the product alone
    key = _chain_key(mm, chain, result)
    name = _MATCHED.get(key, _UNSEEN)
    if name is _UNSEEN:
        name = _match(_probe(mm, chain, result))
        if len(_MATCHED) >= MATCHED_SIZE:
            _MATCHED.clear()
        _MATCHED[key] = name
    return None if name is None else (name, result)


# Epilogues already probed, by their ops: the heuristic, generation and the build each ask,
# and a model repeats one epilogue in every layer (GPT-2: twelve GELUs).
_MATCHED: dict[tuple[Any, ...], str | None] = {}
MATCHED_SIZE = 256
_UNSEEN = object()


def _match(probe: torch.Tensor | None) -> str | None:
    """The activation `probe` (the chain at the probe points) computes, or None."""
    if probe is None:
        return None
    for name, reference in REFERENCES.items():
        if torch.allclose(probe, reference(_PROBE), rtol=1e-9, atol=1e-12):
            return name
    return None


def _chain_key(mm: fx.Node, chain: list[fx.Node], result: fx.Node) -> tuple[Any, ...]:
    """What `_probe` computes from: each node's op, arguments (nodes by position in the
    chain, the product as -1) and metadata, and which node is the result."""
    position = {node: i for i, node in enumerate(chain)}
    position[mm] = -1

    def arg(value: Any) -> Any:
        if isinstance(value, fx.Node):
            return ("node", position.get(value))
        if isinstance(value, (list, tuple)):
            return tuple(arg(v) for v in value)
        return (type(value).__name__, repr(value))

    def described(node: fx.Node) -> tuple[Any, ...]:
        m = meta(node)
        return (str(node.target), arg(node.args), tuple(sorted((k, arg(v)) for k, v in
                node.kwargs.items())), m.shape, m.stride, str(m.dtype))

    head = meta(mm)
    return ((head.shape, head.stride, str(head.dtype)), tuple(described(n) for n in chain),
            position[result])


def _downstream(mm: fx.Node, nodes: set[fx.Node]) -> list[fx.Node]:
    """The nodes of `nodes` computed from `mm` through `nodes`, each after its inputs (a
    walk over users: a graph of thousands of nodes is not scanned once per matmul)."""
    found: list[fx.Node] = []
    seen = {mm}
    todo = [mm]
    while todo:
        for user in todo.pop().users:
            if user in nodes and user not in seen:
                seen.add(user)
                found.append(user)
                todo.append(user)
    ordered: list[fx.Node] = []
    placed = {mm}
    while found:
        ready = [n for n in found if all(i in placed or i not in seen for i in n.all_input_nodes)]
        if not ready:
            return []  # not reachable in a graph; nothing qualifies
        for node in ready:
            ordered.append(node)
            placed.add(node)
            found.remove(node)
    return ordered


def _probe(mm: fx.Node, chain: list[fx.Node], result: fx.Node) -> torch.Tensor | None:
    """The chain's value at the probe points, in float64 (None: it is not elementwise over
    row-major values of the product's element count)."""
    env: dict[fx.Node, Any] = {mm: _PROBE}
    for node in chain:
        m = meta(node)
        if m.numel != meta(mm).numel or m.stride != contiguous_strides(m.shape):
            return None
        if node.target in _CASTS or node.target in _RESHAPES:  # the elements stay in order
            env[node] = env[node.args[0]]
            continue
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: env[n])
        try:
            value = node.target(*args, **kwargs)
        except Exception:  # noqa: BLE001 - an op that needs the real shape: no match
            return None
        if not isinstance(value, torch.Tensor) or value.shape != _PROBE.shape:
            return None
        env[node] = value.to(torch.float64)
    return env[result]


class AtenActivationKind(aten_kind.AtenKind):
    """The `aten` kind's group, fusion and config rules; its own variant, claim and call."""

    name = "aten_act"
    variants = ("aten_act",)
    tie_order = variants

    def serves(self, group: KernelGroup) -> bool:
        return activation_of(group) is not None

    def heuristic(self, group: KernelGroup, gpu: bool, arch: str = "") -> Point | None:
        """Where the `aten` kind would claim the group and the epilogue qualifies."""
        point = super().heuristic(group, gpu, arch)
        if point is None or not self.serves(group):
            return None
        return "aten_act", point[1]

    def space(self, kernel: dict[str, Any]) -> list[Point]:
        """Itself, for the kernels whose heuristic it is (a schedule entry does not say
        whether a group's epilogue qualifies; the heuristic saw the group)."""
        return [("aten_act", {})] if kernel.get("variant") == "aten_act" else []

    def sweep(self, sizes: dict[str, int]) -> list[Point]:
        return []

    def launch_config(self, group: KernelGroup, config: Config, gpu: bool) -> Config:
        return {}  # nothing is launched

    def grid(self, group: KernelGroup, variant: str, config: Config) -> tuple[int, ...]:
        return ()

    def generate(self, group: KernelGroup, variant: str, is_buffer: Callable[[fx.Node], bool],
                 comment: list[str], int64: bool) -> Generated:
        """No kernel: a source that names the call, for the schedule's source hash."""
        found = activation_of(group)
        if found is None:
            raise Unsupported(f"{group.name}: not an addmm whose only use is a ReLU or a tanh-GELU")
        lines = [f"# {line}" for line in comment]
        lines.append(f"# one library call: torch._addmm_activation ({found[0]}) on a GPU")
        return Generated(group.stem, "\n".join(lines) + "\n", [], [], [])


KIND = AtenActivationKind()
