"""Torch's static launcher in place of Triton 3.6's per-signature C launchers (issue 14,
service-hit first step): which kernels it may launch, the argument types and positions it
is given for a real kiln kernel compiled for sm_90 here, Triton's launcher protocol, and the
launcher class swapped only while a kernel loads. Launching itself needs a GPU
(tests/compiler/test_gpu_host_path.py)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

import compiler
from compiler.runtime import compile_pool, static_launch
from compiler.runtime.compile_pool import CompileJob
from tests.compiler.oputil import rand, trace


def _meta(**fields: object) -> SimpleNamespace:
    base = dict(num_warps=4, shared=1024, num_ctas=1, global_scratch_size=0,
                profile_scratch_size=0, launch_cooperative_grid=False, launch_pdl=False,
                tensordesc_meta=None)
    return SimpleNamespace(**{**base, **fields})


def _src(signature: dict) -> SimpleNamespace:
    return SimpleNamespace(signature=signature)


SIGNATURE = {"in_ptr0": "*bf16", "out_ptr0": "*fp32", "xnumel": "i32", "n": "constexpr",
             "scale": "fp32", "big": "i64", "XBLOCK": "constexpr"}


def test_argument_plan_drops_constexprs_and_adds_the_scratch_pointers() -> None:
    assert static_launch.argument_plan(SIGNATURE) == ("OOifl" + "OO", (0, 1, 2, 4, 5))


@pytest.mark.parametrize("signature,fields,why", [
    ({"x": "*fp32", "s": "bf16"}, {}, "argument type bf16"),
    ({"x": "*fp32", "t": ("*fp32", "i32")}, {}, "tuple argument"),
    ({"x": "*fp32", "d": "nvTmaDesc"}, {}, "argument type nvTmaDesc"),
    ({"x": "*fp32"}, {"global_scratch_size": 128}, "global scratch size"),
    ({"x": "*fp32"}, {"profile_scratch_size": 64}, "profile scratch size"),
    ({"x": "*fp32"}, {"num_ctas": 2}, "a cluster launch"),
    ({"x": "*fp32"}, {"launch_pdl": True}, "a cooperative or programmatic launch"),
    ({"x": "*fp32"}, {"tensordesc_meta": [{}]}, "tensor descriptors"),
])
def test_kernels_the_static_launcher_would_launch_differently_keep_tritons(
        signature: dict, fields: dict, why: str) -> None:
    assert why in static_launch.refusal(_src(signature), _meta(**fields))
    assert static_launch.refusal(_src({"x": "*fp32", "n": "i32"}), _meta()) is None


class _FakeStatic:
    calls: list[tuple] = []

    @staticmethod
    def _launch_kernel(*args: object) -> None:
        _FakeStatic.calls.append(args)


def test_the_launcher_takes_tritons_call_and_passes_the_kernels_arguments(monkeypatch) -> None:
    monkeypatch.setattr(torch._C, "_StaticCudaLauncher", _FakeStatic, raising=False)
    _FakeStatic.calls = []
    launcher = static_launch.StaticLauncher(_src(SIGNATURE), _meta(num_warps=8, shared=4096))
    hooks: list[tuple[str, object]] = []
    x, y = object(), object()
    launcher(3, 2, 1, 77, 1234, "packed", "meta", lambda m: hooks.append(("enter", m)),
             lambda m: hooks.append(("exit", m)), x, y, 100, 16, 0.5, 2**40, 64)
    assert _FakeStatic.calls == [(1234, 3, 2, 1, 8, 4096, "OOiflOO", (x, y, 100, 0.5, 2**40, None, None), 77)]
    assert hooks == [("enter", "meta"), ("exit", "meta")]
    launcher(0, 1, 1, 77, 1234, None, None, None, None, x, y, 0, 16, 0.5, 1, 64)
    assert len(_FakeStatic.calls) == 1  # an empty grid launches nothing, as Triton's


def test_a_kiln_kernel_specialised_for_sm90_has_a_plan_matching_its_launch() -> None:
    """A real generated kernel, specialised as a client's JIT on an H200 would (the
    signature its ASTSource, and so Triton's launcher, gets): the kernel's arguments are the
    launch's buffers first, then integers; its block sizes are constexprs."""
    from tuner import aot

    x, w = rand((64, 128), seed=1), rand((128,), seed=2)
    gm = trace(lambda a, b: F.gelu(a * b).sum(-1), x, w)
    target = compiler.Target.named("sm_90", name="NVIDIA H200")
    built = compiler.build(gm, compiler.heuristic_schedule(gm, target, [x, w]), [x, w])
    for spec in aot.launch_specs(built):
        fn, data = aot._jit_specialization(spec, 90)
        signature = json.loads(data)["signature"]
        codes, keep = static_launch.argument_plan(signature)
        pointers = len(spec.arg_dtypes)
        assert codes[:pointers] == "O" * pointers and codes.endswith("OO")
        assert keep[:pointers] == tuple(range(pointers))
        assert set(codes[pointers:-2]) <= {"i", "l"}
        names = list(signature)
        assert all(signature[names[i]] != "constexpr" for i in keep)
        assert all(signature[n] == "constexpr" for n in spec.constexprs if n in signature)


