"""Compile workers are fresh interpreters that run the pool's loop only (issue 14, cold
compile time): the user's script, with its imports (torch) and its top-level code, is not
run again in each of them, as multiprocessing's spawn would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_workers_do_not_run_the_users_script_again(tmp_path: Path) -> None:
    env = {**os.environ, "KILN_TEST_MARKERS": str(tmp_path), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / "tests/compiler/pool_main_script.py")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["results"] == [None, None]
    assert sorted(os.listdir(tmp_path)) == [str(got["pid"])]  # the script's process only


def test_threads_compiling_at_once_share_the_workers() -> None:
    import threading

    from compiler.aot import CompileJob
    from compiler.aot.pool import CompilePool
    from tests.compiler.crashing_compile import crash_on_boom

    pool = CompilePool(2)
    results: dict[int, list] = {}

    def compile_some(n: int) -> None:
        jobs = [CompileJob(f"ok_{n}_{i}", "", "0" * 64, "f", "{}") for i in range(3)]
        jobs.append(CompileJob(f"bad_{n}", "", "0" * 64, "f", "{}"))
        results[n] = pool.compile_all(jobs, run=crash_on_boom)

    try:
        threads = [threading.Thread(target=compile_some, args=(n,)) for n in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert results == {n: [None, None, None, f"CompilationError: bad_{n}"] for n in range(3)}
        assert pool._count <= 2
    finally:
        pool.close()


def raising(job) -> str | None:
    """A runner that fails with an exception (compile_job reports its own failures)."""
    raise RuntimeError(f"cannot compile {job.kernel}")


def test_a_runner_that_raises_or_no_worker_at_all_leaves_the_job_to_the_building_thread(
        monkeypatch) -> None:
    from compiler.aot import CompileJob
    from compiler.aot import pool as compile_pool
    from compiler.aot.pool import CompilePool

    jobs = [CompileJob(k, "", "0" * 64, "f", "{}") for k in ("a", "b")]
    pool = CompilePool(2)
    try:
        assert pool.compile_all(jobs, run=raising) == [
            "RuntimeError: cannot compile a", "RuntimeError: cannot compile b"]
    finally:
        pool.close()

    def no_process() -> None:
        raise OSError("cannot start a process")

    monkeypatch.setattr(compile_pool, "_Worker", no_process)
    pool = CompilePool(2)
    assert pool.compile_all(jobs) == ["no compile worker: OSError: cannot start a process"] * 2
    assert pool._count == 0
