"""What a service hit costs per graph: a submission's answer (`POST /v1/graphs`, the whole
graph sent, parsed and named by the service) against a lookup's (`GET /v1/schedules/{key}`,
the key alone), for a model's real training graphs against an embedded `kiln serve`.

    python -m bench.lookup_vs_submit [--model gpt2] [--repeat 10]

The model's forward and backward graphs are captured as `bench.hit_cpu` does, submitted for
an sm_90 target and left to the service's CPU worker until both have a heuristic schedule
(its job then done: the service has no GPU worker). Prints, per graph, its wire size and the
median of --repeat round trips of each kind (ms), with the job's state each answer names.
A client on a hit takes the lookup's answer alone (`kiln.resolve.Resolver.poll`).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from bench.hit_cpu import MODELS, SUITE_MODELS

    parser = argparse.ArgumentParser(prog="python -m bench.lookup_vs_submit",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="gpt2")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="s to wait for the heuristic schedules")
    args = parser.parse_args(argv)
    from bench.models import missing_package

    needed = missing_package(args.model) if args.model in SUITE_MODELS else None
    if needed:
        parser.error(f"--model {args.model} needs the {needed} package")

    import compiler
    from bench.flow import Service
    from bench.hit_cpu import capture
    from kiln.client import ServiceClient

    work = Path(tempfile.mkdtemp(prefix="kiln-lookup-"))
    names = capture(args.model, args.batch, work)
    target = compiler.Target.named("sm_90", name="NVIDIA H200")
    texts = {n: (work / f"{n}.json").read_text() for n in names}
    keys = {n: compiler.tuning_key(compiler.from_wire(texts[n]), target) for n in names}
    service = Service(work / "service", [], None, 1.0, 1)
    try:
        client = ServiceClient(service.url, None, 2.0, 60.0, retries=0)
        for n in names:
            client.submit(texts[n], target.to_json(), keys[n])
        deadline = time.monotonic() + args.timeout
        while any(client.schedule(keys[n]).job_status != "done" for n in names):
            if time.monotonic() > deadline:
                print(f"no heuristic schedules after {args.timeout:g} s; see {service.logs}",
                      file=sys.stderr)
                return 1
            time.sleep(1.0)
        print(f"{args.model}, batch {args.batch}, sm_90: median of {args.repeat} round trips (ms)")
        print(f"{'graph':<10}{'wire KB':>9}{'submit':>9}{'lookup':>9}  job")
        for n in names:
            submit, lookup = [], []
            for _ in range(args.repeat):
                start = time.perf_counter()
                client.submit(texts[n], target.to_json(), keys[n])
                submit.append(time.perf_counter() - start)
                start = time.perf_counter()
                answer = client.schedule(keys[n])
                lookup.append(time.perf_counter() - start)
            print(f"{n:<10}{len(texts[n]) / 1024:>9.0f}{statistics.median(submit) * 1e3:>9.1f}"
                  f"{statistics.median(lookup) * 1e3:>9.1f}  {answer.job_status}")
    finally:
        service.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
