"""`python -m tests.compiler.fresh_load_gpu`: in a fresh process on a CUDA device, build a
graph, precompile its kernels (compiled by the compile workers into $TRITON_CACHE_DIR) and
run it three times; prints one JSON line: whether the results match eager, the shared
libraries Triton's cache holds afterwards (none where torch's static launcher launches every
kernel: no per-kernel launcher, no driver utility module) and whether the launches went
through the static launcher (tests/compiler/test_gpu_host_path.py)."""

from __future__ import annotations

import json
import os

import torch

import compiler
from compiler.runtime import static_launch
from tests.compiler.oputil import trace


def _layers(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    h = torch.nn.functional.gelu(x @ w + b)
    return torch.softmax(h, -1), h.sum(0)


def main() -> None:
    torch.manual_seed(0)
    xs = [torch.randn(200, 96, device="cuda"), torch.randn(96, 160, device="cuda"),
          torch.randn(160, device="cuda")]
    built = compiler.build(trace(_layers, *xs), None, xs)
    built.precompile("cuda")
    want = _layers(*xs)
    ok = all(all(torch.allclose(g, w, atol=1e-4, rtol=1e-4) for g, w in zip(built(*xs), want,
                                                                             strict=True))
             for _ in range(3))
    device = torch.cuda.current_device()
    kernels = [k for info in built.launches() for k in info.fn.device_caches[device][0].values()]
    libraries = sorted(name for _, _, files in os.walk(os.environ["TRITON_CACHE_DIR"])
                       for name in files if name.endswith(".so"))
    print(json.dumps({"ok": ok, "libraries": libraries, "static": static_launch.available(),
                      "launchers": sorted({type(k._run).__name__ for k in kernels})}))


if __name__ == "__main__":
    main()
