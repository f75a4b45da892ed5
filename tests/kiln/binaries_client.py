"""`python -m tests.kiln.binaries_client URL KEY`: a fresh client's precompile of a graph the
service built for sm_90, on a machine without a GPU: a stand-in CUDA driver names the
device and its target (nothing launches). It reads the schedule and the graph's wire form
from stdin's JSON (`{"graph": ..., "schedule": ...}`), builds it, fetches the compiled
kernels from the service at URL the way `Resolver._build` does (`kiln.binaries` as the
thread's binary source of `compiler.aot.compile_ahead`), then has Triton's JIT warm every
launch up. Prints one JSON line: launches, compile jobs, kernels the compile workers
compiled, the seconds all of it took, kiln's binary counters and warnings, the keys installed, and the Triton cache
files the JIT's warmup wrote (0: every launch loaded a binary it found).
Run with the interpreter off and a private TRITON_CACHE_DIR and KILN_KERNEL_DIR
(tests/service/test_binaries.py)."""

from __future__ import annotations

import json
import os
import sys
import time
import warnings

from triton import knobs
from triton.runtime.driver import driver

import compiler
from compiler import aot
from kiln import degrade
from kiln.binaries import ServiceBinaries
from kiln.client import ServiceClient


def _cache_files() -> int:
    return sum(len(files) for _, _, files in os.walk(knobs.cache.dir))


def main() -> None:
    url = sys.argv[1]
    doc = json.loads(sys.stdin.read())
    built = compiler.build(compiler.from_wire(doc["graph"]), compiler.Schedule.from_json(doc["schedule"]))
    driver.set_active(aot.StandInDriver(90))
    infos = built.launches()
    jobs = built._compile_jobs(infos)
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with aot.binary_source(ServiceBinaries(ServiceClient(url))) as placed:
            compiled = aot.compile_ahead(jobs)
    before = _cache_files()
    for info in infos:
        info.fn.warmup(*info.arg_dtypes, grid=info.grid, **info.constexprs, **info.options)
    seconds = time.perf_counter() - start
    stats = degrade.stats()
    print(json.dumps({"launches": len(infos), "jobs": len(jobs), "compiled": compiled,
                      "keys": [aot.job_key(j) for j in jobs], "placed": placed,
                      "fetched": stats.get("binaries_fetched", 0),
                      "refused": stats.get("binaries_refused", 0),
                      "missed": stats.get("binaries_missed", 0),
                      "warned": sorted(degrade.warned()),
                      "warnings": [str(w.message) for w in caught if "kiln" in str(w.message)],
                      "warmup_cache_files": _cache_files() - before,
                      "seconds": round(seconds, 3)}))


if __name__ == "__main__":
    main()
