"""Compile workers: kernels compile for an sm_90 target in parallel processes, the JIT then
finds every binary in Triton's cache, and the pool outlives a compile that crashes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from compiler import aot
from compiler.aot import ahead
from compiler.aot.jobs import CompileJob
from compiler.aot.pool import CRASHED, MAX_WORKERS, CompilePool, workers
from tests.compiler.crashing_compile import crash_on_boom
from tests.compiler.precompile_sm90 import run_module


def _precompile_sm90(tmp_path: Path, *args: str) -> dict:
    lines = run_module("tests.compiler.precompile_sm90", tmp_path, *args, timeout=600,
                       KILN_COMPILE_WORKERS="2", TRITON_DEFAULT_FP_FUSION="1")
    return json.loads(lines[-1])


@pytest.mark.slow
def test_workers_compile_each_distinct_kernel_once_and_the_jit_loads_them_from_the_cache(
        tmp_path: Path) -> None:
    got = _precompile_sm90(tmp_path)
    assert got["launches"] == 3 and got["sources"] == 2  # the two layers share one kernel
    assert got["jobs"] == got["compiled"] == 2
    assert got["warmup_cache_files"] == 0  # every launch found the workers' binary


def test_without_workers_the_jit_compiles_on_the_building_thread(tmp_path: Path) -> None:
    got = _precompile_sm90(tmp_path, "--serial")
    assert got["jobs"] == got["compiled"] == 0
    assert got["warmup_cache_files"] > 0


def _job(kernel: str) -> CompileJob:
    return CompileJob(kernel, source="", source_hash="0" * 64, fn_name="f", spec="{}")


def test_the_pool_outlives_a_compile_that_kills_its_worker() -> None:
    pool = CompilePool(2)
    try:
        jobs = [_job("ok_a"), _job("boom"), _job("ok_b"), _job("bad")]
        assert pool.compile_all(jobs, run=crash_on_boom) == [
            None, CRASHED, None, "CompilationError: bad"]
        assert pool.compile_all([_job("ok_c"), _job("ok_d")], run=crash_on_boom) == [None, None]
    finally:
        pool.close()


def test_compile_ahead_names_a_kernel_that_kills_the_compiler(monkeypatch) -> None:
    class Crashing(CompilePool):
        def compile_all(self, jobs, run=None):  # noqa: ARG002 - the verdicts of a crash
            return [None if j.kernel != "boom" else CRASHED for j in jobs]

    monkeypatch.setattr(ahead, "shared", lambda: Crashing(1))
    with pytest.raises(aot.CompileCrash, match="kernel boom killed the Triton compiler"):
        aot.compile_ahead([_job("ok"), _job("boom")])


def test_worker_count_comes_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("KILN_COMPILE_WORKERS", "3")
    assert workers() == 3
    monkeypatch.setenv("KILN_COMPILE_WORKERS", "many")
    with pytest.raises(ValueError, match="KILN_COMPILE_WORKERS must be a whole number"):
        workers()
    monkeypatch.delenv("KILN_COMPILE_WORKERS")
    assert 1 <= workers() <= MAX_WORKERS


def test_specialization_names_the_target_where_triton_leaves_it_out() -> None:
    """Triton 3.6's specialization data has no target (3.9's has): the capture adds the
    current driver's, which the compile workers and the cache key need."""
    from triton import knobs
    from triton.runtime.driver import driver

    spec = {"name": "m.f", "signature": {"x": "*fp32"}, "constant_keys": [], "constant_vals": [],
            "attrs_keys": [[0]], "attrs_vals": [[["tt.divisibility", 16]]], "options": {},
            "key": "k"}

    class Fn:  # what a JIT function's warmup does with the hook installed
        def warmup(self, *_args: object, grid: tuple, **_kw: object) -> None:
            knobs.runtime.jit_cache_hook(key="k", repr="f", fn=None, is_manual_warmup=True,
                                         already_compiled=False,
                                         compile={"specialization_data": json.dumps(spec)})

    saved = driver._active
    driver.set_active(aot.StandInDriver(90))
    try:
        data = json.loads(aot.specialization(Fn(), (), (1,), {}))
    finally:
        driver._active = saved
    assert data["target"] == {"backend": "cuda", "arch": 90, "warp_size": 32}
    assert data["cache_key"] is None  # no JIT function to hash: no binary is looked up
    assert {k: data[k] for k in spec} == spec


