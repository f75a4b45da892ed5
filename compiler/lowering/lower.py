"""aten FX graph -> kiln IR (`Program`). Reads as a list of steps: see `lower_fx`."""

from __future__ import annotations

import copy
import logging
import operator
from collections.abc import Callable, Sequence

import torch
from torch import fx
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map, tree_unflatten

from compiler.ir import MetaError, Program, TensorMeta, base_name, check_program, op_name
from compiler.lowering import meta_memo, ops
from compiler.lowering.conv_bias import unfuse_convolution_bias
from compiler.lowering.fusion import plan_steps
from compiler.lowering.layout import channels_last_convolutions
from compiler.lowering.layout import policy as layout_policy
from compiler.lowering.record import record
from compiler.lowering.split_reductions import policy_from_env as split_policy_from_env
from compiler.lowering.split_reductions import split_reductions
from compiler.wire import device_layout
from compiler.wire.schema import storage_extent

log = logging.getLogger(__name__)
aten = torch.ops.aten

FOLD_NUMEL = 4096  # constant subgraphs up to this many elements are evaluated at build time


def lower_fx(gm: fx.GraphModule, example_meta: Sequence[object], owned: bool = False) -> Program:
    """Lower an aten graph (placeholders described by `example_meta`) to a `Program`. The
    passes rewrite a copy of `gm`, or `gm` itself when the caller hands it over (`owned`:
    made for this call, used by nothing else)."""
    gm = gm if owned else _private_copy(gm)
    original_ops = {n.name: op_name(n) for n in gm.graph.nodes if n.op == "call_function"}
    origins = {n.name: n.name for n in gm.graph.nodes}
    metas = [TensorMeta.of(m) if m is not None else None for m in example_meta]
    propagate_meta(gm, metas, take_validated=True)  # 1. dtype/shape/stride of every value
    decompose_composites(gm, origins)          # 2. layer_norm, softmax, var, ... -> primitives
    propagate_meta(gm, metas)
    simplify_identities(gm)                    # 3. clone/alias/x*1/same-dtype casts vanish
    fold_constants(gm)                         # 4. small constant subgraphs evaluated now
    gm.graph.eliminate_dead_code()             # 5. dead code elimination
    if unfuse_convolution_bias(gm, origins):   #    biases join the kernels after
        propagate_meta(gm, metas)
    channels_last_convolutions(                #    convolutions on NHWC tensors
        gm, lambda: propagate_meta(gm, metas), origins, original_ops)
    split_reductions(gm, origins)              #    few outputs, many elements: two stages
    gm.recompile()
    propagate_meta(gm, metas)
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    steps, buffers = plan_steps(gm)            # 6. classify, realize, fuse into kernels
    program = Program(gm, steps, placeholders, origins, original_ops, buffers)
    name_kernels(program)                      # 7. names from the fused aten ops
    check_program(program)                     # 8. the IR spec at the pipeline's exit
    return program


def lowering_options() -> str:
    """The environment's settings that change what `lower_fx` makes of a graph."""
    return f"split={split_policy_from_env()};channels_last={layout_policy()}"


def _private_copy(gm: fx.GraphModule) -> fx.GraphModule:
    graph = copy.deepcopy(gm.graph)
    return fx.GraphModule(gm, graph)


# ---- 1. metadata -------------------------------------------------------------------------


def _meta_tensor(m: TensorMeta) -> torch.Tensor:
    span = storage_extent(m.shape, m.stride, m.offset)
    base = torch.empty(max(span, 1), dtype=m.dtype, device="meta")
    return base.as_strided(m.shape, m.stride, m.offset)


def _to_meta(value: object) -> object:
    if isinstance(value, torch.Tensor):
        return value.to("meta")
    return value


