"""`remote_compile`: the torch.compile backend (`backend="kiln"`), kiln's adapter to dynamo
and AOTAutograd.

Dynamo hands a graph; AOTAutograd, with kiln's decompositions, splits it into forward and
backward aten graphs; each one goes through `compile_graph` to the configuration's session
(`kiln.session`), which resolves it (`kiln.resolve`: converted, cached, probed, submitted,
polling, built). A dynamo graph AOTAutograd compiled before, in this process or another,
runs from its plan without AOTAutograd (`Session.compile_planned`). Anything that fails on
the way degrades to a slower path with one warning per cause, never to an exception in the
training job.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch

import compiler
from kiln import config as kiln_config
from kiln import degrade, mutations, plans, session, warmup
from kiln.compiled import CompiledGraph, PerShapeGraph, has_symbolic_sizes
from kiln.gc_pause import gc_paused

log = logging.getLogger("kiln")

MAX_MODEL_NAME = 120  # the tag adds the graph's role; the service takes 200 characters


def remote_compile(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                   options: dict[str, Any] | None = None, mode: str | None = None,
                   ) -> Callable[..., Any]:
    """The kiln torch.compile backend.

    `torch.compile(model, backend="kiln")` uses it through the `torch_dynamo_backends`
    entry point. `torch.compile(..., options={...})` overrides `kiln.configure()` and the
    environment for this model (any `kiln.Config` field, e.g. `{"mode": "async"}`);
    `torch.compile(..., mode="wait"|"async")` sets the kiln mode (Inductor's modes are
    ignored). Never raises for a graph kiln cannot handle: it runs eagerly, with a warning.
    """
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.exc import RestartAnalysis

    try:
        config = kiln_config.current()
        overrides = dict(options or {})
        if mode in kiln_config.MODES:
            overrides.setdefault("mode", mode)
        if overrides:
            config = dataclasses.replace(config, **overrides)
    except (ValueError, TypeError) as exc:
        degrade.warn_once("config", str(exc))
        degrade.count("eager")
        return gm
    current = session.for_config(config)
    config = current.config  # without its service when the URL is not usable
    warmup.start_compile_workers(expect_binaries=config.url is not None and config.binaries
                                 and config.mode == "wait")
    model = _model_name()  # now: dynamo is tracing the frame; the backward compiles later

    def tag_of(kind: str) -> str | None:
        return config.tag or (f"{model} {kind}" if model else None)

    recorder = None
    key = current.plans.key_for(gm, example_inputs)
    if key is not None:
        try:
            runner = current.compile_planned(key, gm, example_inputs, tag_of)
        except Exception as exc:  # noqa: BLE001 - a plan never breaks the job: AOTAutograd instead
            degrade.warn_once("plan", f"{key[:12]}: {type(exc).__name__}: {str(exc)[:200]}")
            runner = None
        if runner is not None:
            return runner
        recorder = current.recorder(key, example_inputs)

    def compiler_for(kind: str) -> Callable[..., Any]:
        return functools.partial(compile_graph, config=config, kind=kind, tag=tag_of(kind),
                                 recorder=recorder)

    partition = _Partition()  # its backward graph compiles while the forward does
    try:
        backend = aot_autograd(fw_compiler=functools.partial(
                                   compiler_for("forward"), partition=partition,
                                   backward_tag=tag_of("backward")),
                               bw_compiler=compiler_for("backward"),
                               inference_compiler=compiler_for("inference"),
                               partition_fn=partition,
                               decompositions=compiler.decompositions())
        with degrade.timed("aot"), gc_paused():  # AOTAutograd's trace and the forward's compile
            compiled = backend(gm, example_inputs)
    except RestartAnalysis:
        raise  # dynamo's own control flow, not a failure
    except Exception as exc:  # degrade to eager, never break the job
        degrade.warn_once("unsupported", f"AOTAutograd: {type(exc).__name__}: {exc}")
        log.debug("kiln: AOTAutograd failed", exc_info=True)
        degrade.count("eager")
        return gm
    return compiled if recorder is None else current.planned_now(recorder, compiled)


def _model_name() -> str | None:
    """What the dashboard calls the code dynamo is compiling: the module's class (the
    frame's `self`), else the function's name; None for a frame resumed after a graph break
    without its module, or where dynamo's internals do not say (they are private)."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
        code, local = tx.f_code, tx.f_locals
        first = local.get(code.co_varnames[0]) if code.co_argcount else None
        for value in (first, local.get("self")):
            if isinstance(value, torch.nn.Module):
                return type(value).__name__[:MAX_MODEL_NAME]
        name = code.co_name
    except Exception:  # any change in dynamo's internals: no default name
        return None
    if name.startswith("torch_dynamo_resume_in_") or not name.isidentifier():
        return None
    return name[:MAX_MODEL_NAME]