class _Driver:
    def __init__(self) -> None:
        self.launcher_cls = lambda src, meta: ("triton's", src.signature)


class _Kernel:
    def __init__(self, driver: _Driver, signature: dict, **fields: object) -> None:
        self.driver, self.src, self.metadata, self.module = driver, _src(signature), _meta(**fields), None
        self._run = None

    def _init_handles(self) -> None:  # what Triton's does with the launcher class
        self._run = self.driver.launcher_cls(self.src, self.metadata)
        self.module = "loaded"


def _with_driver(monkeypatch, available: bool) -> _Driver:
    from triton.runtime.driver import driver

    fake = _Driver()
    monkeypatch.setattr(driver, "_active", fake)
    monkeypatch.setattr(static_launch, "available", lambda: available)
    monkeypatch.setattr(torch._C, "_StaticCudaLauncher", _FakeStatic, raising=False)
    return fake


def test_load_swaps_the_launcher_class_for_the_call_only(monkeypatch) -> None:
    fake = _with_driver(monkeypatch, True)
    original = fake.launcher_cls
    kernel = _Kernel(fake, {"x": "*fp32", "n": "i32"})
    static_launch.load(kernel)
    assert isinstance(kernel._run, static_launch.StaticLauncher) and kernel.module == "loaded"
    assert fake.launcher_cls is original
    refused = _Kernel(fake, {"x": "*fp32", "s": "fp16"})
    static_launch.load(refused)
    assert refused._run == ("triton's", {"x": "*fp32", "s": "fp16"})
    static_launch.load(kernel)  # loaded already: untouched
    assert isinstance(kernel._run, static_launch.StaticLauncher)


def test_without_the_static_launcher_kernels_load_with_tritons(monkeypatch) -> None:
    fake = _with_driver(monkeypatch, False)
    kernel = _Kernel(fake, {"x": "*fp32"})
    static_launch.load(kernel)
    assert kernel._run == ("triton's", {"x": "*fp32"})


def test_available_needs_per_signature_launchers_a_static_launcher_and_no_opt_out(
        monkeypatch) -> None:
    monkeypatch.setattr(torch._C, "_StaticCudaLauncher", _FakeStatic, raising=False)
    monkeypatch.setattr(compile_pool, "per_kernel_launchers", lambda: True)
    assert static_launch.available()
    monkeypatch.setenv("KILN_STATIC_LAUNCH", "off")
    assert not static_launch.available()
    monkeypatch.delenv("KILN_STATIC_LAUNCH")
    monkeypatch.setattr(compile_pool, "per_kernel_launchers", lambda: False)
    assert not static_launch.available()


def test_with_the_static_launcher_the_workers_build_no_launchers(monkeypatch) -> None:
    sent: list[CompileJob] = []

    class Pool:
        def compile_all(self, jobs: list[CompileJob]) -> list[None]:
            sent.extend(jobs)
            return [None] * len(jobs)

    monkeypatch.setattr(compile_pool, "shared", lambda: Pool())
    monkeypatch.setattr(compile_pool, "per_kernel_launchers", lambda: True)
    monkeypatch.setattr(compile_pool, "is_cached", lambda key, fn: key != "k_a")
    jobs = [CompileJob(k, "", "0" * 64, "f", json.dumps({"cache_key": f"k_{k}",
                                                         "signature": {"x": f"*{k}"}}))
            for k in ("a", "b", "c")]
    assert compile_pool.compile_ahead(jobs, launchers=False) == 0  # one job: compiled here
    assert sent == []
    monkeypatch.setattr(compile_pool, "is_cached", lambda key, fn: False)
    assert compile_pool.compile_ahead(jobs, launchers=False) == 3
    assert [(j.kernel, j.launcher) for j in sent] == [("a", False), ("b", False), ("c", False)]
