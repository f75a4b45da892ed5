"""Which nodes become kernels, and which kernels fuse: decided from the graph and the op
registry's metadata alone (no code is generated while planning).

1. classify each node (`rules.node_kind`: input, pointwise, view, index, reduction, matmul,
   extern), from each op rule's declared refusals;
2. realize: anchors (reductions, matmuls), ATen calls, graph outputs and the arguments of
   nodes that read memory get buffers, and so does a windowed value (pooling) that another
   reads at so many positions that inlining would unroll more than `MAX_INLINED_LOADS`
   loads; every other pointwise/view/index node is inlined into the kernels that read it;
3. group the realized nodes in topological order: a node joins an earlier related kernel
   (it reads the kernel's members or what they read, or, for kinds that join siblings,
   the same producers, or the kind takes it alongside: split reductions' first stages of
   one domain, a LayerNorm's column sums beside a bias gradient's) when its inputs are
   ready before that kernel runs and the kernel registry accepts it (`kinds.fuse`: the
   shape of the grown kernel from the kind the node anchors or the kind serving the
   kernel, then each serving kind's `can_fuse`, which follows the node's declared reads
   to check that it reads every anchor at the anchor's own index,
   `compiler.codegen.access`); otherwise it starts a kernel (`kinds.start`);
4. a value that step 3 left inlined into two or more kernels (each would recompute it) is
   realized and the nodes grouped again, unless it is cheap: a few ops reading at most one
   large buffer the graph computes, and not inside another such value. Otherwise a chain
   of them (a transformer's residual stream, x = x + f(x) per layer) would make each
   layer's kernel recompute every layer before it. A realized value joins one kernel like
   any other member, which stores it only when another kernel reads it, so
   single-consumer fusion (prologues, epilogues) is unchanged;
5. each kernel records the memory its fusion saves (`KernelGroup.fused_bytes`).

Planning names no node kind or kernel kind: it reads `NodeKind` flags and asks the kernel
registry. It is near-linear in the graph's size. A kernel takes at most MAX_GROUP_MEMBERS
realized nodes, so that a chain of n reductions cannot grow one group whose joins each
look over the whole of it (the 1200-step sum/sub chain of issue 30 ran for minutes). A node
that a full group refuses reads the lazy values it shares with that group from it: they
are realized into the full group at once (a cut, outside the count), and the round is
planned again with them; left lazy, the next kernel would recompute the whole chain
before it, and every round would move the cut by one kernel. Each group's member set and
reads are kept as it grows instead of being gathered again for every candidate join.
`Planner.trials` and `Planner.trial_members` count the kinds' checks of what a joining
node reads of a kernel's anchors, and the members of the kernels they asked about.
"""

from __future__ import annotations

from collections import Counter

from torch import fx
from torch.utils._pytree import tree_flatten

from compiler.codegen import kinds
from compiler.codegen.access import Checks, Reads, input_reads
from compiler.codegen.common import dim_names
from compiler.codegen.pooling import MAX_WINDOW
from compiler.codegen.rules import NodeKind, node_kind
from compiler.ir import ExternStep, KernelGroup, Step, ViewStep, meta

CHEAP_OPS = 4  # a value several kernels read may be recomputed by each: up to this many ops
# Realized nodes one kernel may take; a node that would join a full group starts its own.
# Far above any model's fused kernel (a layer norm's backward has a dozen), it bounds what a
# join's check costs (see the module's docstring).
MAX_GROUP_MEMBERS = 64


def classify(gm: fx.GraphModule) -> dict[fx.Node, NodeKind]:
    """Kind of every node of `gm`, from the op registry's metadata (`rules.node_kind`)."""
    return {node: node_kind(node) for node in gm.graph.nodes}


def plan_steps(gm: fx.GraphModule) -> tuple[list[Step], set[fx.Node]]:
    """The ordered steps (kernels, ATen calls, views) that compute `gm`, and the set of
    nodes whose values live in buffers."""
    nodes = list(gm.graph.nodes)
    planner = Planner(classify(gm), nodes)
    steps = planner.run()
    return steps, planner.sources | planner.realized


