"""What Triton's JIT would compile for a launch, captured without compiling.

`specialization` runs the JIT's own `warmup` with `knobs.runtime.jit_cache_hook` set, which
receives the JIT's `specialization_data` (signature, constants, alignment attributes,
options, target) and answers "handled", so nothing compiles. `standin_specialization` does
the same for a CUDA GPU this process does not have, against a stand-in driver
(`StandInDriver`): the service's target compile and the tuner's CPU compile workers get
the specialisation a client's JIT computes, so their binaries are the ones clients look up.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from compiler.aot.triton_compile import cache_key, gpu_target

log = logging.getLogger(__name__)

_hook_lock = threading.RLock()  # a stand-in driver's capture holds it around its own
_capturing = threading.local()


def specialization(fn: Any, args: tuple, grid: tuple[int, ...], kwargs: dict[str, Any]) -> str | None:
    """What Triton's JIT would compile for `fn.warmup(*args, grid=grid, **kwargs)` on the
    current device, as its specialization data (JSON), without compiling; None when the
    kernel is already loaded or this Triton does not report it. The data always names the
    target (Triton 3.6 leaves it out) and carries `cache_key`: Triton's cache key for the
    binary (`triton_compile.cache_key`), what the service's binaries are looked up by. The
    key includes Triton's key of itself: a process that should not hash Triton on this
    thread has it known first (`compiler.runtime.triton_key.ensure`)."""
    try:
        from triton import knobs
        from triton.runtime.driver import driver
    except ImportError:
        return None
    captured: list[str] = []
    with _hook_lock:
        previous = knobs.runtime.jit_cache_hook

        def hook(**kw: Any) -> Any:
            if getattr(_capturing, "on", False):  # other threads' compiles pass through
                captured.append(kw.get("compile", {}).get("specialization_data"))
                return True  # "handled": the JIT returns without compiling
            return previous(**kw) if previous is not None else None

        knobs.runtime.jit_cache_hook = hook
        _capturing.on = True
        try:
            fn.warmup(*args, grid=grid, **kwargs)
        finally:
            _capturing.on = False
            knobs.runtime.jit_cache_hook = previous
    if not captured or not isinstance(captured[0], str):
        return None
    data = json.loads(captured[0])
    if "target" not in data:
        data["target"] = dict(vars(driver.active.get_current_target()))
    spec = json.dumps(data)
    try:
        data["cache_key"] = cache_key(fn, spec)
    except Exception as exc:  # noqa: BLE001 - no key only means no binary from the service
        log.debug("no Triton cache key for %s: %s", getattr(fn, "__name__", fn), exc)
        data["cache_key"] = None
    return json.dumps(data)


class StandInDriver:
    """What the JIT asks a CUDA driver before it compiles (device, stream, target), for a
    GPU that is not here: with it, `fn.warmup` specialises a launch exactly as on that GPU."""

    def __init__(self, arch: int) -> None:
        self.arch = arch

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> Any:
        return gpu_target(self.arch)


def standin_specialization(fn: Any, arg_dtypes: tuple, constexprs: dict[str, Any],
                           options: dict[str, Any], arch: int) -> str | None:
    """`specialization` of a launch on 16-byte aligned buffers (what `Built.precompile`
    asks the client's JIT for) for a CUDA GPU of compute capability `arch` (90 for sm_90)
    that this process does not have: the JIT runs against a stand-in driver for the call.
    `fn` must be a JIT function of its own (`compiler.aot.target` makes one per kernel): the
    JIT keeps the stand-in's target in the function's per-device state. Only for processes
    that launch nothing on a GPU while it runs (compile workers, the service's compile
    process)."""
    from triton.runtime.driver import driver

    with _hook_lock:  # one driver for the process: no other capture in between
        saved = getattr(driver, "_active", None)
        driver.set_active(StandInDriver(arch))
        try:
            return specialization(fn, tuple(arg_dtypes), (1,), {**constexprs, **options})
        finally:
            driver._active = saved
