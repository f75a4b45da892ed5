"""A CPU worker process whose build is a stand-in that takes `--delay` seconds (or kills the
process with `--die`), for fault tests about the queue and database (the real build is
exercised by test_e2e).

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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--die", action="store_true", help="exit abruptly inside every build")
    args = parser.parse_args()
    logging.basicConfig(level="INFO")

    def build(wire: str, target: dict[str, Any], _numel: int) -> Outcome:
        time.sleep(args.delay)
        if args.die:  # what a segfault in a compiler looks like from outside
            os._exit(70)
        return Outcome(schedule={"format": "kiln.schedule/1", "target": target, "kernels": [],
                                 "externs": [], "wire_bytes": len(wire)}, kernels=[])

    ctx = ServiceContext(Settings.from_env())
    worker = Worker(ctx, build=build, block_s=0.2)
    install_signal_handlers(worker)  # the same handling as `kiln worker`
    worker.run()


if __name__ == "__main__":
    main()
