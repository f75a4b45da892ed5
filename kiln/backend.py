"""`remote_compile`: the torch.compile backend (`backend="kiln"`).

Dynamo hands a graph; AOTAutograd, with kiln's decompositions, splits it into forward and
backward aten graphs; each one goes through `compile_graph`: to the wire format, keyed,
resolved (cache, service, local heuristic; see `kiln.resolve`) and built into Triton
kernels. Anything that fails on the way degrades to a slower path with one warning per
cause, never to an exception in the training job.
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import functools
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

import compiler
from compiler.runtime.gil import short_switch_interval
from kiln import config as kiln_config
from kiln import degrade, plans
from kiln.background import Compiler
from kiln.cache import PlanCache
from kiln.client import ServiceError, check_url
from kiln.compiled import CompiledGraph, PerShapeGraph, has_symbolic_sizes
from kiln.gc_pause import gc_paused
from kiln.poller import Poller
from kiln.resolve import Resolver

log = logging.getLogger("kiln")

_lock = threading.Lock()
_resolvers: dict[kiln_config.Config, Resolver] = {}
_threads: dict[str, Any] = {}  # "poller" and "compiler": each started on first use
_compiled: weakref.WeakSet[CompiledGraph] = weakref.WeakSet()
_preparing: threading.Thread | None = None  # compile workers and loader: once per process
_warmed_up = False  # `warm_up` ran in this process
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
    config = _with_usable_url(config)

    _start_compile_workers(expect_binaries=config.url is not None and config.binaries
                           and config.mode == "wait")
    model = _model_name()  # now: dynamo is tracing the frame; the backward compiles later

    def tag_of(kind: str) -> str | None:
        return config.tag or (f"{model} {kind}" if model else None)

    recorder = None
    key = _plan_key(gm, example_inputs, config)
    if key is not None:
        try:
            runner = _compile_planned(key, gm, example_inputs, _resolver(config), tag_of)
        except Exception as exc:  # noqa: BLE001 - a plan never breaks the job: AOTAutograd instead
            degrade.warn_once("plan", f"{key[:12]}: {type(exc).__name__}: {str(exc)[:200]}")
            runner = None
        if runner is not None:
            return runner
        recorder = plans.Recorder(key, functools.partial(_publish_plan,
                                                         resolver=_resolver(config)),
                                  plans.shares_storage(example_inputs))

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
            return backend(gm, example_inputs)
    except RestartAnalysis:
        raise  # dynamo's own control flow, not a failure
    except Exception as exc:  # degrade to eager, never break the job
        degrade.warn_once("unsupported", f"AOTAutograd: {type(exc).__name__}: {exc}")
        log.debug("kiln: AOTAutograd failed", exc_info=True)
        degrade.count("eager")
        return gm


def _with_usable_url(config: kiln_config.Config) -> kiln_config.Config:
    """`config`, or without its service when its URL is not one kiln can talk to (warned
    once as a bad setting): the graphs build locally, as with KILN_URL=off."""
    if config.url is None:
        return config
    try:
        check_url(config.url)
    except ValueError as exc:
        degrade.warn_once("config", str(exc), action="building graphs locally without the "
                          "service (as with KILN_URL=off) until it is fixed")
        return dataclasses.replace(config, url=None)
    return config


def _start_compile_workers(expect_binaries: bool) -> None:
    """Once per process, on a thread of its own: pay what loading the first kernel here
    costs once (`prepare_loading`) while AOTAutograd traces, and without a service to load
    compiled kernels from, first start Triton's compile workers
    (compiler/aot/pool.py) so that they are ready when the first graph's
    kernels compile. With one that the client waits for (`expect_binaries`: wait mode, an
    async client builds new graphs here at once), workers start only when a kernel is to
    be compiled here: on a service hit none is, and starting 16 processes early cost the
    first step 0.3 s on an H200 host (2.51 s with them, 2.23 s without)."""
    if not torch.cuda.is_available():
        return
    global _preparing
    with _lock:
        if _preparing is not None:
            return
        _preparing = threading.Thread(target=_prepare, args=(not expect_binaries,),
                                      name="kiln-prepare", daemon=True)
    _preparing.start()


def _warm_up_early() -> None:
    """When the backend is looked up (`torch.compile(..., backend="kiln")` imports this
    module), do the one-time work of a first compile that touches no device, as looking
    Inductor up does its own: Triton's hash of itself (0.5-1 s), which the first kernel load
    needs, in a child process (`compiler.runtime.triton_key`: on a thread here it slowed
    dynamo's tracing more than it cost); on this thread dynamo's and kiln's own
    first-compile imports (`kiln.preload`), kiln's decomposition table (0.1-0.2 s, which
    AOTAutograd or a plan's lowering needs; on a thread of its own it ran beside the first
    step's trace, which usually follows `torch.compile` at once, and slowed it as much) and
    a frozen heap (`preload.freeze_heap`). The device is left alone: which one this process
    uses may not be set yet (`_prepare` makes the driver at the first compile)."""
    if not torch.cuda.is_available():
        return
    from compiler.runtime.execution import runs_on_cpu

    if runs_on_cpu():  # the interpreter loads no kernel binaries
        return
    warm_up()


def warm_up() -> None:
    """The lookup's one-time work (`_warm_up_early`), whatever the device, once per process:
    where kernels load it runs when this module is imported; `bench.trace_probe` calls it on
    any machine to measure what it does to dynamo's first trace."""
    global _warmed_up
    from compiler.runtime import triton_key
    from kiln import preload

    with _lock:
        if _warmed_up:
            return
        _warmed_up = True
    triton_key.start()
    preload.prime_dynamo()
    preload.import_compiler()
    with degrade.timed("prepare"):
        try:
            compiler.decompositions()
        except Exception as exc:  # noqa: BLE001 - the first compile pays for it instead
            log.debug("kiln: early warm-up failed: %s: %s", type(exc).__name__, exc)
    try:
        freeze = kiln_config.current().gc_freeze
    except ValueError:  # a bad setting: named by the first compile, which then runs eagerly
        freeze = False
    if freeze:
        preload.freeze_heap()


def _prepare(start_workers: bool) -> None:
    from compiler import aot
    from compiler.runtime import loading

    start = time.perf_counter()
    try:
        if start_workers:
            aot.start()
    except Exception as exc:  # kernels then compile on the building thread
        log.warning("kiln: compile workers did not start (%s: %s); kernels compile one at a "
                    "time", type(exc).__name__, exc)
        return
    try:
        loading.prepare_loading()
    except Exception as exc:  # noqa: BLE001 - the first precompile pays for it instead
        log.debug("kiln: preparing Triton's loader failed: %s: %s", type(exc).__name__, exc)
    degrade.add_seconds("prepare", time.perf_counter() - start)


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
    config = _with_usable_url(config or kiln_config.current())
    resolver = _resolver(config)
    tag = tag if tag is not None else config.tag
    degrade.count("graphs")
    if partition is not None:
        _compile_backward_ahead(partition, resolver,
                                backward_tag if backward_tag is not None else config.tag,
                                recorder)
    if has_symbolic_sizes(gm, list(example_inputs)):
        degrade.warn_once("dynamic_shapes")
        return PerShapeGraph(gm, functools.partial(_specialise, resolver=resolver, kind=kind,
                                                   tag=tag))
    return _compile_static(gm, list(example_inputs), resolver, kind, tag, recorder)


def _compile_static(gm: torch.fx.GraphModule, example_inputs: list[Any],
                    resolver: Resolver, kind: str, tag: str | None,
                    recorder: plans.Recorder | None = None) -> Callable[..., Any]:
    entry = CompiledGraph(gm, kind=kind, device=_device_of(example_inputs), tag=tag)
    with _lock:
        _compiled.add(entry)
    if recorder is not None:  # now: AOTAutograd's metadata is at hand only in its compilers
        if kind == "backward":
            recorder.backward_compiling(entry)
        else:
            recorder.forward_compiling(entry)
    if resolver.config.background:
        from torch.fx._lazy_graph_module import _LazyGraphModule

        _LazyGraphModule.force_recompile(gm)  # eager calls and the converter must not race
        background().submit(functools.partial(_resolve, entry, example_inputs, resolver,
                                              recorder))
    else:
        _resolve(entry, example_inputs, resolver, recorder)
    return entry


def _resolve(entry: CompiledGraph, example_inputs: list[Any], resolver: Resolver,
             recorder: plans.Recorder | None = None) -> None:
    """Convert, key, find a schedule for and build `entry`'s graph; what fails leaves it
    eager (warned once). On the training thread, or the background one. A backward whose
    graph was compiled ahead (`_Ahead`, while its forward compiled) takes that build."""
    with gc_paused():
        try:
            if entry.kind == "backward" and _take_ahead(entry, resolver, example_inputs):
                return  # the very graph compiled ahead: its conversion too
            if not _convert(entry, example_inputs):
                return
            if entry.kind == "backward" and _take_ahead(entry, resolver):
                return
            _settle(entry, resolver, _find(entry, resolver))
        finally:  # after the service answered: the plan's upload must not delay that
            if recorder is not None:
                recorder.converted()


def _convert(entry: CompiledGraph, example_inputs: list[Any], count: bool = True) -> bool:
    """To the wire format and keyed (`entry.describe`); False when the graph stays eager
    (warned once, and counted unless `count` is False: a backward compiled ahead, which
    its backward compiler converts again)."""
    from torch.utils._python_dispatch import _disable_current_modes

    from compiler.wire.graph import to_wire_and_graph

    if _runs_eagerly_here(entry.device):
        degrade.warn_once("cpu_eager")
        if count:
            degrade.count("eager")
        return False
    start = time.perf_counter()
    try:
        # Under dynamo the inputs are fake tensors; only their metadata is used here.
        with _disable_current_modes():
            # to_wire + from_wire with the graph run on meta once: the key is from_wire's.
            wire, graph = to_wire_and_graph(entry.gm, example_inputs)
            target = compiler.Target.detect(str(entry.device))
            entry.describe(compiler.tuning_key(graph, target), graph, target, wire)
    except Exception as exc:  # a graph kiln cannot express runs eagerly
        degrade.warn_once("unsupported", f"{type(exc).__name__}: {exc}")
        if count:
            degrade.count("eager")
        return False
    degrade.add_seconds("wire", time.perf_counter() - start)
    return True


def _find(entry: CompiledGraph, resolver: Resolver) -> Any:
    """The resolver's search for a converted graph (cache, service, local build): the
    service's last answer, or None."""
    from torch.utils._python_dispatch import _disable_current_modes

    answer = None
    # Short switch interval: the search's file and network I/O (binaries installed, kernels
    # loaded, the service's answers) runs beside other threads' Python (compiler/runtime/gil.py).
    with degrade.timed("resolve"), short_switch_interval():
        try:
            with _disable_current_modes():
                answer = resolver.resolve(entry)
        except Exception as exc:  # degrade to what is installed (or eager)
            degrade.warn_once("build_failed", f"{entry.key[:12]}: {type(exc).__name__}: {exc}")
            log.debug("kiln: resolve failed", exc_info=True)
    return answer


def _settle(entry: CompiledGraph, resolver: Resolver, answer: Any) -> None:
    """Count a graph left eager; hand one that is not tuned yet to the poller."""
    if entry.level == "eager":
        degrade.count("eager")
    if entry.level != "tuned" and not entry.final and resolver.client is not None:
        poller().watch(entry, resolver, submitted=answer is not None,
                       job_id=answer.job_id if answer is not None else None)
    log.debug("kiln: compiled %r", entry)


# ---- plans: a dynamo graph AOTAutograd already split, run without it (kiln.plans) ------------
_publishing: list[threading.Thread] = []
PUBLISH_AT_EXIT_S = 10.0  # at exit, how long plans still being stored are waited for


def _plan_key(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
              config: kiln_config.Config) -> str | None:
    """The dynamo graph's plan key, or None: plans are off, there is nowhere to keep one,
    the graph runs eagerly here (`_runs_eagerly_here`: a plan's graphs would be built for
    a device that cannot run them; AOTAutograd's compilers warn and leave them eager), or
    the graph cannot be keyed (then it goes through AOTAutograd, unrecorded)."""
    if not config.plans or (config.url is None and not config.cache):
        return None
    if _runs_eagerly_here(_device_of(example_inputs)):
        return None
    if has_symbolic_sizes(gm, list(example_inputs)):
        return None
    try:
        return plans.plan_key(gm, example_inputs)
    except plans.NotPlannable as exc:
        log.debug("kiln: no plan key: %s", exc)
        return None


def _compile_planned(key: str, gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                     resolver: Resolver, tag_of: Callable[[str], str | None]
                     ) -> plans.PlanRunner | None:
    """Compile the dynamo graph from the plan kept for `key` (local cache, then the
    service), without AOTAutograd; None when there is none or it does not fit."""
    from torch.utils._python_dispatch import _disable_current_modes

    with degrade.timed("plan"), gc_paused(), _disable_current_modes():
        plan = _load_plan(key, resolver)
        if plan is None:
            return None
        try:
            plans.check_against(plan, gm, example_inputs)
        except plans.NotPlannable as exc:
            log.debug("kiln: plan %s does not fit: %s", key[:12], exc)
            degrade.count("plans_refused")
            return None
        device = _device_of(example_inputs)
        target = compiler.Target.detect(str(device))
        kind = "forward" if plan.backward is not None else "inference"
        forward = _planned_entry(plan.forward, kind, device, target, tag_of(kind))
        backward = None
        if plan.backward is not None:
            backward = _resolve_later(_planned_entry(plan.backward, "backward", device,
                                                     target, tag_of("backward")), resolver)
        degrade.count("plans_used")
    _resolve_planned(forward, resolver)
    return plans.PlanRunner(plan, forward, backward)


def _load_plan(key: str, resolver: Resolver) -> Any:
    """The plan for `key`, parsed and checked: from the local cache, else from the service
    (then kept locally); None when neither has one that parses."""
    from compiler.wire.plan import PlanError, max_plan_bytes, parse_plan

    cache = resolver.plan_cache
    raw = cache.get(key, max_plan_bytes()) if cache is not None else None
    if raw is not None:
        try:
            return parse_plan(raw)
        except PlanError as exc:
            log.warning("kiln cache: ignoring plan %s: %s", key[:12], exc)
            cache.discard(key)
    client = resolver.client if resolver.config.mode == "wait" else resolver.quick_client
    if client is None or resolver.service_down():
        return None
    try:
        text = client.plan(key)
    except ServiceError as exc:
        resolver.failed(exc)
        return None
    if text is None:
        return None
    try:  # decoded with the wire format's bounds (size, containers, nesting)
        plan = parse_plan(text)
    except (PlanError, RecursionError, MemoryError) as exc:
        degrade.warn_once("malformed", f"plan {key[:12]}: {str(exc)[:200]}",
                          url=resolver.config.url or "?")
        return None
    if plan.key != key:
        degrade.warn_once("malformed", f"plan {key[:12]} names another key",
                          url=resolver.config.url or "?")
        return None
    if cache is not None:
        _keep_plan(cache, key, text)  # as received, parsed and checked: nothing re-encoded
    return plan


def _planned_entry(graph: compiler.Graph, kind: str, device: torch.device,
                   target: compiler.Target, tag: str | None) -> CompiledGraph:
    entry = CompiledGraph(graph.to_fx(device), kind=kind, device=device, tag=tag)
    entry.describe(compiler.tuning_key(graph, target), graph, target)
    degrade.count("graphs")
    with _lock:
        _compiled.add(entry)
    return entry


def _resolve_planned(entry: CompiledGraph, resolver: Resolver) -> None:
    """Find a schedule for and build a graph a plan gave (converted already)."""
    if resolver.config.background:
        background().submit(functools.partial(_settle_found, entry, resolver))
    else:
        _settle_found(entry, resolver)


def _settle_found(entry: CompiledGraph, resolver: Resolver) -> None:
    with gc_paused():
        _settle(entry, resolver, _find(entry, resolver))


def _resolve_later(entry: CompiledGraph, resolver: Resolver) -> Callable[[], CompiledGraph]:
    """A planned backward: built on a thread of its own while the forward builds (CUDA,
    outside KILN_BACKGROUND=1, as `_Ahead`), else on the first backward call; returns what
    that call waits on."""
    if resolver.config.background:
        _resolve_planned(entry, resolver)
        return lambda: entry
    if entry.device.type != "cuda":  # the interpreter is not thread-safe
        once = threading.Lock()
        built: list[CompiledGraph] = []

        def on_first_call() -> CompiledGraph:
            with once:
                if not built:
                    _settle_found(entry, resolver)
                    built.append(entry)
            return entry

        return on_first_call
    thread = threading.Thread(target=_settle_found, args=(entry, resolver),
                              name="kiln-backward-planned", daemon=True)
    thread.start()

    def joined() -> CompiledGraph:
        thread.join()
        return entry

    return joined


def _publish_plan(plan: Any, resolver: Resolver) -> None:
    """Keep a plan that AOTAutograd's compile gave: in the local cache and, on a thread
    of its own, in the service."""
    from compiler.wire.plan import plan_text

    text = plan_text(plan)
    if resolver.plan_cache is not None:
        _keep_plan(resolver.plan_cache, plan.key, text)
    if resolver.client is None or resolver.service_down():
        return
    thread = threading.Thread(target=_send_plan, args=(plan.key, text, resolver),
                              name="kiln-plan", daemon=True)
    with _lock:
        _publishing[:] = [t for t in _publishing if t.is_alive()] + [thread]
    thread.start()


def _keep_plan(cache: PlanCache, key: str, text: str) -> None:
    try:
        cache.write(key, text)
    except OSError as exc:
        degrade.warn_once("cache", f"{cache.root}: {exc}")


def _send_plan(key: str, text: str, resolver: Resolver) -> None:
    assert resolver.client is not None
    try:
        resolver.client.put_plan(key, text)
        degrade.count("plans_sent")
    except ServiceError as exc:
        log.debug("kiln: plan %s not stored by the service: %s", key[:12], exc)


def wait_plans(timeout: float | None = None) -> bool:
    """Block until the plans being sent to the service are sent (or failed); False if
    `timeout` seconds passed first. Runs at exit, bounded by PUBLISH_AT_EXIT_S."""
    deadline = None if timeout is None else time.monotonic() + timeout
    with _lock:
        pending = list(_publishing)
    for thread in pending:
        thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    return not any(t.is_alive() for t in pending)


atexit.register(wait_plans, PUBLISH_AT_EXIT_S)


# ---- the backward, compiled while its forward compiles ---------------------------------------
# AOTAutograd compiles a training graph's backward only when the first backward runs, after
# the forward compiled and ran: one after the other, each with its own round of compile
# workers. The partitioner hands kiln the backward graph with the forward, so a thread
# compiles it (`_Ahead`) while the forward compiles; the backward compiler, later, takes
# that conversion and build when its graph has the same fingerprint (`_fingerprint`: a copy
# of the same graph), else when its converted graph has the same tuning key, and
# otherwise compiles as before. Only for CUDA graphs outside KILN_BACKGROUND=1: the
# interpreter is not thread-safe, and background builds leave the training thread anyway.
MAX_AHEAD = 8  # backwards compiled ahead and not taken yet, kept (the oldest dropped)
_aheads: list[_Ahead] = []


class _Partition:
    """What AOTAutograd's partitioner made of one model's joint graph: the backward graph,
    until the forward compiler hands it to `_Ahead`."""

    def __init__(self) -> None:
        self.backward: torch.fx.GraphModule | None = None

    def __call__(self, joint: torch.fx.GraphModule, *args: Any, **kwargs: Any) -> Any:
        from torch._functorch.partitioners import default_partition

        forward, backward = default_partition(joint, *args, **kwargs)
        self.backward = backward if isinstance(backward, torch.fx.GraphModule) else None
        if self.backward is not None and isinstance(kwargs.get("num_fwd_outputs"), int):
            forward, backward = _one_layout(forward, backward, kwargs["num_fwd_outputs"])
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


class _Ahead:
    """A backward graph compiled on a thread of its own (see above)."""

    def __init__(self, gm: torch.fx.GraphModule, inputs: list[Any], resolver: Resolver,
                 tag: str | None, recorder: plans.Recorder | None = None) -> None:
        self.entry = CompiledGraph(gm, kind="backward", device=_device_of(inputs), tag=tag)
        self.resolver = resolver
        self.recorder = recorder
        if recorder is not None:
            recorder.backward_compiling(self.entry)
        self.converted = threading.Event()  # entry.key is set (or conversion failed)
        self.done = threading.Event()
        self.answer: Any = None
        self.ok = False
        self.fingerprint: str | None = None  # `_fingerprint` of its graph and inputs
        self._inputs = inputs
        self.thread = threading.Thread(target=self._run, name="kiln-backward-ahead", daemon=True)

    def _run(self) -> None:
        with gc_paused():
            self._compile()

    def _compile(self) -> None:
        try:
            try:
                self.fingerprint = _fingerprint(self.entry.gm, self._inputs)
            except Exception as exc:  # noqa: BLE001 - then only its key can match
                log.debug("kiln: no fingerprint for a backward: %s", exc)
            self.ok = _convert(self.entry, self._inputs, count=False)
            self.converted.set()
            if self.ok:
                self.answer = _find(self.entry, self.resolver)
        finally:
            self._inputs = []
            self.converted.set()
            self.done.set()
            if self.recorder is not None:  # after the service answered, as in _resolve
                self.recorder.converted()


# Tests: compile CPU (interpreter) backwards ahead too, and finish before the forward runs.
_AHEAD_ON_CPU = False


def _compile_backward_ahead(partition: _Partition, resolver: Resolver, tag: str | None,
                            recorder: plans.Recorder | None = None) -> None:
    """Start compiling the backward graph the partitioner made, if there is one to do."""
    gm, partition.backward = partition.backward, None
    if gm is None or resolver.config.background:
        return
    inputs = [n.meta.get("val") for n in gm.graph.find_nodes(op="placeholder")]
    if not all(isinstance(x, torch.Tensor) for x in inputs) or has_symbolic_sizes(gm, inputs):
        return
    if _device_of(inputs).type != "cuda" and not _AHEAD_ON_CPU:
        return
    ahead = _Ahead(gm, inputs, resolver, tag, recorder)
    with _lock:
        _aheads.append(ahead)
        del _aheads[:-MAX_AHEAD]
    ahead.thread.start()
    if _AHEAD_ON_CPU:
        ahead.done.wait()


def _take_ahead(entry: CompiledGraph, resolver: Resolver,
                example_inputs: list[Any] | None = None) -> bool:
    """Give a backward what resolving it ahead gave (waiting for it to finish: a build, or
    eager with its warnings given) and settle it; False when there is none. With
    `example_inputs`, before the backward is converted: the one compiled ahead must have
    the same `_fingerprint` (AOTAutograd hands the backward compiler a copy of the graph
    its partitioner made), and gives its conversion too; without, the converted backward's
    key must be the same."""
    with _lock:
        candidates = [a for a in _aheads if a.resolver is resolver]
    if not candidates:
        return False
    fingerprint = None
    if example_inputs is not None:
        try:
            fingerprint = _fingerprint(entry.gm, example_inputs)
        except Exception as exc:  # noqa: BLE001 - converted and matched by key instead
            log.debug("kiln: no fingerprint for a backward: %s", exc)
            return False
    for ahead in candidates:
        ahead.converted.wait()
        if not ahead.ok:
            continue
        if fingerprint is not None:
            if ahead.fingerprint != fingerprint:
                continue
            done = ahead.entry
            entry.describe(done.key, done.graph, done.target, done.wire)
        elif ahead.entry.key != entry.key:
            continue
        ahead.done.wait()
        with _lock:
            if ahead in _aheads:
                _aheads.remove(ahead)
        done = ahead.entry  # what resolving this graph gave, a failure (eager) included
        if done.built is not None and done.level != "eager":
            entry.install(done.built, done.level, done.origin)
        entry.final = done.final
        degrade.count("backwards_ahead")
        _settle(entry, resolver, ahead.answer)
        return True
    return False


def _fingerprint(gm: torch.fx.GraphModule, inputs: Sequence[Any]) -> str:
    """What converting a graph depends on, much cheaper to compute than the conversion:
    each node's op, target, name and arguments (argument nodes by name), and each input's
    size, strides, dtype and device. Two graphs with one fingerprint convert alike."""
    parts = []
    for node in gm.graph.nodes:
        args = torch.fx.node.map_arg((node.args, node.kwargs), lambda a: a.name)
        parts.append(f"{node.op}|{node.target}|{node.name}|{args!r}")
    for x in inputs:
        parts.append(repr((tuple(x.shape), x.stride(), x.dtype, x.device))
                     if isinstance(x, torch.Tensor) else f"{type(x).__name__}:{x!r}")
    return "\n".join(parts)


def _specialise(gm: torch.fx.GraphModule, args: tuple[Any, ...],
                resolver: Resolver, kind: str, tag: str | None) -> Callable[..., Any]:
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
    entry = _compile_static(static, tensors, resolver, kind, tag)
    count = layout["count"]

    def run(*call_args: Any) -> tuple[Any, ...]:
        produced = iter(entry([call_args[i] for i in tensor_pos]))
        return tuple(scalars[i] if i in scalars else next(produced) for i in range(count))

    return run


def _runs_eagerly_here(device: torch.device) -> bool:
    """Whether kiln leaves a graph on `device` eager in this process: a CPU graph without
    Triton's interpreter (TRITON_INTERPRET=1), where Triton cannot run kiln's kernels. The
    one device check of both paths, AOTAutograd's (`_convert`) and a plan's (`_plan_key`)."""
    return device.type == "cpu" and not compiler.runs_on_cpu()


def _device_of(example_inputs: Sequence[Any]) -> torch.device:
    """The accelerator the graph runs on (a CPU scalar tensor beside CUDA inputs does not
    make it a CPU graph); the CPU when every input is on it."""
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type != "cpu":
            return x.device
    return torch.device("cpu")


def _resolver(config: kiln_config.Config) -> Resolver:
    with _lock:
        resolver = _resolvers.get(config)
        if resolver is None:
            resolver = _resolvers[config] = Resolver.from_config(config)
        return resolver


def compiled_graphs() -> list[CompiledGraph]:
    """The graphs this process compiled through kiln and still holds (debugging, tests)."""
    with _lock:
        return list(_compiled)


def _thread(name: str, start: Callable[[], Any]) -> Any:
    with _lock:
        if name not in _threads:
            _threads[name] = start()
        return _threads[name]


def poller() -> Poller:
    """The process's background poller (started on first use)."""
    return _thread("poller", Poller)


def background() -> Compiler:
    """The process's background compiler (`KILN_BACKGROUND=1`; started on first use)."""
    return _thread("compiler", Compiler)


def wait_compiled(timeout: float | None = None) -> bool:
    """Block until every graph handed to the background compiler (`KILN_BACKGROUND=1`) is
    built, or has failed to be and runs eagerly; False if `timeout` seconds passed first.
    Returns True at once when nothing compiles in the background."""
    with _lock:
        compiling = _threads.get("compiler")
    return compiling is None or compiling.wait(timeout)


def shutdown() -> None:
    """Stop the background threads (the compiler after the jobs already queued), forget
    clients and the list of compiled graphs (tests; before a fork). Compiled graphs keep
    working; they just are not swapped any more."""
    with _lock:
        compiling = _threads.pop("compiler", None)
    if compiling is not None:
        compiling.stop()  # first: its last jobs may hand graphs to the poller
    with _lock:
        threads = list(_threads.values())
        _threads.clear()
        _resolvers.clear()
        _compiled.clear()
        _aheads.clear()
    for thread in threads:
        thread.stop()


_warm_up_early()
