"""Plans: what AOTAutograd made of a dynamo graph, kept so that the next process skips it.

On a service hit, AOTAutograd's trace and partition were most of a first step (resnet18
training on an H200: 2.9 s of a 7.5 s first step, before kiln saw a graph). Inductor skips
them with its AOTAutogradCache, whose entries are pickles. kiln keeps the same facts as
data (`compiler.wire.plan`, kiln.plan/1): the forward and backward aten graphs in the wire
format and what the runtime needs to run them.

- `plan_key`: a dynamo graph's key, from its ops (torch functions by qualified name, Tensor
  methods by name), their arguments, its inputs' metadata (which share storage included)
  and the ambient state AOTAutograd traces under (grad mode, autocast, which attention
  kernels scaled_dot_product_attention may use). A graph that cannot
  be named exactly (a submodule call, a constant attribute, an object argument, a tensor
  subclass) has no key and goes through AOTAutograd as always.
- `Recorder`: while AOTAutograd compiles a keyed graph, collects its runtime facts (from
  AOTAutograd's own metadata) and both converted graphs, then stores the plan in the local
  cache and sends it to the service.
- `PlanRunner`: runs a plan's graphs as AOTAutograd's runtime would: mutated inputs copied
  back, outputs that need no gradient marked so, the backward's gradients laid out as its
  graph was traced.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import sys
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from kiln import degrade

if TYPE_CHECKING:
    from compiler.wire.plan import Plan
    from kiln.compiled import CompiledGraph

log = logging.getLogger("kiln")

_FUNCTION_MODULES = ("torch", "_operator", "operator", "math", "builtins")


class NotPlannable(Exception):
    """Why a graph gets no plan (said at debug level; the graph compiles as always)."""


# ---- the key ----------------------------------------------------------------------------

def plan_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str:
    """The key of a dynamo graph with these inputs (which of them share storage is part of
    it); raises `NotPlannable`."""
    from compiler import COMPILER_VERSION

    positions: dict[str, int] = {}
    nodes: list[Any] = []
    for i, node in enumerate(gm.graph.nodes):
        positions[node.name] = i
        if node.op == "placeholder":
            nodes.append(["placeholder"])
        elif node.op == "output":
            nodes.append(["output", _arg(node.args, positions)])
        elif node.op in ("call_function", "call_method"):
            target = node.target if node.op == "call_method" else _function_name(node.target)
            nodes.append([node.op, target, _arg(node.args, positions),
                          _arg(node.kwargs, positions)])
        else:
            raise NotPlannable(f"a {node.op} node ({node.target})")
    doc = {"format": "kiln.plan/1", "torch": ".".join(torch.__version__.split(".")[:2]),
           "compiler": COMPILER_VERSION, "ambient": _ambient(), "nodes": nodes,
           "inputs": _inputs(example_inputs)}
    text = json.dumps(doc, separators=(",", ":"), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def _function_name(target: Any) -> str:
    """torch's (or Python's) name of a function; a wrapper made inside a function
    (`F.max_pool2d` is one of `boolean_dispatch`'s) goes by the name its module gives it."""
    if isinstance(target, torch._ops.OpOverload | torch._ops.OpOverloadPacket):
        return str(target)
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    if name and "<" in name:
        name = _exported_name(module, target)
    if not name or module.split(".")[0] not in _FUNCTION_MODULES:
        raise NotPlannable(f"a call to {target!r}, which has no stable name")
    return f"{module}.{name}"


@functools.cache
def _exported_name(module: str, target: Any) -> str | None:
    namespace = vars(sys.modules[module]) if module in sys.modules else {}
    names = sorted(name for name, value in namespace.items() if value is target)
    return names[0] if names else None


def _arg(value: Any, positions: dict[str, int]) -> Any:
    if isinstance(value, torch.fx.Node):
        return {"node": positions[value.name]}
    if value is None or isinstance(value, bool | str) or type(value) is int:
        return [type(value).__name__, value]
    if type(value) is float:
        return ["float", repr(value)]  # exact, and NaN and infinities are text
    if isinstance(value, tuple | list):  # torch.Size too
        return [type(value).__name__, [_arg(v, positions) for v in value]]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return ["dict", [[k, _arg(value[k], positions)] for k in sorted(value)]]
    if isinstance(value, slice):
        return ["slice", [_arg(v, positions) for v in (value.start, value.stop, value.step)]]
    if value is Ellipsis:
        return ["ellipsis"]
    if isinstance(value, torch.dtype | torch.memory_format | torch.layout):
        return ["torch", str(value)]
    if isinstance(value, torch.device):
        return ["device", value.type]  # ranks on other devices share one plan
    raise NotPlannable(f"an argument of type {type(value).__name__}")


def _ambient() -> list[Any]:
    """The global state AOTAutograd traces under, beside what dynamo guards on."""
    autocast = [[d, torch.is_autocast_enabled(d), str(torch.get_autocast_dtype(d))]
                for d in ("cuda", "cpu")]
    return [torch.is_grad_enabled(), torch.is_inference_mode_enabled(), autocast,
            torch.are_deterministic_algorithms_enabled(),
            bool(torch._functorch.config.functionalize_rng_ops), _attention_backends()]


# torch's settings of scaled_dot_product_attention (`torch.backends.cuda.enable_*_sdp`,
# `torch.nn.attention.sdpa_kernel`), read through the getters this torch build has.
_SDPA_GETTERS = ("_get_flash_sdp_enabled", "_get_mem_efficient_sdp_enabled",
                 "_get_math_sdp_enabled", "_get_cudnn_sdp_enabled", "_get_fa3_sdp_enabled",
                 "_get_overrideable_sdp_enabled", "_get_math_sdp_allow_fp16_bf16_reduction",
                 "_get_sdp_priority_order")


def _attention_backends() -> list[Any]:
    """Which attention kernels scaled_dot_product_attention may pick, and in which order.
    AOTAutograd's graph holds the one it picked (flash, memory-efficient, cuDNN) or the math
    decomposition: a plan traced under other settings would override the user's."""
    return [[name, getattr(torch._C, name)()] for name in _SDPA_GETTERS
            if hasattr(torch._C, name)]


def _inputs(example_inputs: Sequence[Any]) -> list[Any]:
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    for x in example_inputs:
        if not isinstance(x, torch.Tensor) or is_traceable_wrapper_subclass(x):
            raise NotPlannable(f"an input of type {type(x).__name__}")
        if not all(type(s) is int for s in (*x.shape, *x.stride(), x.storage_offset())):
            raise NotPlannable("an input with symbolic sizes")
    return [[list(x.shape), list(x.stride()), x.storage_offset(), str(x.dtype), x.device.type,
             x.requires_grad, x.is_leaf, first]
            for x, first in zip(example_inputs, _first_on_storage(example_inputs), strict=True)]


def _first_on_storage(example_inputs: Sequence[torch.Tensor]) -> list[int]:
    """For each input, the first input on its storage (itself when none before shares it)."""
    from torch.multiprocessing.reductions import StorageWeakRef

    storages: dict[Any, int] = {}
    return [storages.setdefault(StorageWeakRef(x.untyped_storage()), i)
            for i, x in enumerate(example_inputs)]


def shares_storage(example_inputs: Sequence[torch.Tensor]) -> bool:
    """Whether two inputs share storage: AOTAutograd then replays a mutation of either
    (synthetic bases), which a plan does not hold."""
    return any(first != i for i, first in enumerate(_first_on_storage(example_inputs)))


# ---- recording: AOTAutograd's runtime facts and both graphs -----------------------------

# Outputs a plan returns as the graph does: a value of its own, or a view of a value the
# graph computed that AOTAutograd's runtime hands out as a tensor of its own.
_PLAIN_OUTPUTS = ("non_alias", "unsafe_view_alias")


class Facts(NamedTuple):
    """What AOTAutograd's runtime knows of a graph beyond its aten graphs."""

    mutated_inputs: tuple[int, ...]
    output_requires_grad: tuple[bool, ...]
    unsafe_views: tuple[int, ...]


def runtime_facts(shared_storage: bool = False) -> Facts:
    """The mutated inputs (their new values lead the forward's outputs), each user
    output's requires_grad and the outputs AOTAutograd hands out through `_unsafe_view`,
    from the metadata AOTAutograd keeps while it compiles (read
    in its forward or inference compiler); raises `NotPlannable` for any graph beyond the
    plain shape plans hold (`shared_storage`: inputs share storage, and then none may be
    mutated)."""
    from torch._guards import TracingContext

    context = TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None)
    if meta is None:
        raise NotPlannable("AOTAutograd's metadata is not at hand")
    extras = ("num_intermediate_bases", "num_symints_saved_for_bw", "num_graphsafe_rng_states",
              "num_opaque_objects_saved_for_bw")
    if any(getattr(meta, name, 0) for name in extras) or getattr(meta, "tokens", None) \
            or getattr(meta, "is_rng_op_functionalized", False):
        raise NotPlannable("AOTAutograd's runtime needs more than a plan holds")
    for info in meta.input_info:
        if info.mutates_metadata or info.mutates_storage_metadata \
                or getattr(info, "mutation_inductor_storage_resize", False) \
                or (info.mutates_data and (info.requires_grad or shared_storage)):
            raise NotPlannable("an input mutation AOTAutograd's runtime replays")
    for out in meta.output_info:
        if out.output_type.name not in _PLAIN_OUTPUTS or not (
                isinstance(out.raw_type, type) and issubclass(out.raw_type, torch.Tensor)):
            raise NotPlannable(f"an output of kind {out.output_type.name}")
    for sub in (*meta.subclass_inp_meta, *meta.subclass_fw_graph_out_meta):
        if not isinstance(sub, int) and type(sub).__name__ != "PlainTensorMeta":
            raise NotPlannable("a tensor subclass")
    mutated = tuple(int(i) for i in meta.mutated_inp_runtime_indices)
    views = tuple(i for i, out in enumerate(meta.output_info)
                  if out.output_type.name == "unsafe_view_alias")
    return Facts(mutated, tuple(bool(out.requires_grad) for out in meta.output_info), views)


