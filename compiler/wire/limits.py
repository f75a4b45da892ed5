"""Size limits of the kiln.graph/1 wire format, in one place.

Every limit has a default and an environment override (`KILN_MAX_BODY_BYTES`, ...), read
each time `limits()` is called so that a test or a deployment can change them without
re-importing anything.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields


@dataclass(frozen=True)
class WireLimits:
    """The largest wire graph kiln accepts; anything past one limit is a `WireError`."""

    max_body_bytes: int = 16 * 1024 * 1024  # JSON text of one graph
    max_nodes: int = 100_000  # inputs + nodes
    max_rank: int = 16  # dimensions of any tensor
    max_numel: int = 2**34  # elements (and storage extent) of any tensor
    max_nesting: int = 16  # list depth inside one argument
    max_constant_bytes: int = 1024 * 1024  # all inline constants together
    max_name_chars: int = 128  # node and input names
    max_str_chars: int = 1024  # string arguments
    # Work of validation (meta execution): each node's price from schema.meta_cost
    # (1 = a cheap op, about 0.1 ms) summed before anything runs, and a wall-clock bound.
    max_validation_cost: int = 200_000
    max_validation_ms: int = 20_000
    max_total_numel: int = 2**44  # elements of all results together (intermediates counted)


_ENV_PREFIX = "KILN_"


def limits() -> WireLimits:
    """The limits in force: defaults, each overridden by `KILN_<FIELD>` when set.

    Raises `ValueError` when an override is not a positive integer.
    """
    overrides: dict[str, int] = {}
    for field in fields(WireLimits):
        raw = os.environ.get(_ENV_PREFIX + field.name.upper())
        if raw is None:
            continue
        try:
            value = int(raw)
        except ValueError:
            value = 0
        if value <= 0:
            raise ValueError(
                f"{_ENV_PREFIX}{field.name.upper()}={raw!r} must be a positive integer"
            )
        overrides[field.name] = value
    return WireLimits(**overrides)
