"""The runner: a long-lived spawned child per device that builds, verifies and times candidates.

As in Inductor's autotune_process, the child is spawned (`compiler.child.spawn`; never
forked: CUDA may already be initialised here), requests carry JSON (graph, schedule,
candidate), never tensors or pickles, and each candidate has its own timeout. A child that crashes, hangs past the
timeout or hits a CUDA fault is killed and respawned (the graph reloaded); the candidate
gets a measurement with the reason, and the tuner carries on.

On a CPU device the child runs kernels in the Triton interpreter, so the whole path is
testable without a GPU.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import time
from collections.abc import Callable
from typing import Any

from compiler import child
from tuner import records
from tuner.builder import Builder
from tuner.records import Candidate, Measurement

log = logging.getLogger(__name__)

# Loading computes the reference (and, the first time, imports torch in the child).
LOAD_TIMEOUT_S = 600.0
DEFAULT_TIMEOUT_S = 120.0

FaultHook = Callable[[dict[str, Any]], None]


def _child_main(channel: child.Channel, device: str, fault_hook_name: str | None) -> None:
    """Serve requests until told to stop (or the channel ends); any uncaught problem ends
    the process (the parent respawns it)."""
    from tuner.session import CudaFault, TrialSession, describe_exception

    fault_hook = None
    if fault_hook_name is not None:
        module, _, name = fault_hook_name.partition(":")
        fault_hook = getattr(importlib.import_module(module), name)
    session = TrialSession(device)
    if device.startswith("cuda:"):
        import torch

        torch.cuda.set_device(torch.device(device))
    while True:
        request = channel.recv()
        verb = request.get("verb")
        try:
            if verb == "stop":
                return
            if verb == "load":
                reply = session.load(request["graph"], request["schedule"], request["seed"])
                reply["device"] = _device_in_use(device)
            elif verb == "measure":
                if fault_hook is not None:
                    fault_hook(request["candidate"])
                reply = session.measure(request["candidate"], request["fidelity"], request["scope"])
            elif verb == "time_graph":
                reply = session.time_graph(request["schedule"], request["fidelity"])
            else:
                reply = {"error": f"{records.RUN_ERROR}: unknown request {verb!r}"}
        except CudaFault as exc:
            # The CUDA context may be poisoned: answer, then exit so the parent respawns us.
            channel.send({"error": str(exc), "restart": True})
            return
        except Exception as exc:
            reply = {"error": f"{records.RUN_ERROR}: {describe_exception(exc)[:500]}"}
        channel.send(reply)


def _device_in_use(device: str) -> str:
    """The device this child times on, as it sees it: `cuda:N` from CUDA's current device
    (what `set_device` chose), so the record says which GPU of the host did the tuning."""
    if not device.startswith("cuda"):
        return device
    import torch

    return f"cuda:{torch.cuda.current_device()}"


class ChildDied(RuntimeError):
    """The child ended or hung during a request; `reason` is `crash` or `timeout`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