class Recorder:
    """One keyed dynamo graph on its way through AOTAutograd: its runtime facts and its
    converted graphs; `publish` is called once both graphs are converted."""

    def __init__(self, key: str, publish: Callable[[Plan], None],
                 shared_storage: bool = False) -> None:
        self.key = key
        self._publish = publish
        self._shared_storage = shared_storage
        self._lock = threading.Lock()
        self.facts: Facts | None = None  # none: no plan
        self.forward: CompiledGraph | None = None
        self.backward: CompiledGraph | None = None
        self.plan: Plan | None = None  # once published
        self._done = False

    def forward_compiling(self, entry: CompiledGraph) -> None:
        """In AOTAutograd's forward or inference compiler: read its metadata now."""
        try:
            self.facts = runtime_facts(self._shared_storage)
        except NotPlannable as exc:
            log.debug("kiln: no plan for %s: %s", self.key[:12], exc)
            return
        self.forward = entry

    def backward_compiling(self, entry: CompiledGraph) -> None:
        self.backward = entry

    def converted(self) -> None:
        """A graph of this plan was converted (or failed to be): publish once all are.
        Never raises: a plan is an optimisation, and this runs inside compiles."""
        try:
            self._publish_when_complete()
        except Exception as exc:  # noqa: BLE001 - warned once; the compile goes on
            log.debug("kiln: plan %s not kept", self.key[:12], exc_info=True)
            degrade.warn_once("plan", f"{self.key[:12]}: {type(exc).__name__}: {exc}")

    def _publish_when_complete(self) -> None:
        from compiler.wire.plan import PlanError, make_plan

        with self._lock:
            fw, bw = self.forward, self.backward
            if self._done or self.facts is None or fw is None or fw.graph is None:
                return
            training = fw.kind != "inference"
            if training and (bw is None or bw.graph is None):
                return
            self._done = True
        try:
            facts = self.facts
            plan = make_plan(self.key, "training" if training else "inference",
                             facts.mutated_inputs, facts.output_requires_grad, fw.graph,
                             bw.graph if training and bw is not None else None,
                             unsafe_views=facts.unsafe_views)
        except PlanError as exc:
            log.debug("kiln: no plan for %s: %s", self.key[:12], exc)
            return
        self.plan = plan
        self._publish(plan)

    def plan_now(self) -> Plan | None:
        """The plan, made now if both graphs are converted and it was not yet; None when
        there is none (not plannable, a graph not converted)."""
        self.converted()
        return self.plan


