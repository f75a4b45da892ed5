"""A CPU worker's heuristic build job, timed as the worker runs it (`service.build_child.run`:
one child forked from a warm server parses, lowers and builds the graph, then checks it on
the Triton interpreter or compiles every kernel for the CUDA target).

    python -m bench.build_job                 # gpt_block.fwd for sm_90, mlp.fwd for the CPU
    python -m bench.build_job --repeat 5

Prints each job's wall seconds; the first of each target pays its fork server's start
(kiln, torch and Triton imported; for sm_90 also Triton's compiler and its cache key), the
others are what a warm worker spends per job. Run with TRITON_INTERPRET=1, as `kiln worker
--device cpu` does.
"""

from __future__ import annotations

import argparse
import json
import time

CASES = (("gpt_block.fwd", "sm_90"), ("mlp.fwd", "cpu"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="jobs per case")
    args = parser.parse_args()

    import compiler
    from service import build_child
    from service.settings import Settings
    from tests.corpus import case

    settings = Settings()
    for name, arch in CASES:
        c = case(name)
        wire = json.dumps(compiler.to_wire(c.gm, c.example_inputs))
        target = (compiler.Target.detect("cpu") if arch == "cpu"
                  else compiler.Target.named(arch, name="NVIDIA H200")).to_json()
        for i in range(args.repeat):
            started = time.monotonic()
            outcome = build_child.run(None, wire, target, settings)
            print(f"{name} {arch} job {i}: {time.monotonic() - started:.2f} s  ({outcome.note})",
                  flush=True)


if __name__ == "__main__":
    main()
