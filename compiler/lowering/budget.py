"""A build's price, from the graph alone, before any lowering: what a worker would spend.

Two things grow with a graph: code generation and the interpreter check, about linearly in
its ops; and fusion's join checks, each of which follows what the new member reads through
the group it joins (at most `fusion.MAX_GROUP_MEMBERS` members). Reductions are the realized
nodes that make groups long (the 1200-step sum/sub chain of issue 30), so the checks cost at
most `reductions x min(reductions, MAX_GROUP_MEMBERS)` member evaluations. An op the code
generator does not know by name is decomposed first and may hold reductions
(`native_layer_norm`, `_softmax`): it is priced as one.

The units are member evaluations; an op costs NODE_WEIGHT of them (on a 2-core box a
100,000-node relu chain, 1,000,000 units, builds in about a minute, the 1200-step chain,
about 100,000 units, in about 7 s).
"""

from __future__ import annotations

from dataclasses import dataclass

from compiler.codegen import rules
from compiler.lowering.fusion import MAX_GROUP_MEMBERS

NODE_WEIGHT = 10  # member evaluations one op of a graph costs in lowering, codegen and the check


@dataclass(frozen=True)
class BuildPrice:
    """What building one graph would take."""

    nodes: int
    reductions: int  # including ops decomposed before fusion (they may reduce)
    trial_members: int  # fusion's join checks: members evaluated, at most

    @property
    def cost(self) -> int:
        return NODE_WEIGHT * self.nodes + self.trial_members

    def describe(self) -> str:
        return (f"{self.cost:,} units: {self.nodes:,} nodes x {NODE_WEIGHT}, plus "
                f"{self.trial_members:,} fusion trial members for {self.reductions:,} reductions")


class BuildRefused(ValueError):
    """The graph's build costs more than the budget allows; the same graph is refused the
    same way every time."""


def _reduces(op: str) -> bool:
    parts = op.split(".")
    name = parts[1] if len(parts) > 1 else op
    rule = rules.RULES.get(name)
    return rule is None or rule.kind == "reduction"


def price(graph: object) -> BuildPrice:
    """The price of building `graph` (a `compiler.Graph`)."""
    nodes = graph.nodes  # type: ignore[attr-defined]
    reductions = sum(1 for n in nodes if _reduces(n.op))
    return BuildPrice(len(nodes), reductions, reductions * min(reductions, MAX_GROUP_MEMBERS))


def check(graph: object, max_cost: int) -> BuildPrice:
    """`price(graph)`, or `BuildRefused` naming the limit and the graph's size when it
    exceeds `max_cost` (0: no limit)."""
    found = price(graph)
    if max_cost and found.cost > max_cost:
        raise BuildRefused(f"the graph's build would cost {found.describe()}; more than the "
                           f"build budget of {max_cost:,} (KILN_MAX_BUILD_COST)")
    return found
