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
from compiler import aot
from compiler.aot import CompileJob, ahead
from compiler.runtime import static_launch
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
    from compiler.aot import target as aot_target

    x, w = rand((64, 128), seed=1), rand((128,), seed=2)
    gm = trace(lambda a, b: F.gelu(a * b).sum(-1), x, w)
    target = compiler.Target.named("sm_90", name="NVIDIA H200")
    built = compiler.build(gm, compiler.heuristic_schedule(gm, target, [x, w]), [x, w])
    for spec in aot.launch_specs(built):
        fn, data = aot_target._jit_specialization(spec, 90)
        signature = json.loads(data)["signature"]
        codes, keep = static_launch.argument_plan(signature)
        pointers = len(spec.arg_dtypes)
        assert codes[:pointers] == "O" * pointers and codes.endswith("OO")
        assert keep[:pointers] == tuple(range(pointers))
        assert set(codes[pointers:-2]) <= {"i", "l"}
        names = list(signature)
        assert all(signature[names[i]] != "constexpr" for i in keep)
        assert all(signature[n] == "constexpr" for n in spec.constexprs if n in signature)


class _Kernel:
    """What `static_launch.load` reads and writes of Triton's CompiledKernel."""

    def __init__(self, signature: dict, **fields: object) -> None:
        self.src, self.metadata, self.module, self._run = _src(signature), _meta(**fields), None, None
        self.name, self.function, self.inits = "fused_k", None, 0
        self.metadata_group = {"fused_k.cubin": "/cache/fused_k.cubin", "fused_k.json": "/j"}

    def _init_handles(self) -> None:  # Triton's own load
        self.inits += 1
        self.module, self._run = "triton's module", "triton's launcher"


class _Loader(_FakeStatic):
    loads: list[tuple] = []

    @staticmethod
    def _load_kernel(*args: object) -> tuple:
        _Loader.loads.append(args)
        return ("module", 0xF00, 40, 0)


def _static_here(monkeypatch, available: bool = True) -> None:
    monkeypatch.setattr(static_launch, "available", lambda: available)
    monkeypatch.setattr(torch._C, "_StaticCudaLauncher", _Loader, raising=False)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda device: SimpleNamespace(shared_memory_per_block_optin=232448))
    _Loader.loads = []


def test_load_loads_the_cubin_with_torch_and_launches_with_the_static_launcher(monkeypatch) -> None:
    _static_here(monkeypatch)
    kernel = _Kernel({"x": "*fp32", "n": "i32"}, shared=4096, num_warps=8)
    static_launch.load(kernel)
    assert _Loader.loads == [("/cache/fused_k.cubin", "fused_k", 4096, 0)]
    assert kernel.inits == 0 and kernel.module == "module" and kernel.function == 0xF00
    assert (kernel.n_regs, kernel.n_spills, kernel.n_max_threads) == (40, 0, 256)
    assert isinstance(kernel._run, static_launch.StaticLauncher)
    static_launch.load(kernel)  # loaded already: untouched
    assert len(_Loader.loads) == 1


@pytest.mark.parametrize("signature,fields", [
    ({"x": "*fp32", "s": "fp16"}, {}),  # refused: Triton's launcher packs half scalars
    ({"x": "*fp32"}, {"shared": 300_000}),  # more than the device has: Triton raises
])
def test_kernels_the_static_path_does_not_take_load_through_triton(
        monkeypatch, signature: dict, fields: dict) -> None:
    _static_here(monkeypatch)
    kernel = _Kernel(signature, **fields)
    static_launch.load(kernel)
    assert kernel.inits == 1 and kernel._run == "triton's launcher" and _Loader.loads == []


def test_a_cubin_torch_cannot_load_is_loaded_by_triton(monkeypatch) -> None:
    _static_here(monkeypatch)

    class Failing(_Loader):
        @staticmethod
        def _load_kernel(*args: object) -> tuple:
            raise RuntimeError("CUDA driver error: file not found")

    monkeypatch.setattr(torch._C, "_StaticCudaLauncher", Failing, raising=False)
    kernel = _Kernel({"x": "*fp32"})
    static_launch.load(kernel)
    assert kernel.inits == 1 and kernel._run == "triton's launcher"


