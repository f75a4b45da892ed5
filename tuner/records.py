"""The records every tuner role passes around: a candidate and its measurement.

Roles exchange lists of these (TVM MetaSchedule style: batch-shaped, errors carried as data),
so a crash, a timeout or a wrong answer is a `Measurement` with a reason, never an exception.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from compiler.codegen import kinds

# Fixed orders make every tie-break reproducible across processes and machines; the
# variants' order is the kinds registry's (`compiler.codegen.kinds.variant_order`).
CONFIG_KEY_ORDER = (
    "XBLOCK",
    "RBLOCK",
    "BLOCK_M",
    "BLOCK_N",
    "BLOCK_K",
    "GROUP_M",
    "num_warps",
    "num_stages",
)

# Reasons a candidate has no time (the `error` field starts with one of these words).
CRASH = "crash"
TIMEOUT = "timeout"
OUT_OF_RESOURCES = "out_of_resources"
WRONG_ANSWER = "wrong_answer"
BUILD_ERROR = "build_error"
RUN_ERROR = "run_error"


def configurable(variant: str) -> bool:
    """Whether a variant's kind takes a config (an ATen call's does not; unknown: yes)."""
    kind = kinds.kind_of_variant(variant)
    return kind is None or kind.configurable


def library_call(variant: str) -> bool:
    """Whether a variant's kind is an ATen (library) call: the bar its group's Triton
    configs must clear."""
    kind = kinds.kind_of_variant(variant)
    return kind is not None and kind.library


def stand_in(variant: str) -> str | None:
    """The variant whose config a schedule keeps for `variant` (an ATen call keeps the
    Triton template's), or None."""
    kind = kinds.kind_of_variant(variant)
    return kind.keeps_config_of if kind is not None else None


def _config_order_key(config: dict[str, Any]) -> tuple:
    known = tuple(int(config.get(k, -1)) for k in CONFIG_KEY_ORDER)
    extra = tuple(sorted((k, str(v)) for k, v in config.items() if k not in CONFIG_KEY_ORDER))
    return known + extra


@dataclass(frozen=True)
class Candidate:
    """One point of a kernel's search space: a variant and its config."""

    kernel: str
    variant: str
    config_items: tuple[tuple[str, Any], ...]

    @classmethod
    def make(cls, kernel: str, variant: str, config: dict[str, Any]) -> Candidate:
        """Build a candidate from a config dict (stored sorted, so equal configs compare equal)."""
        return cls(kernel, variant, tuple(sorted(config.items())))

    @classmethod
    def of_kernel(cls, kernel: dict[str, Any]) -> Candidate:
        """A schedule kernel's own point (`Schedule.to_json()["kernels"]` entry); a kind
        whose config does not apply (an ATen call) gives a candidate without one."""
        config = dict(kernel.get("config", {})) if configurable(kernel["variant"]) else {}
        return cls.make(kernel["name"], kernel["variant"], config)

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.config_items)

    def order_key(self) -> tuple:
        """Fixed total order used to break ties: variant order, then config values, small first."""
        order = kinds.variant_order()
        rank = order.index(self.variant) if self.variant in order else 99
        return (self.kernel, rank, self.variant, _config_order_key(self.config))

    def label(self) -> str:
        """Short human-readable form for tables and logs."""
        if not configurable(self.variant):
            return self.variant
        cfg = self.config
        parts = [f"{k}={cfg[k]}" for k in CONFIG_KEY_ORDER if k in cfg]
        parts += [f"{k}={v}" for k, v in sorted(cfg.items()) if k not in CONFIG_KEY_ORDER]
        return f"{self.variant}({', '.join(parts)})"

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "variant": self.variant, "config": self.config}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Candidate:
        return cls.make(d["kernel"], d["variant"], dict(d["config"]))


@dataclass
class Measurement:
    """What one trial of one candidate gave: a time, or an error saying why there is none."""

    candidate: Candidate
    ms: float | None = None
    error: str | None = None
    verified: bool = False
    noise: float = 0.0  # half-width of the spread of the repeats, in ms
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.ms is not None and self.error is None and self.verified

    @property
    def reason(self) -> str | None:
        """The error's leading reason word (`crash`, `timeout`, ...), or None when it ran."""
        if self.error is None:
            return None
        return self.error.split(":", 1)[0]

    def to_json(self) -> dict[str, Any]:
        """The contract's measurement dict (docs/contracts.md "Tuning results")."""
        return {
            "kernel": self.candidate.kernel,
            "variant": self.candidate.variant,
            "config": self.candidate.config,
            "ms": self.ms,
            "error": self.error,
            "verified": self.verified,
        }


def canonical(obj: Any) -> str:
    """Canonical JSON text (sorted keys): the form compared or hashed across processes."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))