class Planner:
    """The fusion plan of one graph (`run`), with counts of the work it took."""

    def __init__(self, kinds: dict[fx.Node, NodeKind], nodes: list[fx.Node]) -> None:
        self.kinds, self.nodes = kinds, nodes
        out = nodes[-1]
        self.outputs = [a for a in tree_flatten(out.args)[0] if isinstance(a, fx.Node)]
        self.realized = {n for n in nodes if kinds[n].realized}
        self.sources = {n for n in nodes if kinds[n].source}
        self.aliases: set[fx.Node] = set()
        self.deps_cache: dict[fx.Node, frozenset[fx.Node]] = {}
        # per group of the round being planned, by name: its members and what they read
        self.member_sets: dict[str, set[fx.Node]] = {}
        self.reads: dict[str, set[fx.Node]] = {}
        self.counted: dict[str, int] = {}  # members toward MAX_GROUP_MEMBERS (cuts left out)
        self.cut_count: dict[str, int] = {}
        self.cuts: set[fx.Node] = set()  # realized because a full group refused their reader
        self.recut = False  # this round realized cuts: its groups are provisional
        self.checks = Checks()  # the kernel kinds' checks of joins (`KernelKind.can_fuse`)

    @property
    def trials(self) -> int:
        """Checks of what a joining node reads of a kernel's anchors."""
        return self.checks.checks

    @property
    def trial_members(self) -> int:
        """Members of the kernels those checks asked about, together."""
        return self.checks.members

    def is_buffer(self, node: fx.Node) -> bool:
        return node in self.sources or node in self.realized

    def need_buffer(self, node: fx.Node) -> None:
        while self.kinds[node].view:
            self.aliases.add(node)
            node = node.args[0]
        if self.kinds[node].lazy:
            self.realized.add(node)

    def realize_inner_windows(self, node: fx.Node) -> None:
        """Give a buffer to a lazy value that `node` reads at several positions when
        inlining it there would unroll more than `MAX_INLINED_LOADS` loads (the positions
        times the value's own window). A max pooling's indices read by its backward in the
        same graph: resnet's 3x3 stride-2 window is 4 candidates of 9 loads and stays
        inlined; a dilated 3x3 window at stride 1 is 25 candidates of 9, a 1,600-line kernel
        that ptxas compiled for minutes."""
        for arg, count in _positions(node).items():
            if count > 1 and self.kinds[arg].lazy and self.kinds[arg].windows:
                inner = max(_positions(arg).values(), default=1)
                if count * inner > MAX_INLINED_LOADS:
                    self.need_buffer(arg)

    def deps(self, node: fx.Node) -> frozenset[fx.Node]:
        """Buffers that computing `node` (inlining lazy inputs) reads."""
        # Lazy inputs first, deepest first, with an explicit stack: a chain of thousands of
        # inlined ops must not meet Python's recursion limit.
        todo = [a for a in node.all_input_nodes if not self.is_buffer(a) and a not in self.deps_cache]
        while todo:
            arg = todo[-1]
            if arg in self.deps_cache:
                todo.pop()
                continue
            missing = [a for a in arg.all_input_nodes
                       if not self.is_buffer(a) and a not in self.deps_cache]
            if missing:
                todo.extend(missing)
                continue
            todo.pop()
            self.deps_cache[arg] = self._direct_deps(arg)
        return self._direct_deps(node)

    def _direct_deps(self, node: fx.Node) -> frozenset[fx.Node]:
        # every lazy input of `node` is in deps_cache already
        found: set[fx.Node] = set()
        for arg in node.all_input_nodes:
            found |= {arg} if self.is_buffer(arg) else self.deps_cache[arg]
        return frozenset(found)

    def run(self) -> list[Step]:
        for n in self.outputs:
            self.need_buffer(n)
        for n in self.nodes:
            if self.kinds[n].reads_memory:
                for a in n.all_input_nodes:
                    self.need_buffer(a)
            if self.kinds[n].windows:
                self.realize_inner_windows(n)
        while True:  # ends: every round realizes at least one more node
            steps, groups = self.group()
            shared = set() if self.recut else self.shared_values(groups)
            if self.recut:
                self.recut = False
                self.deps_cache.clear()
                continue
            if not shared:
                break
            self.realized |= shared
            self.deps_cache.clear()
        self.mark_stored(groups, steps)
        return steps

    def group(self) -> tuple[list[Step], list[KernelGroup]]:
        steps: list[Step] = []
        groups: list[KernelGroup] = []
        position: dict[fx.Node, int] = dict.fromkeys(self.sources, -1)
        for table in (self.member_sets, self.reads, self.counted, self.cut_count):
            table.clear()
        self.checks.new_round()
        for node in self.nodes:
            kind = self.kinds[node]
            if node in self.aliases:
                steps.append(ViewStep(node))
                position[node] = len(steps) - 1
                continue
            if kind.extern:
                steps.append(ExternStep(node))
                position[node] = len(steps) - 1
                continue
            if node not in self.realized:
                continue
            deps = self.deps(node)
            group = self.join(node, kind, deps, groups, position)
            if self.recut:  # a cut made `node` read a value it inlined before
                deps = self.deps(node)
            if group is None:
                group = kinds.start(node, kind, f"kernel_{len(steps)}", len(steps))
                groups.append(group)
                steps.append(group)
                self.member_sets[group.name], self.reads[group.name] = set(), set()
                self.counted[group.name] = self.cut_count[group.name] = 0
            self.add_member(group, node, deps, position)
            self.counted[group.name] += node not in self.cuts
        return steps, groups

    def shared_values(self, groups: list[KernelGroup]) -> set[fx.Node]:
        """Lazy values that two or more of `groups` would each compute, to be realized: those
        not cheap, and those inside another such value (recomputing them would nest) unless
        they read no large computed buffer at all (a few ops on graph inputs)."""
        reach: dict[fx.Node, set[int]] = {}
        for i, group in enumerate(groups):
            for n in self.closure(group):
                reach.setdefault(n, set()).add(i)

        def handed_on(n: fx.Node) -> bool:  # a later value reaching the same kernels exists
            return any(reach.get(u) == reach[n] and (not self.kinds[u].view or handed_on(u))
                       for u in n.users)

        # Of a chain of values that reach the same kernels, the last: the ones before it
        # feed one kernel once it is realized (a later round takes any that still do not).
        shared = {n for n, kernels in reach.items()
                  if len(kernels) > 1 and self.kinds[n].lazy
                  and not handed_on(n)}
        nested = shared & self.upstream(shared)
        return {n for n in shared if not self.cheap(n, computed_reads=0)
                and (n in nested or not self.cheap(n, computed_reads=1))}

    def upstream(self, nodes: set[fx.Node]) -> set[fx.Node]:
        """Lazy nodes that computing `nodes` evaluates, `nodes` themselves left out."""
        found: set[fx.Node] = set()
        todo = [a for n in nodes for a in n.all_input_nodes]
        while todo:
            a = todo.pop()
            if a not in found and not self.is_buffer(a):
                found.add(a)
                todo.extend(a.all_input_nodes)
        return found

    def ops(self, node: fx.Node, limit: int) -> int:
        """Ops (views are free) that computing `node` evaluates, counted up to limit + 1."""
        count, seen, todo = 0, {node}, [node]
        while todo and count <= limit:
            n = todo.pop()
            count += not self.kinds[n].view
            for a in n.all_input_nodes:
                if a not in seen and not self.is_buffer(a):
                    seen.add(a)
                    todo.append(a)
        return count

    def cheap(self, node: fx.Node, computed_reads: int) -> bool:
        """At most CHEAP_OPS ops, reading at most `computed_reads` buffers that the graph
        computes and that are as large as `node` (graph inputs, constants and smaller
        buffers, a bias or a row's max, are free). With one, each kernel that recomputes it
        reads what it would read from a stored copy; a value made of two large computed
        ones (x = x + f(x)) is not cheap, so recomputation cannot compound along a chain."""
        numel = meta(node).numel
        large = [d for d in self.deps(node) if d not in self.sources and meta(d).numel >= numel]
        return len(large) <= computed_reads and self.ops(node, CHEAP_OPS) <= CHEAP_OPS

    def join(self, node: fx.Node, kind: NodeKind, deps: frozenset[fx.Node], groups: list[KernelGroup],
             position: dict[fx.Node, int]) -> KernelGroup | None:
        if not kinds.joins(kind):
            return None
        for group in reversed(groups):
            if not self.follows(group, deps, position):
                continue
            members = self.member_sets[group.name]
            reads = self.reads[group.name]
            related = bool(deps & members) or bool(deps & reads) or (
                kinds.joins_siblings(kind, group)
                and bool(_producers(deps, position) & _producers(reads, position))) or \
                kinds.joins_alongside(kind, group, node)
            if not related:
                continue
            if self.counted[group.name] >= MAX_GROUP_MEMBERS and node not in self.cuts:
                self.cut(node, group, position)
                continue
            grown = kinds.fuse(group, node, Reads(self.is_buffer, deps, kind, self.checks))
            if grown is None:
                continue
            _take(group, grown)
            return group
        return None

    def follows(self, group: KernelGroup, deps: frozenset[fx.Node],
                position: dict[fx.Node, int]) -> bool:
        """Whether everything `deps` names is in `group` or computed before it."""
        members = self.member_sets[group.name]
        return all(d in members or position[d] < group.position for d in deps)

    def add_member(self, group: KernelGroup, node: fx.Node, deps: frozenset[fx.Node],
                   position: dict[fx.Node, int]) -> None:
        self.member_sets[group.name].add(node)
        self.reads[group.name] |= deps
        position[node] = group.position

    def cut(self, node: fx.Node, group: KernelGroup, position: dict[fx.Node, int]) -> None:
        """`node` cannot join the full `group`: realize the lazy values it reads directly
        into `group` where they can join it (at most MAX_GROUP_MEMBERS of them per group),
        so that `node` reads them from a buffer instead of recomputing what they inline."""
        for arg in node.all_input_nodes:
            if self.is_buffer(arg) or not self.kinds[arg].lazy or \
                    self.cut_count[group.name] >= MAX_GROUP_MEMBERS:
                continue
            deps = self.deps(arg)
            if not self.follows(group, deps, position):
                continue
            grown = kinds.fuse(group, arg, Reads(self.is_buffer, deps, self.kinds[arg], self.checks))
            if grown is None:
                continue
            _take(group, grown)
            self.add_member(group, arg, deps, position)
            self.realized.add(arg)
            self.cuts.add(arg)
            self.cut_count[group.name] += 1
            self.recut = True

    def mark_stored(self, groups: list[KernelGroup], steps: list[Step]) -> None:
        needed: set[fx.Node] = set()
        for group in groups:
            members = set(group.members)
            for m in group.members:
                needed |= {d for d in self.deps(m) if d not in members}
        for step in steps:
            if isinstance(step, (ExternStep, ViewStep)):
                needed |= set(step.node.all_input_nodes)
        needed |= set(self.outputs)
        for group in groups:
            group.stored = [m for m in group.members if m in needed]
            group.inlined = self.closure(group)
            group.fused_bytes = self.fused_bytes(group, needed)

    def fused_bytes(self, group: KernelGroup, needed: set[fx.Node]) -> int:
        """The memory traffic `group`'s fusion saves: each member another member reads
        is not read back from memory, nor written when no other step needs it."""
        members = set(group.members)
        inside = {d for m in group.members for d in self.deps(m) if d in members}
        return sum(meta(d).numel * meta(d).dtype.itemsize * (1 if d in needed else 2) for d in inside)

    def closure(self, group: KernelGroup) -> list[fx.Node]:
        """Lazy nodes the group's members inline, in topological order."""
        found: set[fx.Node] = set()
        todo = list(group.members)
        while todo:
            for arg in todo.pop().all_input_nodes:
                if arg not in found and not self.is_buffer(arg) and arg not in group.members:
                    found.add(arg)
                    todo.append(arg)
        return [n for n in self.nodes if n in found]


def _take(group: KernelGroup, grown: KernelGroup) -> None:
    """`group` as the join that took a new member made it (`kinds.fuse`)."""
    group.kind, group.domain = grown.kind, grown.domain
    group.members, group.anchors = grown.members, grown.anchors


def _producers(nodes: frozenset[fx.Node] | set[fx.Node], position: dict[fx.Node, int]) -> set[int]:
    """Steps that computed `nodes` (graph inputs and constants left out)."""
    return {position[n] for n in nodes if position.get(n, -1) >= 0}


# Loads per element that inlining one windowed value into another's reads may unroll: the
# bound the pooling kernels keep for one window (one constant, so both move together).
MAX_INLINED_LOADS = MAX_WINDOW


def _positions(node: fx.Node) -> Counter[fx.Node]:
    """How many positions of each input `node`'s value at one index reads."""
    shape = meta(node).shape
    found = input_reads(node, dim_names("i", shape, "i") if shape else ())
    return Counter(arg for arg, _ in found)