def test_without_the_static_launcher_or_with_a_load_hook_triton_loads(monkeypatch) -> None:
    from triton import knobs

    _static_here(monkeypatch, available=False)
    kernel = _Kernel({"x": "*fp32"})
    static_launch.load(kernel)
    assert kernel.inits == 1
    _static_here(monkeypatch)
    monkeypatch.setattr(knobs.runtime, "kernel_load_start_hook", lambda *a: None)
    hooked = _Kernel({"x": "*fp32"})
    static_launch.load(hooked)
    assert hooked.inits == 1 and _Loader.loads == []


def test_the_lazy_driver_builds_tritons_utility_module_on_first_use_only(monkeypatch) -> None:
    import triton.backends.nvidia.driver as nvidia
    from triton.runtime.driver import driver

    built = []
    monkeypatch.setattr(nvidia, "CudaUtils", lambda: built.append(1) or "utils")
    monkeypatch.setattr(driver, "_active", None)
    monkeypatch.setattr(driver, "_default", None)
    monkeypatch.setattr(static_launch, "available", lambda: True)
    static_launch.lazy_driver()
    made = driver._active
    assert isinstance(made, nvidia.CudaDriver) and made.launcher_cls is nvidia.CudaLauncher
    assert made.get_current_device is torch.cuda.current_device and built == []
    assert made.utils == "utils" and made.utils == "utils" and built == [1]
    static_launch.lazy_driver()  # a driver exists: left alone
    assert driver._active is made


def test_a_triton_whose_driver_classes_differ_keeps_its_own_driver(monkeypatch) -> None:
    from triton.runtime.driver import driver

    def differs() -> type:
        raise ImportError("cannot import name 'CudaUtils'")

    monkeypatch.setattr(driver, "_active", None)
    monkeypatch.setattr(driver, "_default", None)
    monkeypatch.setattr(static_launch, "available", lambda: True)
    monkeypatch.setattr(static_launch, "_lazy_driver_class", differs)
    static_launch.lazy_driver()  # no error: Triton makes its own when it is first used
    assert driver._active is None


def test_no_lazy_driver_where_triton_made_its_own_or_static_launch_is_off(monkeypatch) -> None:
    from triton.runtime.driver import driver

    monkeypatch.setattr(static_launch, "available", lambda: True)
    own = object()
    monkeypatch.setattr(driver, "_active", None)
    monkeypatch.setattr(driver, "_default", own)
    static_launch.lazy_driver()
    assert driver._active is None
    monkeypatch.setattr(driver, "_default", None)
    monkeypatch.setattr(static_launch, "available", lambda: False)
    static_launch.lazy_driver()
    assert driver._active is None


def test_available_needs_per_signature_launchers_a_static_launcher_and_no_opt_out(
        monkeypatch) -> None:
    monkeypatch.setattr(torch._C, "_StaticCudaLauncher", _FakeStatic, raising=False)
    monkeypatch.setattr(aot, "per_kernel_launchers", lambda: True)
    assert static_launch.available()
    monkeypatch.setenv("KILN_STATIC_LAUNCH", "off")
    assert not static_launch.available()
    monkeypatch.delenv("KILN_STATIC_LAUNCH")
    monkeypatch.setattr(aot, "per_kernel_launchers", lambda: False)
    assert not static_launch.available()


def test_with_the_static_launcher_the_workers_build_no_launchers(monkeypatch) -> None:
    sent: list[CompileJob] = []

    class Pool:
        def compile_all(self, jobs: list[CompileJob]) -> list[None]:
            sent.extend(jobs)
            return [None] * len(jobs)

    monkeypatch.setattr(ahead, "shared", lambda: Pool())
    monkeypatch.setattr(ahead, "per_kernel_launchers", lambda: True)
    monkeypatch.setattr(ahead, "is_cached", lambda key, fn: key != "k_a")
    jobs = [CompileJob(k, "", "0" * 64, "f", json.dumps({"cache_key": f"k_{k}",
                                                         "signature": {"x": f"*{k}"}}))
            for k in ("a", "b", "c")]
    assert aot.compile_ahead(jobs, launchers=False) == 0  # one job: compiled here
    assert sent == []
    monkeypatch.setattr(ahead, "is_cached", lambda key, fn: False)
    assert aot.compile_ahead(jobs, launchers=False) == 3
    assert [(j.kernel, j.launcher) for j in sent] == [("a", False), ("b", False), ("c", False)]