def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                  config: kiln_config.Config | None = None,
                  kind: str = "inference", tag: str | None = None,
                  partition: _Partition | None = None,
                  backward_tag: str | None = None,
                  recorder: plans.Recorder | None = None) -> Callable[..., Any]:
    """Compile one aten graph (`kind`: forward, backward or inference) into a callable
    (AOTAutograd's boxed convention: it takes one list of inputs). `tag` names the entry on
    the dashboard (default: the config's `tag`). A forward's `partition` holds the backward
    graph AOTAutograd partitioned from the same joint graph: it starts compiling (tagged
    `backward_tag`) while this forward compiles. A `recorder` collects the graphs for the
    dynamo graph's plan (`kiln.plans`).

    Returns a `CompiledGraph` (swappable: the tuned build replaces the heuristic one between
    calls), a `PerShapeGraph` for graphs with symbolic sizes, or `gm` itself (eager).
    """
    current = session.for_config(config or kiln_config.current())
    tag = tag if tag is not None else current.config.tag
    degrade.count("graphs")
    if partition is not None:
        backward, partition.backward = partition.backward, None
        current.aheads.start(backward, backward_tag if backward_tag is not None
                             else current.config.tag, recorder)
    if has_symbolic_sizes(gm, list(example_inputs)):
        degrade.warn_once("dynamic_shapes")
        return PerShapeGraph(gm, functools.partial(_specialise, current=current, kind=kind,
                                                   tag=tag))
    compiled = current.compile_static(gm, list(example_inputs), kind, tag, recorder)
    return compiled if kind == "backward" else mutations.wrapped(compiled, example_inputs)


class _Partition:
    """AOTAutograd's partitioner, keeping what it made of one model's joint graph: the
    backward graph, until the forward compiler hands it on to be compiled ahead
    (`kiln.ahead`); a pair with convolutions is laid out channels-last end to end, and the
    backward returns each gradient in its input's layout."""

    def __init__(self) -> None:
        self.backward: torch.fx.GraphModule | None = None

    def __call__(self, joint: torch.fx.GraphModule, *args: Any, **kwargs: Any) -> Any:
        from compiler.lowering.gradient_layout import gradients_in_input_layouts
        from compiler.lowering.partition import partition

        forward, backward = partition(joint, *args, **kwargs)
        self.backward = backward if isinstance(backward, torch.fx.GraphModule) else None
        if self.backward is not None and isinstance(kwargs.get("num_fwd_outputs"), int):
            forward, backward = _one_layout(forward, backward, kwargs["num_fwd_outputs"])
            gradients_in_input_layouts(forward, backward)
            self.backward = backward
        return forward, backward


def _one_layout(forward: torch.fx.GraphModule, backward: torch.fx.GraphModule,
                num_user_outputs: int) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
    """The pair channels-last end to end where it has convolutions
    (`compiler.lowering.training_layout`), else as partitioned; rewritten on copies, so a
    failure leaves what AOTAutograd made."""
    from compiler.lowering.training_layout import channels_last_training

    if not any(n.target is torch.ops.aten.convolution.default for n in forward.graph.nodes):
        return forward, backward
    fwd, bwd = copy.deepcopy(forward), copy.deepcopy(backward)
    try:
        changed = channels_last_training(fwd, bwd, num_user_outputs)
    except Exception as exc:  # noqa: BLE001 - the graphs as traced still run
        log.debug("kiln: a training step's layout left as traced: %s", exc)
        return forward, backward
    return (fwd, bwd) if changed else (forward, backward)


def _specialise(gm: torch.fx.GraphModule, args: tuple[Any, ...], current: session.Session,
                kind: str, tag: str | None) -> Callable[..., Any]:
    """Trace a symbolic graph with concrete inputs into a static aten graph and compile it.

    Scalar (SymInt) inputs are baked in (they are part of the shape key), and so are scalar
    outputs (a dynamic forward returns sizes for its backward): the static graph returns
    the tensors only, and the scalars are put back in place around it.
    """
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.utils._python_dispatch import _disable_current_modes

    tensor_pos = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    fixed = list(args)
    layout: dict[str, Any] = {}

    def concrete(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        full = list(fixed)
        for i, t in zip(tensor_pos, tensors, strict=True):
            full[i] = t
        outs = list(gm(*full))
        layout["count"] = len(outs)
        layout["scalars"] = {i: o for i, o in enumerate(outs) if not isinstance(o, torch.Tensor)}
        return tuple(o for o in outs if isinstance(o, torch.Tensor))

    tensors = [args[i] for i in tensor_pos]
    try:
        with _disable_current_modes(), torch.no_grad():
            static = make_fx(concrete, tracing_mode="fake")(*tensors)
        scalars: dict[int, Any] = layout["scalars"]
        if not all(isinstance(v, int | float | bool | type(None)) for v in scalars.values()):
            raise TypeError("an output stays symbolic at a concrete shape")
    except Exception as exc:  # this shape runs eagerly
        degrade.warn_once("unsupported", f"specialising a dynamic graph: {exc}")
        degrade.count("eager")
        return gm
    entry: CompiledGraph = current.compile_static(static, tensors, kind, tag)
    count = layout["count"]

    def run(*call_args: Any) -> tuple[Any, ...]:
        produced = iter(entry([call_args[i] for i in tensor_pos]))
        return tuple(scalars[i] if i in scalars else next(produced) for i in range(count))

    return run


warmup.warm_up_early()
