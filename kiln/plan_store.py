"""Where a session's plans (`kiln.plans`) are kept and found: the local plan cache, then
the service.

`key_for` says whether a dynamo graph gets a plan at all; `load` finds the plan kept for
a key (the local cache, else the service, whose plan is then kept locally); `publish`
keeps a plan AOTAutograd's compile gave, locally and, on a thread of its own, in the
service; `wait` blocks until those uploads are done.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from kiln import degrade, plans
from kiln.cache import PlanCache
from kiln.client import ServiceError
from kiln.compiled import device_of, has_symbolic_sizes, runs_eagerly_here

if TYPE_CHECKING:
    from compiler.wire.plan import Plan
    from kiln.resolve import Resolver

log = logging.getLogger("kiln")


class PlanStore:
    """One session's plans; the service is reached through its resolver (clients, breaker)."""

    def __init__(self, resolver: Resolver) -> None:
        config = resolver.config
        self.resolver = resolver
        self.cache = (PlanCache(config.plan_dir, config.cache_max_bytes)
                      if config.cache and config.plans else None)
        self._lock = threading.Lock()
        self._sending: list[threading.Thread] = []

    def key_for(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> str | None:
        """The dynamo graph's plan key, or None: plans are off, there is nowhere to keep one,
        the graph runs eagerly here (`runs_eagerly_here`: a plan's graphs would be built for
        a device that cannot run them; AOTAutograd's compilers warn and leave them eager), or
        the graph cannot be keyed (then it goes through AOTAutograd, unrecorded)."""
        config = self.resolver.config
        if not config.plans or (config.url is None and not config.cache):
            return None
        if runs_eagerly_here(device_of(example_inputs)):
            return None
        if has_symbolic_sizes(gm, list(example_inputs)):
            return None
        try:
            return plans.plan_key(gm, example_inputs)
        except plans.NotPlannable as exc:
            log.debug("kiln: no plan key: %s", exc)
            return None

    def load(self, key: str) -> Plan | None:
        """The plan for `key`, parsed and checked: from the local cache, else from the service
        (then kept locally); None when neither has one that parses."""
        from compiler.wire.plan import PlanError, max_plan_bytes, parse_plan

        resolver = self.resolver
        raw = self.cache.get(key, max_plan_bytes()) if self.cache is not None else None
        if raw is not None:
            try:
                return parse_plan(raw)
            except PlanError as exc:
                log.warning("kiln cache: ignoring plan %s: %s", key[:12], exc)
                self.cache.discard(key)
        client = resolver.client if resolver.config.mode == "wait" else resolver.quick_client
        if client is None or resolver.service_down():
            return None
        try:
            text = client.plan(key)
        except ServiceError as exc:
            resolver.failed(exc)
            return None
        if text is None:
            return None
        try:  # decoded with the wire format's bounds (size, containers, nesting)
            plan = parse_plan(text)
        except (PlanError, RecursionError, MemoryError) as exc:
            degrade.warn_once("malformed", f"plan {key[:12]}: {str(exc)[:200]}",
                              url=resolver.config.url or "?")
            return None
        if plan.key != key:
            degrade.warn_once("malformed", f"plan {key[:12]} names another key",
                              url=resolver.config.url or "?")
            return None
        self._keep(key, text)  # as received, parsed and checked: nothing re-encoded
        return plan

    def publish(self, plan: Plan) -> None:
        """Keep a plan that AOTAutograd's compile gave: in the local cache and, on a thread
        of its own, in the service."""
        from compiler.wire.plan import plan_text

        text = plan_text(plan)
        self._keep(plan.key, text)
        resolver = self.resolver
        if resolver.client is None or resolver.service_down():
            return
        thread = threading.Thread(target=self._send, args=(plan.key, text),
                                  name="kiln-plan", daemon=True)
        with self._lock:
            self._sending[:] = [t for t in self._sending if t.is_alive()] + [thread]
        thread.start()

    def wait(self, deadline: float | None) -> bool:
        """Block until the plans being sent are sent (or failed); False if the monotonic
        `deadline` passed first."""
        with self._lock:
            pending = list(self._sending)
        for thread in pending:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(t.is_alive() for t in pending)

    def _keep(self, key: str, text: str) -> None:
        if self.cache is None:
            return
        try:
            self.cache.write(key, text)
        except OSError as exc:
            degrade.warn_once("cache", f"{self.cache.root}: {exc}")

    def _send(self, key: str, text: str) -> None:
        client = self.resolver.client
        assert client is not None
        try:
            client.put_plan(key, text)
            degrade.count("plans_sent")
        except ServiceError as exc:
            log.debug("kiln: plan %s not stored by the service: %s", key[:12], exc)
