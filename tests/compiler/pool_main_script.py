"""A script with top-level side effects and no `__main__` guard, as training scripts often
are, that compiles through the compile pool: each process that runs this file leaves a
marker file. Run by tests/compiler/test_compile_pool_workers.py: only the script's own
process may leave one (the workers must not re-run the user's script)."""

import json
import os
import sys
import time

import torch  # noqa: F401 - what a training script imports; a worker must not pay it

from compiler.aot.jobs import CompileJob
from compiler.aot.pool import CompilePool
from tests.compiler.crashing_compile import crash_on_boom

open(os.path.join(os.environ["KILN_TEST_MARKERS"], str(os.getpid())), "w").close()

pool = CompilePool(2)
start = time.perf_counter()
pool.start()
jobs = [CompileJob(k, source="", source_hash="0" * 64, fn_name="f", spec="{}") for k in ("ok_a", "ok_b")]
results = pool.compile_all(jobs, run=crash_on_boom)
ready = time.perf_counter() - start
pool.close()
print(json.dumps({"results": results, "pid": os.getpid(), "first_results_s": round(ready, 2)}))
sys.stdout.flush()