def propagate_meta(gm: fx.GraphModule, inputs: Sequence[TensorMeta | None],
                   take_validated: bool = False) -> None:
    """Run the graph on the meta device and record each node's TensorMeta (`kiln_meta`).
    A node whose op, argument metadata and other arguments the process has seen takes the
    metadata remembered for them (`meta_memo`) without running; with `take_validated` (the
    first run of a graph made from the wire format), a node takes the value validation
    computed for it when its inputs did too."""
    values: dict[fx.Node, object] = {}
    validated: set[fx.Node] = set()  # nodes whose value here is the one validation computed
    placeholders = iter(inputs)
    for node in gm.graph.nodes:
        found: object = None
        if node.op == "placeholder":
            m = next(placeholders, None)
            values[node] = _meta_tensor(m) if m is not None else None
        elif node.op == "get_attr":
            values[node] = _to_meta(_attr(gm, node.target))
        elif node.op == "call_function":
            if take_validated and _takes_validated(node, validated):
                values[node] = node.meta["wire_value"]
                validated.add(node)
            else:
                key = meta_memo.key_of(node)
                known = meta_memo.remembered(key)
                if known is not None:  # its meta value is made only if a run needs it
                    node.meta["kiln_meta"] = known
                    continue
                values[node] = _run_on_meta(node, values)
                found = _metas(values[node])
                meta_memo.remember(key, found)
        elif node.op == "output":
            continue
        else:
            raise ValueError(f"node {node.name}: unsupported fx op {node.op!r}")
        if found is None:
            found = _metas(values[node])
        # validated: its value here has the metadata of the one wire validation computed
        if (take_validated and node not in validated and "wire_value" in node.meta
                and found == _metas(node.meta["wire_value"])):
            validated.add(node)
        node.meta["kiln_meta"] = _tensor_metas(found)


def _run_on_meta(node: fx.Node, values: dict[fx.Node, object]) -> object:
    def value(arg: fx.Node) -> object:
        if arg not in values:  # a remembered node's value, made from its metadata
            values[arg] = _meta_values(arg.meta["kiln_meta"])
        return values[arg]

    args, kwargs = fx.node.map_arg((node.args, node.kwargs), value)
    args, kwargs = tree_map(_meta_device, (args, kwargs))
    try:
        return device_layout.run(node.target, *args, **kwargs)
    except Exception as exc:  # an op the meta device cannot run: no metadata
        raise MetaError(node, f"node {node.name} ({op_name(node)}): cannot infer "
                              f"its shape ({type(exc).__name__}: {exc})") from exc


def _meta_values(metas: object) -> object:
    """Meta tensors of remembered metadata, in its structure."""
    if isinstance(metas, TensorMeta):
        return _meta_tensor(metas)
    return type(metas)(_meta_values(m) for m in metas)  # type: ignore[call-arg,attr-defined]


