"""A worker process whose job is a stand-in that takes `--delay` seconds (or kills the
process with `--die`), for fault tests about the queue and database (the real build is
exercised by test_e2e). With `--device cuda:N` it is a fake GPU worker: it serves the tune
stream of `--queue-class`, and its stand-in tuner runs on the CPU and reports `--device` as
the device its child tuned on.

Run: python -m tests.service.worker_proc --delay 0.5 (settings from KILN_* variables).
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from typing import Any

from service.context import ServiceContext
from service.pipeline import Outcome
from service.settings import Settings
from service.worker import Worker, install_signal_handlers


def stand_in_outcome(wire: str, target: dict[str, Any], device: str | None = None) -> Outcome:
    """What a stand-in build or tuning publishes: an empty schedule; a tuning outcome has
    one measurement and the device it reports."""
    schedule = {"format": "kiln.schedule/1", "target": target, "kernels": [], "externs": [],
                "wire_bytes": len(wire)}
    if device is None:
        return Outcome(schedule=schedule, kernels=[])
    return Outcome(schedule=schedule, kernels=[], device=device,
                   measurements=[{"kernel": "k0", "variant": "pointwise",
                                  "config": {"XBLOCK": 64}, "ms": 1.0, "verified": True}],
                   timings={"eager_ms": 2.0, "heuristic_ms": 1.5, "tuned_ms": 1.0,
                            "tuning_s": 0.1})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--die", action="store_true", help="exit abruptly inside every job")
    parser.add_argument("--device", default="cpu", help="cuda:N: a fake GPU worker")
    parser.add_argument("--queue-class", default="cuda-sm_90", help="a fake GPU worker's")
    args = parser.parse_args()
    logging.basicConfig(level="INFO")

    def stand_in(wire: str, target: dict[str, Any], device: str | None) -> Outcome:
        time.sleep(args.delay)
        if args.die:  # what a segfault in a compiler looks like from outside
            os._exit(70)
        return stand_in_outcome(wire, target, device)

    def build(wire: str, target: dict[str, Any], _numel: int) -> Outcome:
        return stand_in(wire, target, None)

    def tune(wire: str, target: dict[str, Any], _trials: int, _seconds: float, device: str,
             progress: Any = None) -> Outcome:
        return stand_in(wire, target, device)

    ctx = ServiceContext(Settings.from_env())
    if args.device == "cpu":
        worker = Worker(ctx, build=build, block_s=0.2)
    else:
        worker = Worker(ctx, device=args.device, queue_class=args.queue_class, tune=tune,
                        block_s=0.2)
    install_signal_handlers(worker)  # the same handling as `kiln worker`
    worker.run()


if __name__ == "__main__":
    main()
