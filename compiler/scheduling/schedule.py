"""Schedules (`kiln.schedule/1`): fusion groups, each kernel's variant, config and source hash.

A schedule holds decisions, never code. Tuning changes `variant` (within a kernel's kind)
and `config`; the groups (`nodes`) come from the graph alone.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from compiler.codegen import kinds
from compiler.ir import KINDS

FORMAT = "kiln.schedule/1"
STATUSES = ("heuristic", "tuned")


class ScheduleMismatch(ValueError):
    """The schedule does not fit this graph or compiler: another graph, other fusion
    groups, or a kernel whose generated source differs from the recorded hash."""


def validate_config(kind: str, variant: str, config: dict[str, Any], sizes: dict[str, int],
                    name: str = "kernel") -> None:
    """Raise ValueError, naming the kernel and the key, for a config invalid for its kind
    (the kernel kind that computes `variant`: `compiler.codegen.kinds`)."""
    if kind not in KINDS:
        raise ValueError(f"{name}: unknown kind {kind!r}")
    if variant not in kinds.variants_of(kind):
        raise ValueError(f"{name}: variant {variant!r} is not one of {kinds.variants_of(kind)}")
    if not isinstance(config, dict):
        raise ValueError(f"{name}: config must be an object")
    kinds.kind_of(kind, variant).validate(variant, config, sizes, name)


@dataclass(frozen=True)
class KernelChoice:
    """One kernel of a schedule."""

    name: str
    kind: str
    variant: str
    nodes: tuple[str, ...]
    sizes: dict[str, int]
    dtype: str
    config: dict[str, int]
    source_hash: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "variant": self.variant,
                "nodes": list(self.nodes), "sizes": dict(self.sizes), "dtype": self.dtype,
                "config": dict(self.config), "source_hash": self.source_hash}

    @staticmethod
    def from_json(d: dict[str, Any]) -> KernelChoice:
        if not isinstance(d, dict):
            raise ValueError("kernel entry must be an object")
        try:
            choice = KernelChoice(
                name=_str(d["name"], "name"), kind=_str(d["kind"], "kind"),
                variant=_str(d["variant"], "variant"),
                nodes=tuple(_str(n, "nodes[]") for n in d["nodes"]),
                sizes={_str(k, "sizes"): int(v) for k, v in dict(d["sizes"]).items()},
                dtype=_str(d["dtype"], "dtype"), config=dict(d["config"]),
                source_hash=d.get("source_hash"))
        except KeyError as exc:
            raise ValueError(f"kernel entry lacks {exc.args[0]!r}") from None
        except (TypeError, AttributeError) as exc:
            raise ValueError(f"malformed kernel entry: {exc}") from None
        if choice.source_hash is not None and (
                not isinstance(choice.source_hash, str) or len(choice.source_hash) != 64):
            raise ValueError(f"{choice.name}: source_hash must be 64 hex digits or null")
        validate_config(choice.kind, choice.variant, choice.config, choice.sizes, choice.name)
        return choice


def _str(v: object, what: str) -> str:
    if not isinstance(v, str):
        raise ValueError(f"schedule field {what} must be a string, got {type(v).__name__}")
    return v


@dataclass(frozen=True)
class Schedule:
    """How to build one graph for one target."""

    graph_hash: str
    target: dict[str, Any]
    kernels: tuple[KernelChoice, ...]
    externs: tuple[str, ...] = ()
    status: str = "heuristic"

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "graph_hash": self.graph_hash, "target": dict(self.target),
                "status": self.status, "kernels": [k.to_json() for k in self.kernels],
                "externs": list(self.externs)}

    @staticmethod
    def from_json(d: dict[str, Any] | str | bytes) -> Schedule:
        """Parse and validate; raises ValueError naming what is wrong."""
        if isinstance(d, (str, bytes)):
            import json

            try:
                d = json.loads(d)
            except ValueError as exc:
                raise ValueError(f"schedule is not JSON: {exc}") from None
        if not isinstance(d, dict):
            raise ValueError("schedule must be a JSON object")
        if d.get("format") != FORMAT:
            raise ValueError(f"schedule format must be {FORMAT!r}, got {d.get('format')!r}")
        status = d.get("status", "heuristic")
        if status not in STATUSES:
            raise ValueError(f"schedule status must be one of {STATUSES}, got {status!r}")
        kernels = d.get("kernels")
        if not isinstance(kernels, list):
            raise ValueError("schedule kernels must be a list")
        target = d.get("target", {})
        if not isinstance(target, dict):
            raise ValueError("schedule target must be an object")
        externs = d.get("externs", [])
        if not isinstance(externs, list) or not all(isinstance(e, str) for e in externs):
            raise ValueError("schedule externs must be a list of op names")
        return Schedule(graph_hash=_str(d.get("graph_hash"), "graph_hash"), target=target,
                        kernels=tuple(KernelChoice.from_json(k) for k in kernels),
                        externs=tuple(externs), status=status)

    def with_kernel(self, name: str, **changes: Any) -> Schedule:
        """A copy with one kernel's fields replaced (e.g. variant, config, source_hash)."""
        kernels = tuple(replace(k, **changes) if k.name == name else k for k in self.kernels)
        if kernels == self.kernels and name not in {k.name for k in self.kernels}:
            raise KeyError(name)
        return replace(self, kernels=kernels)
