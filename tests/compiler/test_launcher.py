"""The generated per-graph launcher (compiler/runtime/launcher.py), on the CPU: the same
results as the step-by-step run, deterministic source, values freed at their last use,
buffers reused, and the direct-launch mode (with stand-in compiled kernels whose launcher
runs the interpreted kernel) with each of its fallbacks."""

from __future__ import annotations

import gc
import operator
import weakref
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import fx

import compiler
from compiler.runtime.execution import Call
from compiler.runtime.launcher import GraphLauncher, Plan
from tests.compiler.oputil import rand, trace
from tests.corpus import case, case_names


def _mlp(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, ...]:
    y = F.gelu(F.gelu(x @ w1) @ w2)
    return y, torch.softmax(y, -1), y.t()


def _inputs() -> list[torch.Tensor]:
    return [rand((16, 32), seed=1), rand((32, 32), seed=2), rand((32, 32), seed=3)]


def _built() -> compiler.Built:
    xs = _inputs()
    return compiler.build(trace(_mlp, *xs), None, xs)


def _same(got: Any, want: Any) -> None:
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if isinstance(w, torch.Tensor):
            assert g.stride() == w.stride() and g.dtype == w.dtype
            torch.testing.assert_close(g, w, atol=0, rtol=0, equal_nan=True)
        else:
            assert g == w


@pytest.mark.parametrize("name", case_names())
def test_launcher_gives_the_step_by_step_results(name: str) -> None:
    c = case(name)
    graph = compiler.from_wire(compiler.to_wire(c.gm, c.example_inputs))
    built = compiler.build(graph, compiler.heuristic_schedule(graph, compiler.Target.detect("cpu")))
    torch.manual_seed(7)  # random ops (dropout) draw the same numbers in both runs
    want = built._run(list(c.example_inputs), None)
    torch.manual_seed(7)
    _same(built(*c.example_inputs), want)
    assert built._launcher.modes == {torch.device("cpu"): "jit"}


def test_source_is_deterministic_and_written_out() -> None:
    a, b = _built(), _built()
    src = a.launcher_source("cpu")
    assert src == b.launcher_source("cpu") == a.launcher_source("cpu")
    assert src.startswith("def run(inputs, boxed):")
    # sizes, strides and block sizes are literals; ATen ops are called directly
    assert "empty_strided((16, 32), (32, 1), dtype=k0, device=dev)" in src
    assert "XBLOCK=16" in src and "aten.permute.default" in src
    for mode in ("record",):
        assert a._launcher.source("cpu", mode) == b._launcher.source("cpu", mode)


def test_inputs_are_checked_every_call() -> None:
    built = _built()
    xs = _inputs()
    built(*xs)
    with pytest.raises(ValueError, match="takes 3 inputs"):
        built(*xs[:2])
    with pytest.raises(ValueError, match="expected torch.float32"):
        built(xs[0].double(), xs[1], xs[2])
    with pytest.raises(ValueError, match="expected strides"):
        built(xs[0].t().contiguous().t(), xs[1], xs[2])
    with pytest.raises(ValueError, match="must be a tensor"):
        built(1.0, xs[1], xs[2])
    # strides of size-1 dimensions do not matter
    xs1 = [rand((1, 32), seed=1), rand((32, 32), seed=2), rand((32, 32), seed=3)]
    built1 = compiler.build(trace(_mlp, *xs1), None, xs1)
    odd = torch.empty(32, 1).t().copy_(xs1[0])  # a (1, 32) with strides (1, 1)
    assert odd.stride() != xs1[0].stride()
    _same(built1(odd, xs1[1], xs1[2]), built1(*xs1))


def _hand_graph() -> tuple[fx.GraphModule, dict[str, Any]]:
    """x -> a = f(x) -> b = g(a) -> c = h(b), with Python functions that see what is alive."""
    seen: dict[str, Any] = {}

    def f(x: torch.Tensor) -> torch.Tensor:
        seen["x"] = weakref.ref(x)
        return x + 1

    def g(a: torch.Tensor) -> torch.Tensor:
        seen["a"] = weakref.ref(a)
        gc.collect()
        seen["x_alive_in_g"] = seen["x"]() is not None
        return a * 2

    def h(b: torch.Tensor, k: int) -> torch.Tensor:
        gc.collect()
        seen["a_alive_in_h"] = seen["a"]() is not None
        return b - k

    graph = fx.Graph()
    x = graph.placeholder("x")
    a = graph.call_function(f, (x,))
    b = graph.call_function(g, (a,))
    c = graph.call_function(h, (b,), {"k": 3})
    d = graph.call_function(operator.getitem, ((b, c), 1))
    graph.output((d, b))
    return fx.GraphModule(torch.nn.Module(), graph), seen


