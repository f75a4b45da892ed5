"""The lines a long wait on the service leaves in the log (logger `kiln.progress`).

A first step in wait mode blocks on the service for up to `Config.wait_timeout` seconds
per graph (120 by default) while a GPU tunes; without a word it looks like a hang. A wait
that lasts past `NOTICE_S` gets one line saying which graph, for how long at most and
what happens then, and one when it ends saying what it gave. A graph answered sooner says
nothing. `kiln.logs` shows these lines at INFO even at the default level.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("kiln.progress")

NOTICE_S = 2.0  # a wait on the service longer than this is reported


def graph_name(entry: Any) -> str:
    """`forward graph 'SeedMLP forward' (3fa2c1d9e0b4)`: kind, dashboard tag, short key."""
    tag = f" {entry.tag!r}" if entry.tag else ""
    return f"{entry.kind} graph{tag} ({(entry.key or '?')[:12]})"


def tuned_by_service(entry: Any) -> bool:
    """Whether the service may tune `entry`'s schedule: a CPU graph's it builds and checks
    on the Triton interpreter, never tunes (its times say nothing about speed)."""
    return entry.target is None or entry.target.device_type != "cpu"


def waiting(entry: Any, waited: float, wait_timeout: float) -> None:
    """The wait for `entry`'s schedule (tuned, unless `tuned_by_service` says none comes)
    has lasted `waited` seconds and goes on."""
    left = max(0.0, wait_timeout - waited)
    if not tuned_by_service(entry):
        log.info("kiln: waiting for the service to build the %s, up to %.0f s more (graphs "
                 "for the CPU are built there, never tuned); after that it is built here from "
                 "the heuristic schedule", graph_name(entry), left)
        return
    log.info("kiln: waiting for the service's tuned schedule of the %s, up to %.0f s more; "
             "after that it starts with the best schedule at hand and the tuned one is "
             "swapped in when it lands", graph_name(entry), left)


def waited(entry: Any, answer: Any, seconds: float) -> None:
    """The wait announced by `waiting` ended after `seconds` with `answer` (the service's
    last answer, None without one)."""
    name = graph_name(entry)
    status = getattr(answer, "status", None)
    has_schedule = getattr(answer, "schedule", None) is not None
    if status == "tuned":
        log.info("kiln: got the tuned schedule of the %s after %.1f s", name, seconds)
    elif status == "failed":
        log.info("kiln: the service failed to build the %s (after %.1f s); building it here",
                 name, seconds)
    elif answer is None:
        log.info("kiln: gave up waiting for the %s after %.1f s: the service did not answer; "
                 "building it here from the heuristic schedule", name, seconds)
    elif entry.final and has_schedule:
        log.info("kiln: got the heuristic schedule of the %s after %.1f s (the service has "
                 "no tuned one coming)", name, seconds)
    elif not tuned_by_service(entry):
        log.info("kiln: gave up waiting for the service to build the %s after %.1f s; "
                 "starting with a heuristic schedule built here", name, seconds)
    else:
        start = "the service's heuristic schedule" if has_schedule else \
            "a heuristic schedule built here"
        log.info("kiln: gave up waiting for the tuned schedule of the %s after %.1f s; "
                 "starting with %s, the tuned one is swapped in when it lands", name,
                 seconds, start)