class Runner:
    """Times candidates of one graph on one device in a spawned child process.

    `fault_hook` is for tests only: a module-level function the child imports and calls
    with each candidate before measuring it (to inject a crash). It is fixed when the child
    starts, so nothing a request carries can reach it.
    """

    def __init__(
        self,
        device: str = "cpu",
        timeout_s: float = DEFAULT_TIMEOUT_S,
        fault_hook: FaultHook | None = None,
        compile_workers: int | None = None,
    ) -> None:
        self.device = device
        self.builder = Builder(device, compile_workers)
        self.timeout_s = timeout_s
        self._fault_hook = None if fault_hook is None else \
            f"{fault_hook.__module__}:{fault_hook.__qualname__}"
        self._proc: child.Child | None = None
        self._loaded: dict[str, Any] | None = None
        self._load_reply: dict[str, Any] = {}
        self.restarts = 0

    # -- process management -----------------------------------------------------------------
    def _start(self) -> None:
        # The child inherits this environment, and `kiln serve` turns the interpreter on
        # for its CPU checks: a GPU child must never time interpreted kernels.
        interpret = "1" if self.device == "cpu" else "0"
        self._proc = child.spawn("tuner.runner:_child_main", [self.device, self._fault_hook],
                                 name="tuner runner", env={"TRITON_INTERPRET": interpret})
        if self._loaded is not None:
            reply = self._call(self._loaded, LOAD_TIMEOUT_S)
            if reply.get("error"):
                raise RuntimeError(f"reloading the graph in a new child failed: {reply['error']}")
            self._load_reply = reply

    def _kill(self) -> None:
        if self._proc is not None:
            self._proc.close()
        self._proc = None

    def close(self) -> None:
        """Stop the child (politely, then firmly) and the compile workers."""
        self.builder.close()
        if self._proc is not None:
            with contextlib.suppress(child.ChildError):
                self._proc.send({"verb": "stop"})
            self._proc.close(grace_s=5)
        self._proc = None

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def _call(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send one request and wait; a dead or hung child raises ChildDied (and is cleaned up)."""
        if self._proc is None:
            self._start()
        assert self._proc is not None
        try:
            self._proc.send(request)
            reply = self._proc.recv(timeout)
        except child.ChildTimeout as exc:
            self._kill()
            raise ChildDied(records.TIMEOUT, f"no answer within {timeout:g} s; child killed") from exc
        except child.ChildDied as exc:
            self._kill()
            raise ChildDied(records.CRASH, f"child process died (exit code {exc.exitcode})") from exc
        if reply.get("restart"):
            self._kill()
            self.restarts += 1
        return reply

    # -- requests ---------------------------------------------------------------------------
    def load(
        self, graph_json: dict[str, Any], schedule_json: dict[str, Any], seed: int = 0
    ) -> dict[str, Any]:
        """Send the graph and its base schedule; the child computes the reference outputs.
        Returns the child's reply (`TrialSession.load`: heuristic check, twin keys)."""
        self._loaded = {
            "verb": "load",
            "graph": graph_json,
            "schedule": schedule_json,
            "seed": seed,
        }
        self.builder.load(graph_json, schedule_json, seed)
        if self._proc is not None:
            reply = self._call(self._loaded, LOAD_TIMEOUT_S)
        else:
            self._start()
            reply = self._load_reply
        if reply.get("error"):
            raise RuntimeError(f"loading the graph failed: {reply['error']}")
        return reply

    def prepare(self, candidates: list[Candidate]) -> None:
        """Compile a batch in parallel ahead of measuring it (no-op without compile workers)."""
        self.builder.prepare(candidates)

    def measure(self, candidates: list[Candidate], fidelity: float = 1.0) -> list[Measurement]:
        """Measure each candidate (one request each, each with the timeout); never raises."""
        out = []
        for cand in candidates:
            verdict = self.builder.verdicts.get(cand)
            if verdict is not None:  # the compile workers already know it cannot build
                out.append(Measurement(cand, error=verdict))
                continue
            request = {
                "verb": "measure",
                "candidate": cand.to_json(),
                "fidelity": fidelity,
                "scope": "kernel",  # the child falls back to the whole graph by itself
            }
            started = time.monotonic()
            try:
                reply = self._call(request, self.timeout_s)
            except ChildDied as died:
                self.restarts += 1
                log.warning("candidate %s: %s", cand.label(), died)
                out.append(Measurement(cand, error=str(died)))
                continue
            m = Measurement(
                cand,
                ms=reply.get("ms"),
                error=reply.get("error"),
                verified=bool(reply.get("verified")),
                noise=float(reply.get("noise") or 0.0),
            )
            m.extra["seconds"] = time.monotonic() - started
            for key in ("scope", "source_hash", "verification"):
                if reply.get(key) is not None:
                    m.extra[key] = reply[key]
            out.append(m)
        return out

    def time_graph(self, schedule_json: dict[str, Any] | None, fidelity: float = 1.0) -> dict:
        """Whole-graph time of a schedule (None: eager); `{"ms", "error"}`, never raises."""
        try:
            return self._call(
                {"verb": "time_graph", "schedule": schedule_json, "fidelity": fidelity},
                max(self.timeout_s, 300.0),
            )
        except ChildDied as died:
            self.restarts += 1
            return {"ms": None, "error": str(died)}
