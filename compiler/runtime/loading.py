"""Pay, ahead of a process's first precompile, what loading its first kernel costs once.

The client runs `prepare_loading` on a thread of its own while the first graph is traced.
"""

from __future__ import annotations

from compiler import aot
from compiler.runtime import static_launch, triton_key


def prepare_loading() -> None:
    """Triton's cache key of itself (`triton_key.ensure`), its backend's part of every
    kernel's key (`aot.backend_hash`) and its CUDA driver (which builds a utility module
    with the C compiler when Triton's cache lacks it, unless it is
    `static_launch.lazy_driver`'s, which defers that to a use that kernels launched through
    torch's static launcher never make). Raises what Triton raises without a CUDA device."""
    from triton.runtime.driver import driver

    triton_key.ensure()
    static_launch.lazy_driver()  # before the line below makes Triton's driver
    aot.backend_hash(driver.active.get_current_target())