def _hand_launcher(gm: fx.GraphModule) -> GraphLauncher:
    from compiler.runtime.built import _last_uses
    from compiler.runtime.execution import Args, slot_tree

    nodes = list(gm.graph.nodes)
    slots = {n: i for i, n in enumerate(nodes)}
    execs = [Call(n, slots) for n in nodes if n.op == "call_function"]
    out = nodes[-1].args[0]
    frees = _last_uses(execs, Args(out, slots), len(nodes))
    plan = Plan(execs, [(0, None)], [], slot_tree(out, slots), frees)
    return GraphLauncher(plan, lambda launch, device: None, lambda device: [],
                         lambda pos, v: None, lambda xs: None, [])


def test_values_die_at_their_last_use_and_a_boxed_call_frees_its_inputs() -> None:
    gm, seen = _hand_graph()
    launcher = _hand_launcher(gm)
    args = [torch.ones(3)]
    d, b = launcher(args, True)
    assert args == []  # the boxed list was cleared: the graph held x alone
    assert not seen["x_alive_in_g"] and not seen["a_alive_in_h"]
    torch.testing.assert_close(d, torch.full((3,), 1.0))
    torch.testing.assert_close(b, torch.full((3,), 4.0))
    src = launcher.source("cpu")
    assert "del v0" in src and "del v1" in src and "v4 = (v2, v3)[1]" in src


def test_an_unboxed_call_leaves_the_inputs_alone() -> None:
    gm, seen = _hand_graph()
    launcher = _hand_launcher(gm)
    args = [torch.ones(3)]
    launcher(args, False)
    assert len(args) == 1 and seen["x_alive_in_g"]