def _metas(value: object) -> object:
    """`value` with its tensors as TensorMetas (other leaves as they are; an op's tuple
    of results, a named one too, as a tuple)."""
    if isinstance(value, torch.Tensor):
        return TensorMeta.of(value)
    if isinstance(value, list):
        return [_metas(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_metas(v) for v in value)
    return value


def _tensor_metas(metas: object) -> object:
    """`_metas`' result with every leaf that is not a TensorMeta as None."""
    if isinstance(metas, TensorMeta):
        return metas
    if isinstance(metas, list):
        return [_tensor_metas(m) for m in metas]
    if isinstance(metas, tuple):
        return tuple(_tensor_metas(m) for m in metas)
    return None


def _takes_validated(node: fx.Node, validated: set[fx.Node]) -> bool:
    """Whether the first metadata run may take the value wire validation computed for
    `node` instead of running its op: same op on arguments of the same metadata (every input
    validated; validation lays results out as lowering does, `compiler.wire.device_layout`),
    and tensors only."""
    value = node.meta.get("wire_value")
    if value is None:
        return False
    leaves = tree_leaves(value)
    return (bool(leaves) and all(isinstance(v, torch.Tensor) for v in leaves)
            and all(a in validated for a in node.all_input_nodes))




def _meta_device(value: object) -> object:
    return torch.device("meta") if isinstance(value, torch.device) else value


def _attr(gm: fx.GraphModule, target: str) -> object:
    obj: object = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


# ---- 2. composite ops --------------------------------------------------------------------


def _var(x, dim=None, *, correction=None, keepdim=False):  # noqa: ANN001, ANN202
    dims = list(range(x.dim())) if dim is None else dim
    n = 1
    for d in dims:
        n *= x.shape[d]
    mean = aten.mean.dim(x, dims, True)
    sq = (x - mean) * (x - mean)
    c = 1 if correction is None else correction
    return aten.sum.dim_IntList(sq, dims, keepdim) / max(n - c, 0)


def _std(x, dim=None, *, correction=None, keepdim=False):  # noqa: ANN001, ANN202
    return torch.sqrt(_var(x, dim, correction=correction, keepdim=keepdim))


def _var_mean(x, dim=None, *, correction=None, keepdim=False):  # noqa: ANN001, ANN202
    dims = list(range(x.dim())) if dim is None else dim
    return (_var(x, dims, correction=correction, keepdim=keepdim),
            aten.mean.dim(x, dims, keepdim))


def _logsumexp(x, dim, keepdim=False):  # noqa: ANN001, ANN202
    m = aten.amax(x, dim, True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    out = torch.log(aten.sum.dim_IntList(torch.exp(x - m), dim, True)) + m
    return out if keepdim else aten.squeeze.dims(out, dim)


def _max_dim(x, dim, keepdim=False):  # noqa: ANN001, ANN202
    return aten.amax(x, [dim], keepdim), aten.argmax(x, dim, keepdim)


def _min_dim(x, dim, keepdim=False):  # noqa: ANN001, ANN202
    return aten.amin(x, [dim], keepdim), aten.argmin(x, dim, keepdim)


# Decompositions kiln adds to the shared table: reductions it lowers as two passes, and
# (values, indices) reductions as two reductions over one domain (one kernel).
_KILN_DECOMPS: dict[object, Callable] = {
    aten.max.dim: _max_dim,
    aten.min.dim: _min_dim,
    aten.var.correction: _var,
    aten.std.correction: _std,
    aten.var_mean.correction: _var_mean,
    aten.logsumexp.default: _logsumexp,
}


def _lowered_natively(node: fx.Node) -> bool:
    name = base_name(node)
    if name in ("var", "std", "var_mean", "logsumexp"):
        return False
    if name in ("max", "min") and node.target in _KILN_DECOMPS:
        return False
    return name in ops.POINTWISE | ops.VIEWS | ops.INDEXING | ops.REDUCTIONS | ops.MATMULS


def decompose_composites(gm: fx.GraphModule, origins: dict[str, str]) -> None:
    """Replace composite ops (layer norm, softmax, var, ...) by the primitives they are made of."""
    from compiler.lowering.decomposition_table import decompositions

    table = decompositions()
    table.update(_KILN_DECOMPS)
    recorded: dict[object, fx.GraphModule] = {}  # a model's repeated layers: once each
    for _ in range(4):  # a decomposition may produce ops that decompose further
        changed = False
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or node.target not in table:
                continue
            if _lowered_natively(node) or base_name(node) in ops.NEVER_LOWER:
                continue
            changed |= _splice_decomposition(gm, node, table, origins, recorded)
        if not changed:
            break


def _splice_decomposition(gm: fx.GraphModule, node: fx.Node, table: dict,
                          origins: dict[str, str],
                          recorded: dict[object, fx.GraphModule]) -> bool:
    """Replace `node` by the graph its decomposition records. `recorded` keeps each
    recording by op, argument metadata and other arguments: the same op on the same
    metadata records the same graph (a constant-free one is spliced again as it is)."""
    flat, spec = tree_flatten((node.args, node.kwargs))
    positions = [i for i, a in enumerate(flat) if isinstance(a, fx.Node)]
    metas = [flat[i].meta.get("kiln_meta") for i in positions]
    if not all(isinstance(m, TensorMeta) for m in metas):
        return False
    key = meta_memo.key_of(node)  # what the recording follows from, as for its metadata
    sub = recorded.get(key) if key is not None else None
    if sub is None:
        sub = _record_decomposition(node, flat, positions, metas, spec, table)
        if sub is None:
            return False
        if key is not None and not any(n.op == "get_attr" for n in sub.graph.nodes):
            recorded[key] = sub
    env: dict[fx.Node, fx.Node] = {}
    sub_inputs = [n for n in sub.graph.nodes if n.op == "placeholder"]
    for sub_node, i in zip(sub_inputs, positions, strict=False):
        env[sub_node] = flat[i]
    for sub_node in sub.graph.nodes:
        if sub_node.op == "get_attr":
            name = f"_kiln_const_{len(list(gm.named_buffers()))}"
            gm.register_buffer(name, _attr(sub, sub_node.target).detach().clone())
            sub_node.target = name
    before = set(gm.graph.nodes)
    with gm.graph.inserting_before(node):
        out = gm.graph.graph_copy(sub.graph, env)
    for new in gm.graph.nodes:
        if new not in before:
            origins[new.name] = origins.get(node.name, node.name)
    if isinstance(out, (tuple, list)):
        for user in list(node.users):
            if user.target is not operator.getitem:
                return False
            user.replace_all_uses_with(out[user.args[1]])
            gm.graph.erase_node(user)
    else:
        node.replace_all_uses_with(out)
    gm.graph.erase_node(node)
    return True


def _record_decomposition(node: fx.Node, flat: list, positions: list[int], metas: list,
                          spec: object, table: dict) -> fx.GraphModule | None:
    """The graph `node`'s decomposition runs on meta tensors of its arguments' metadata;
    None when it cannot be recorded (the node then stays whole, an ATen call)."""
    decomp = table[node.target]

    def fn(*tensors: torch.Tensor) -> object:
        values = list(flat)
        for i, t in zip(positions, tensors, strict=False):
            values[i] = t
        args, kwargs = tree_unflatten(values, spec)
        return decomp(*args, **kwargs)

    try:
        return record(fn, [_meta_tensor(m) for m in metas], table)
    except Exception as exc:  # leave it whole: it becomes an ATen call
        log.debug("cannot decompose %s: %s", node.name, exc)
        return None


# ---- 3./4. identities and constants -----------------------------------------------------

_IDENTITY_OPS = frozenset({"clone", "alias", "detach", "lift_fresh_copy", "_to_copy",
                           "convert_element_type", "expand", "view", "reshape", "_unsafe_view"})


def simplify_identities(gm: fx.GraphModule) -> None:
    """Drop ops whose result equals their first input: same-layout copies and casts, x*1, x+0."""
    out_node = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    outputs = {a for a in tree_flatten(out_node.args)[0] if isinstance(a, fx.Node)}
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node in outputs or not node.args:
            continue
        src = node.args[0]
        if not isinstance(src, fx.Node):
            continue
        m, s = node.meta.get("kiln_meta"), src.meta.get("kiln_meta")
        if not isinstance(m, TensorMeta) or not isinstance(s, TensorMeta):
            continue
        if (m.dtype, m.shape, m.stride) != (s.dtype, s.shape, s.stride):
            continue
        name = base_name(node)
        same = name in _IDENTITY_OPS and _only_layout_kwargs(node)
        if name in ("mul", "div") and len(node.args) == 2 and node.args[1] == 1 and not node.kwargs:
            same = True
        if name in ("add", "sub") and len(node.args) == 2 and node.args[1] == 0 and not node.kwargs:
            same = True
        if same:
            node.replace_all_uses_with(src)
            gm.graph.erase_node(node)


def _only_layout_kwargs(node: fx.Node) -> bool:
    allowed = {"dtype", "memory_format", "layout", "device", "pin_memory", "non_blocking"}
    if not set(node.kwargs) <= allowed:
        return False
    device = node.kwargs.get("device")
    return device is None


def fold_constants(gm: fx.GraphModule) -> None:
    """Evaluate nodes whose tensor inputs are all small constants; keep them as constants."""
    consts: dict[fx.Node, torch.Tensor] = {}
    for node in list(gm.graph.nodes):
        if node.op == "get_attr":
            value = _attr(gm, node.target)
            if isinstance(value, torch.Tensor):
                consts[node] = value
            continue
        if node.op != "call_function" or base_name(node) in ops.NEVER_LOWER:
            continue
        tensor_args = [a for a in tree_flatten((node.args, node.kwargs))[0] if isinstance(a, fx.Node)]
        m = node.meta.get("kiln_meta")
        if not tensor_args or not all(a in consts for a in tensor_args):
            continue
        if not isinstance(m, TensorMeta) or m.numel > FOLD_NUMEL:
            continue
        args, kwargs = fx.node.map_arg((node.args, node.kwargs), consts.__getitem__)
        kwargs = {k: v for k, v in kwargs.items() if k != "device"}
        try:
            value = node.target(*args, **kwargs)
        except Exception:  # noqa: BLE001 - not foldable here; it stays in the graph
            continue
        if not isinstance(value, torch.Tensor):
            continue
        name = f"_kiln_folded_{node.name}"
        gm.register_buffer(name, value.detach().clone().contiguous())
        with gm.graph.inserting_before(node):
            new = gm.graph.get_attr(name)
        new.meta["kiln_meta"] = TensorMeta.of(value)
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
        consts[new] = value


def name_kernels(program: Program) -> None:
    """Stems `fused_<first four aten ops>` and schedule names `<stem>_<i>`, e.g.
    `fused_native_layer_norm_gelu_add_0` (casts, copies and views are left out of names
    unless there is nothing else). Only the stem enters generated source, so a kernel's
    source does not depend on where it sits in the graph."""
    quiet = {"_to_copy", "convert_element_type", "clone", "alias", "getitem", "detach",
             "lift_fresh_copy"} | ops.VIEWS
    for i, group in enumerate(program.kernels):
        names: list[str] = []
        for origin in program.origin_names(group.members + group.inlined):
            op = program.original_ops[origin].split(".")
            base = op[1] if len(op) > 2 else op[-1]
            if base not in names:
                names.append(base)
        loud = [n for n in names if n not in quiet] or names
        group.stem = "fused_" + "_".join(n.strip("_") for n in loud[:4])
        group.name = f"{group.stem}_{i}"
