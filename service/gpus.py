"""Which GPUs the embedded `kiln serve` tunes on: `--gpus all|none|0,1`."""

from __future__ import annotations


class GpuChoiceError(ValueError):
    """A `--gpus` value that names no GPU of this machine, or is not understood."""


def visible_gpus() -> int:
    """CUDA devices this process can see (0 with a CPU build of torch or no driver)."""
    import torch

    try:
        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except RuntimeError:  # a driver that fails to initialise: no GPU to tune on
        return 0


def choose_gpus(spec: str, visible: int) -> list[str]:
    """The devices (`cuda:N`) that `spec` names: `all` (every visible GPU, none is fine),
    `none`, or a comma-separated list of indices, each of which must be visible."""
    text = spec.strip().lower()
    if text == "all":
        return [f"cuda:{i}" for i in range(visible)]
    if text in ("none", ""):
        return []
    indices: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit():
            raise GpuChoiceError(f"--gpus takes all, none or GPU indices like 0,1; not {spec!r}")
        index = int(part)
        if index >= visible:
            seen = f"GPUs 0-{visible - 1}" if visible else "no GPU"
            raise GpuChoiceError(f"--gpus {spec}: GPU {index} is not visible (this machine has {seen})")
        if index not in indices:
            indices.append(index)
    return [f"cuda:{i}" for i in indices]