def test_dead_buffers_only_kernels_read_are_reused_for_the_same_layout() -> None:
    def chain(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        a = x @ w     # kernel outputs that only kernels read...
        b = a @ w
        return b @ w  # ...so this one can take a's buffer

    x, w = rand((16, 16), seed=4), rand((16, 16), seed=5)
    built = compiler.build(trace(chain, x, w), None, [x, w])
    reuse = built._launcher.plan.reuse
    assert reuse, built.launcher_source()
    assert "# reused" in built.launcher_source()
    built.poison = True  # a reused buffer is poisoned again before its kernel writes it
    _same(built(x, w), built._run([x, w], None))
    torch.testing.assert_close(built(x, w), chain(x, w), atol=1e-4, rtol=1e-4)


def test_no_reuse_of_a_buffer_an_aten_call_read() -> None:
    gm, _ = _hand_graph()
    assert _hand_launcher(gm).plan.reuse == {}


# --- direct mode, with stand-ins for Triton's compiled kernels -------------------------


class CompiledKernel:
    """Stands in for triton's CompiledKernel: `run` is the launcher, called as Triton's JIT
    calls it; it runs the interpreted kernel on the same arguments."""

    refuse = False  # a launcher whose convention differs: raises on its arguments

    def __init__(self, fn: Any, launches: list) -> None:
        self.fn, self.launches = fn, launches
        self.function, self.packed_metadata = object(), object()

    def run(self, gx: int, gy: int, gz: int, stream: Any, function: Any, meta: Any,
            launch_metadata: Any, enter: Any, exit_: Any, *args: Any) -> None:
        if CompiledKernel.refuse:
            raise TypeError("function takes exactly 14 arguments")
        assert function is self.function and meta is self.packed_metadata and stream == 42
        assert launch_metadata is enter is exit_ is None
        self.launches.append((gx, gy, gz))
        self.fn[(gx, gy, gz)](*args)


class StandInJit:
    """What `launch.kernel_for(device)` gives: `[grid](...)` runs the interpreted kernel
    and returns a stand-in compiled kernel (as JITFunction.run returns the kernel)."""

    def __init__(self, fn: Any, log: dict) -> None:
        self.fn, self.log = fn, log

    def __getitem__(self, grid: tuple[int, ...]) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            self.log["jit"] = self.log.get("jit", 0) + 1
            self.fn[grid](*args, **kwargs)
            return self.log.setdefault(id(self.fn), CompiledKernel(self.fn, self.log.setdefault("direct", [])))

        return run


class RT:
    launch_enter_hook = None
    launch_exit_hook = None


def _direct_launcher(built: compiler.Built, log: dict, rt: type = RT) -> GraphLauncher:
    old = built._launcher
    cpu = torch.device("cpu")
    return GraphLauncher(
        old.plan, lambda launch, device: StandInJit(launch.kernel_for(cpu), log), built._constants,
        built._check_one, built._check_all, [2], direct=lambda device: True,
        runtime=lambda fallback: {"hooked": lambda: rt.launch_enter_hook is not None,
                                  "current_device": lambda: None,
                                  "current_stream": lambda index: 42, "fallback": fallback})


def test_direct_mode_launches_compiled_kernels_and_matches() -> None:
    built, log = _built(), {}
    launcher = _direct_launcher(built, log)
    xs = _inputs()
    want = built._run(list(xs), None)
    cpu = torch.device("cpu")
    _same(launcher(list(xs), False), want)  # first call: through the JIT, recorded
    assert launcher.modes[cpu] == "direct" and log["jit"] == 3 and log.get("direct") == []
    for _ in range(2):
        _same(launcher(list(xs), False), want)
    assert log["jit"] == 3 and len(log["direct"]) == 6
    src = launcher.source(cpu, "direct", [
        __import__("compiler.runtime.launcher", fromlist=["Recorded"]).Recorded(
            CompiledKernel(None, []), (True,) * n) for n in (2, 1, 0)])
    assert "stream, F0, M0, None, None, None, v0, v1, v8, 16, 32, 32, 8)" in src
    assert "if (hooked()\n            or current_device() != None\n" in src


def test_direct_mode_falls_back_on_a_hook_and_on_a_moved_alignment() -> None:
    built, log = _built(), {}

    class Hooked(RT):
        launch_enter_hook = None

    launcher = _direct_launcher(built, log, Hooked)
    xs = _inputs()
    want = built._run(list(xs), None)
    launcher(list(xs), False)
    Hooked.launch_enter_hook = print  # e.g. a profiler: launches go through the JIT
    _same(launcher(list(xs), False), want)
    assert log["jit"] == 6 and not log["direct"]
    Hooked.launch_enter_hook = None
    # an input 4 bytes off 16-byte alignment: the JIT specialises on it, so no direct launch
    odd = torch.empty(16 * 32 + 1)[1:].view(16, 32).copy_(xs[0])
    assert odd.data_ptr() % 16
    _same(launcher([odd, xs[1], xs[2]], False), want)
    assert log["jit"] == 9 and not log["direct"]
    _same(launcher(list(xs), False), want)
    assert log["jit"] == 9 and len(log["direct"]) == 3


def test_preloaded_kernels_are_launched_directly_from_the_first_call() -> None:
    built, log = _built(), {}
    launcher = _direct_launcher(built, log)
    cpu = torch.device("cpu")
    fns = [launch.kernel_for(cpu) for launch in launcher.plan.launches]
    launcher.preload(cpu, [CompiledKernel(fn, log.setdefault("direct", [])) for fn in fns])
    xs = _inputs()
    want = built._run(list(xs), None)
    _same(launcher(list(xs), False), want)  # no recording call through the JIT
    assert launcher.modes[cpu] == "direct" and "jit" not in log and len(log["direct"]) == 3
    # misaligned input: the whole call takes the JIT function, compiled only now
    odd = torch.empty(16 * 32 + 1)[1:].view(16, 32).copy_(xs[0])
    _same(launcher([odd, xs[1], xs[2]], False), want)
    assert log["jit"] == 3 and len(log["direct"]) == 3


def test_a_preload_without_loaded_kernels_records_as_before() -> None:
    built, log = _built(), {}
    launcher = _direct_launcher(built, log)
    cpu = torch.device("cpu")
    launcher.preload(cpu, [None] * len(launcher.plan.launches))
    xs = _inputs()
    _same(launcher(list(xs), False), built._run(list(xs), None))
    assert launcher.modes[cpu] == "direct" and log["jit"] == 3 and log["direct"] == []


def test_a_launch_without_a_compiled_kernel_keeps_the_jit_path() -> None:
    built = _built()
    cpu = torch.device("cpu")
    old = built._launcher
    launcher = GraphLauncher(
        old.plan, lambda launch, device: launch.kernel_for(cpu), built._constants,
        built._check_one, built._check_all, [2], direct=lambda device: True,
        runtime=lambda fallback: {})
    xs = _inputs()
    want = built._run(list(xs), None)
    _same(launcher(list(xs), False), want)  # the interpreter returns no CompiledKernel
    assert launcher.modes[cpu] == "jit"
    _same(launcher(list(xs), False), want)


def test_scalar_tensors_render() -> None:
    def f(x: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * s, (x * s).sum()

    x, s = rand((8, 4), seed=6), torch.tensor(1.5)
    built = compiler.build(trace(f, x, s), None, [x, s])
    assert "v1.shape != ()" in built.launcher_source()
    _same(built(x, s), built._run([x, s], None))



def test_a_launcher_that_refuses_its_arguments_sends_the_device_back_to_the_jit() -> None:
    built, log = _built(), {}
    launcher = _direct_launcher(built, log)
    xs = _inputs()
    want = built._run(list(xs), None)
    launcher(list(xs), False)

    CompiledKernel.refuse = True
    try:
        boxed = list(xs)
        _same(launcher(boxed, True), want)
        assert boxed == [] and launcher.modes[torch.device("cpu")] == "jit"
        _same(launcher(list(xs), False), want)
    finally:
        CompiledKernel.refuse = False


def test_an_empty_launch_does_not_keep_the_device_on_the_jit() -> None:
    def f(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x * 2, torch.softmax(y, -1)  # x has no elements: its kernel's grid is empty

    x, y = torch.empty(0, 4), rand((4, 8), seed=9)
    built = compiler.build(trace(f, x, y), None, [x, y])
    assert any(launch.empty for launch in built._launcher.plan.launches)
    log: dict = {}
    launcher = _direct_launcher(built, log)
    launcher._device_input = 1
    want = built._run([x, y], None)
    launcher([x, y], False)
    assert launcher.modes[torch.device("cpu")] == "direct"
    _same(launcher([x, y], False), want)
    assert len(log["direct"]) == 1


def test_views_of_known_layouts_are_made_without_aten_calls() -> None:
    def f(x: torch.Tensor, q: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = x * 2                                            # a kernel's buffer...
        a = F.scaled_dot_product_attention(q, q, q)          # ...and an ATen call's result
        return y[:, 2:5].t(), y.view(-1)[3:10], a.transpose(1, 2), x.t()

    x, q = rand((8, 6), seed=1), rand((1, 2, 4, 8), seed=2)
    built = compiler.build(trace(f, x, q), None, [x, q])
    src = built.launcher_source()
    assert src.count("reinterpret(") == 5, src  # slice, permute, view, slice; x.t()
    attention_view = next(line for line in src.splitlines() if "v9 = " in line)
    assert "op" in attention_view and "reinterpret" not in attention_view  # stays an ATen call
    got, want = built(x, q), built._run([x, q], None)
    _same(got, want)
    for g, w in zip(got, want, strict=True):
        assert g.storage_offset() == w.storage_offset()


@pytest.mark.slow
def test_the_host_path_bench_runs_with_stub_kernels() -> None:
    import json
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "tests.compiler.host_path_bench", "--scale", "tiny",
                           "--stub", "--device", "cpu", "-n", "2"],
                          capture_output=True, text=True, timeout=300, check=True)
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    assert [r["graph"] for r in rows] == ["gpt_block_train.fwd", "gpt_block_train.bwd"]
    assert all(r["steps_host_us"] > 0 and r["direct_host_us"] > 0 for r in rows)


def test_the_device_is_the_first_input_off_the_cpu() -> None:
    """A CPU scalar tensor beside accelerator tensors does not make a CPU graph."""
    plan = _built()._launcher.plan
    launcher = GraphLauncher(plan, lambda launch, device: None, lambda device: [],
                             lambda pos, v: None, lambda xs: None, [0, 1, 2])
    off = torch.empty(2, device="meta")
    assert launcher._pick_device_input([torch.tensor(1.0), off, torch.ones(1)]) == 1
    assert launcher._pick_device_input([torch.ones(1)] * 3) == 2