# ---- running a plan ---------------------------------------------------------------------

def check_against(plan: Plan, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> None:
    """A fetched plan must fit the dynamo graph at hand: the same inputs (layout; which
    require grad is in the key, and AOTAutograd's graphs take detached inputs), the
    same number of outputs with the same shapes and dtypes, and the kind AOTAutograd would
    choose now. Raises `NotPlannable` saying what differs."""
    from compiler.wire.plan import tensor_layouts

    if len(example_inputs) != plan.inputs:
        raise NotPlannable(f"the plan takes {plan.inputs} inputs, the graph {len(example_inputs)}")
    for spec, x in zip(plan.forward.inputs, example_inputs, strict=True):
        if (tuple(x.shape) != spec.shape or tuple(x.stride()) != spec.stride
                or x.dtype != spec.dtype or x.storage_offset() != spec.storage_offset):
            raise NotPlannable(f"input {spec.name} differs from the plan's")
    training = torch.is_grad_enabled() and any(x.requires_grad for x in example_inputs)
    if plan.kind != ("training" if training else "inference"):
        raise NotPlannable(f"a {plan.kind} plan for a graph that is not")
    returned = gm.graph.output_node().args[0]
    returned = returned if isinstance(returned, tuple | list) else (returned,)
    if len(returned) != len(plan.output_requires_grad):
        raise NotPlannable(f"the plan returns {len(plan.output_requires_grad)} outputs, the "
                           f"graph {len(returned)}")
    first = len(plan.mutated_inputs)
    layouts = tensor_layouts(plan.forward)
    for node, ref in zip(returned, plan.forward.outputs[first:], strict=False):
        value = node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None
        if isinstance(value, torch.Tensor) and ref is not None and \
                layouts.get(ref.name) != (tuple(value.shape), value.dtype):
            raise NotPlannable(f"output {ref.name} differs from the graph's")


class PlanRunner:
    """The callable dynamo gets for a planned graph (called with the graph's inputs).

    Per call it does what AOTAutograd's runtime does around the same compiled graphs and
    nothing more, so that a planned step reaches the graphs' launchers and CUDA graph
    replay (`Built.call_boxed`) exactly as an unplanned one does: the forward's outputs
    split at offsets fixed here, the backward's graph looked up once, its saved values
    handed over as AOTAutograd hands them (freed as the backward reads them), and no
    gradient made up for outputs that take none."""

    def __init__(self, plan: Plan, forward: CompiledGraph,
                 backward: Callable[[], CompiledGraph] | None) -> None:
        self.mutated = plan.mutated_inputs
        self.requires_grad = plan.output_requires_grad
        self.unsafe_views = plan.unsafe_views
        self.tangents = plan.tangents
        # How the backward's graph takes each gradient: shape, strides, dtype.
        self.tangent_layouts = [] if plan.backward is None else [
            (spec.shape, spec.stride, spec.dtype) for spec in plan.backward.inputs[plan.saved:]]
        # The forward's outputs: mutated inputs' new values, the user outputs, saved values.
        self._user_from = len(self.mutated)
        self._saved_from = self._user_from + len(self.requires_grad)
        self.non_differentiable = tuple(i for i, rg in enumerate(self.requires_grad) if not rg)
        self.forward = forward
        self.backward = backward
        self._backward_graph: CompiledGraph | None = None

    def __call__(self, *args: Any) -> tuple[Any, ...]:
        if self.backward is None:
            return self.run_forward(list(args))[0]
        return _PlanFunction.apply(self, *args)

    def run_forward(self, args: list[Any]) -> tuple[tuple[Any, ...], Sequence[Any]]:
        """The user outputs and the values saved for the backward; mutated inputs updated.
        `args` is the forward's boxed list (the graph clears it)."""
        inputs = list(args) if self.mutated else args
        outs = self.forward(args)
        if self.mutated:
            write_back([inputs[i] for i in self.mutated], outs[:self._user_from])
        if not self.unsafe_views:
            return tuple(outs[self._user_from:self._saved_from]), outs[self._saved_from:]
        returned = list(outs[self._user_from:self._saved_from])
        for i in self.unsafe_views:  # a view of a computed value, handed out on its own
            returned[i] = torch.ops.aten._unsafe_view(returned[i], returned[i].shape)
        return tuple(returned), outs[self._saved_from:]

    def backward_graph(self) -> CompiledGraph:
        """The backward's compiled graph: waited for (its build) on the first call only."""
        graph = self._backward_graph
        if graph is None:
            assert self.backward is not None
            graph = self._backward_graph = self.backward()
        return graph

    def gradients(self, grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """The output gradients the backward takes, laid out as its graph was traced."""
        laid = []
        for i, (shape, stride, dtype) in zip(self.tangents, self.tangent_layouts, strict=True):
            grad = grads[i]
            if grad.dtype != dtype or not _same_layout(grad, shape, stride):
                grad = torch.empty_strided(shape, stride, dtype=dtype,
                                           device=grad.device).copy_(grad)
            laid.append(grad)
        return laid


def write_back(targets: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> None:
    """Each of `values` copied into its target (mutated inputs' new values): one
    `_foreach_copy_` per dtype and device, since a list that mixes them (BatchNorm's bf16
    statistics and int64 batch counts) takes the per-tensor path, a launch each (resnet18:
    60)."""
    groups: dict[tuple[Any, ...], tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    for target, value in zip(targets, values, strict=True):
        dst, src = groups.setdefault((target.dtype, value.dtype, target.device), ([], []))
        dst.append(target)
        src.append(value)
    with torch.no_grad():
        for dst, src in groups.values():
            torch._foreach_copy_(dst, src)


def _same_layout(t: torch.Tensor, shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    from compiler.ir import strides_match

    return (tuple(t.shape) == tuple(shape) and t.storage_offset() == 0
            and strides_match(shape, t.stride(), stride))


class _PlanFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, runner: PlanRunner, *args: Any) -> tuple[Any, ...]:
        user, saved = runner.run_forward(list(args))
        ctx.runner = runner
        ctx.save_for_backward(*saved)
        if runner.non_differentiable:
            ctx.mark_non_differentiable(*(user[i] for i in runner.non_differentiable
                                          if isinstance(user[i], torch.Tensor)))
            # As AOTAutograd's runtime: these outputs' gradients reach the backward as None
            # (which it does not read), not as zeros made for them on every call.
            ctx._materialize_non_diff_grads = False
        return user

    @staticmethod
    def backward(ctx: Any, *grads: Any) -> tuple[Any, ...]:
        runner: PlanRunner = ctx.runner
        graph = runner.backward_graph()
        args = [*ctx.saved_tensors, *runner.gradients(grads)]
        # As AOTAutograd's runtime: the saved values are the list's alone from here, so the
        # backward's boxed call frees each at its last use.
        ctx.maybe_clear_saved_tensors()
        return (None, *graph(args))
