"""Compile workers build Triton's per-signature C launchers too (issue 14, cold compile
time): on a Triton that builds one per kernel signature when it loads a kernel (3.6), the
workers build them in parallel, for binaries the cache already holds as well, one job per
signature; on one that does not (3.9), nothing changes. The real build on Triton 3.6 is
checked by hand (the note of issue-14-cold); here the plan and the worker's calls."""

from __future__ import annotations

import json

import pytest

from compiler import aot
from compiler.aot import CompileJob, ahead, launchers, worker
from compiler.runtime import loading


def _job(kernel: str, signature: dict | None, key: str | None = None) -> CompileJob:
    spec = {"cache_key": key}
    if signature is not None:
        spec["signature"] = signature
    return CompileJob(kernel, source="", source_hash="0" * 64, fn_name="f", spec=json.dumps(spec))


PTRS = {"in_ptr0": "*bf16", "out_ptr0": "*bf16", "xnumel": "i32", "XBLOCK": "constexpr"}
OTHER = {"in_ptr0": "*fp32", "out_ptr0": "*fp32", "xnumel": "i32", "XBLOCK": "constexpr"}


def test_one_launcher_per_signature_and_cached_binaries_only_build_theirs() -> None:
    a, b, c, d = _job("a", PTRS), _job("b", PTRS), _job("c", OTHER), _job("d", None)
    plan = ahead._with_launchers([a, b, c, d], todo=[b, d])
    # Both compiling jobs go, b building the launcher a shares; c's binary is cached, but
    # its signature's launcher is built by sending it (its compile then finds the binary).
    assert [(j.kernel, j.launcher, compiles) for j, compiles in plan] == [
        ("b", True, True), ("d", True, True), ("c", True, False)]
    assert ahead._with_launchers([a, b], todo=[a, b]) == [
        (a, True), (CompileJob("b", "", "0" * 64, "f", b.spec, launcher=False), True)]


class _Pool:
    def __init__(self) -> None:
        self.sent: list[CompileJob] = []

    def compile_all(self, jobs: list[CompileJob]) -> list[str | None]:
        self.sent.extend(jobs)
        return [None] * len(jobs)


def _cached_except(monkeypatch, missing: set[str]) -> None:
    monkeypatch.setattr(ahead, "is_cached", lambda key, fn: key not in missing)


def test_compile_ahead_sends_cached_binaries_for_their_launchers_and_counts_compiles(
        monkeypatch) -> None:
    pool = _Pool()
    monkeypatch.setattr(ahead, "shared", lambda: pool)
    monkeypatch.setattr(ahead, "per_kernel_launchers", lambda: True)
    _cached_except(monkeypatch, {"k_a"})
    jobs = [_job("a", PTRS, "k_a"), _job("b", OTHER, "k_b"), _job("c", OTHER, "k_c")]
    assert ahead.compile_ahead(jobs) == 1  # a compiled; b only built a launcher
    assert [(j.kernel, j.launcher) for j in pool.sent] == [("a", True), ("b", True)]


def test_without_per_kernel_launchers_cached_binaries_stay_out_of_the_pool(monkeypatch) -> None:
    pool = _Pool()
    monkeypatch.setattr(ahead, "shared", lambda: pool)
    monkeypatch.setattr(ahead, "per_kernel_launchers", lambda: False)
    _cached_except(monkeypatch, {"k_a", "k_b"})
    jobs = [_job("a", PTRS, "k_a"), _job("b", PTRS, "k_b"), _job("c", OTHER, "k_c")]
    assert ahead.compile_ahead(jobs) == 2
    assert [j.kernel for j in pool.sent] == ["a", "b"]


def test_the_worker_builds_the_launcher_only_when_its_job_says(monkeypatch) -> None:
    built = []
    monkeypatch.setattr(worker, "_compile", lambda job: f"kernel {job.kernel}")
    monkeypatch.setattr(worker, "build_launcher", built.append)
    assert worker.compile_job(_job("a", PTRS)) is None
    assert worker.compile_job(CompileJob("b", "", "0" * 64, "f", "{}", launcher=False)) is None
    assert built == ["kernel a"]

    def failing(kernel: object) -> None:
        raise OSError("no C compiler")

    monkeypatch.setattr(worker, "build_launcher", failing)
    assert worker.compile_job(_job("c", PTRS)) == "launcher: OSError: no C compiler"


def test_a_kernel_for_another_backend_or_this_triton_builds_no_launcher(monkeypatch) -> None:
    class Meta:
        def __init__(self, backend: str) -> None:
            self.target = type("T", (), {"backend": backend})()

    class Kernel:
        def __init__(self, backend: str) -> None:
            self.metadata, self.src = Meta(backend), None

    launchers.build_launcher(Kernel("hip"))  # returns before any launcher class
    if not launchers.per_kernel_launchers():  # Triton 3.9: one launcher for every kernel
        launchers.build_launcher(Kernel("cuda"))


def test_warm_workers_have_tritons_own_cache_key(monkeypatch) -> None:
    """`warm` asks Triton's own function (a stand-in here: a test that prepared loading in
    this process has already put the child's key in its place)."""
    import triton.runtime.cache as cache

    calls = []
    monkeypatch.setattr(cache, "triton_key", lambda: calls.append(1) or "key")
    worker.warm()
    assert calls == [1]


def test_the_loader_hashes_triton_with_a_short_switch_interval_and_restores_it(monkeypatch) -> None:
    """Hashing Triton's library here (no child gave its key) on a thread while the tracing
    thread runs Python is GIL starved at the default 5 ms interval
    (`triton_key.HASHING_SWITCH_INTERVAL`)."""
    import sys

    import triton.runtime.cache as cache
    from triton.runtime.driver import driver

    from compiler.runtime import gil, triton_key

    seen = []
    monkeypatch.setattr(triton_key, "_known", False)
    monkeypatch.setattr(triton_key, "_child", None)
    monkeypatch.setattr(cache, "triton_key", lambda: seen.append(sys.getswitchinterval()))
    monkeypatch.setattr(driver, "_active", aot.StandInDriver(90))
    before = sys.getswitchinterval()
    loading.prepare_loading()
    assert seen[0] == pytest.approx(min(before, gil.SHORT_SWITCH_INTERVAL))
    assert sys.getswitchinterval() == before


def test_the_backends_part_of_a_cache_key_is_paid_ahead(monkeypatch) -> None:
    """After `backend_hash`, a kernel's first cache key runs no `ptxas --version`."""
    import subprocess

    from triton.backends.compiler import GPUTarget

    aot.backend_hash(GPUTarget("cuda", 90, 32))
    spawned = []
    real = subprocess.Popen.__init__
    monkeypatch.setattr(subprocess.Popen, "__init__",
                        lambda self, *a, **k: spawned.append(a) or real(self, *a, **k))
    from triton.compiler.compiler import make_backend

    backend = make_backend(GPUTarget("cuda", 90, 32))
    backend.hash()
    backend.parse_options({"num_warps": 8}).hash()
    assert spawned == []
