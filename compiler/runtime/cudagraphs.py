"""CUDA graph replay for built graphs whose calls cost more in launches than in copies.

The second call of a `Built` on CUDA captures its launches into one CUDA graph. Inputs
whose memory is the same as on the first call (parameters) are read in place; the others
are copied into static buffers before each replay. Outputs are copied out of the graph's
memory (strides and aliasing kept) so that a caller may keep them. Capture happens only
when those copies are small (the launch-bound case), and any failure falls back to plain
launches for good.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

log = logging.getLogger(__name__)

# Copies into and out of a graph cost memory traffic that plain launches do not: allow
# about what launch overhead costs, 4 MiB of copies per step the graph replaces.
COPY_BYTES_PER_STEP = 4 << 20


def enabled() -> bool:
    """CUDA graphs are on unless KILN_CUDA_GRAPHS=0."""
    return os.environ.get("KILN_CUDA_GRAPHS", "1") != "0"


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _copy_out(values: list[Any]) -> list[Any]:
    """Copies of a graph's outputs with their exact strides and aliasing: each storage the
    outputs live in is copied once and the views are made again on the copy.

    `Tensor.clone()` would not do: it makes a view with gaps (q, k and v as slices of one
    qkv buffer, saved for the backward) dense, and the backward graph was traced against
    the view's strides.
    """
    copies: dict[tuple[int, torch.dtype], torch.Tensor] = {}
    result = []
    for value in values:
        if not isinstance(value, torch.Tensor):
            result.append(value)
            continue
        storage = value.untyped_storage()
        size = value.element_size()
        if storage.nbytes() % size:  # not a storage of this dtype: exact strides anyway
            out = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype,
                                      device=value.device)
            result.append(out.copy_(value))
            continue
        key = (storage.data_ptr(), value.dtype)
        if key not in copies:
            whole = torch.empty(0, dtype=value.dtype, device=value.device)
            whole.set_(storage, 0, (storage.nbytes() // size,), (1,))
            copies[key] = whole.clone()
        result.append(copies[key].as_strided(value.shape, value.stride(), value.storage_offset()))
    return result


class GraphRunner:
    """Captures `run(inputs)` once inputs' addresses are known, then replays it."""

    def __init__(self, run: Callable[[Sequence[Any]], Any], steps: int) -> None:
        self.run = run
        self.max_copy_bytes = steps * COPY_BYTES_PER_STEP
        self.first_ptrs: list[int] | None = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.failed = False
        self.static: list[Any] = []
        self.staged: list[int] = []
        self.direct: list[tuple[int, int]] = []
        self.outputs: Any = None

    def __call__(self, inputs: Sequence[Any]) -> Any:
        """Replay (or capture, on the second call); None means: run without a graph."""
        if self.failed:
            return None
        ptrs = [t.data_ptr() if isinstance(t, torch.Tensor) else 0 for t in inputs]
        if self.graph is None:
            if self.first_ptrs is None:
                self.first_ptrs = ptrs
                return None
            return self._capture(inputs, ptrs)
        for i, ptr in self.direct:
            if ptrs[i] != ptr:  # a parameter moved: graphs no longer fit this caller
                self.failed, self.graph = True, None
                log.info("kiln: input %d moved between calls; CUDA graph replay disabled", i)
                return None
        for i in self.staged:
            self.static[i].copy_(inputs[i])
        self.graph.replay()
        return self._clone_outputs()

    def _clone_outputs(self) -> Any:
        if isinstance(self.outputs, torch.Tensor):  # a graph whose output is one tensor
            return _copy_out([self.outputs])[0]
        return tuple(_copy_out(list(self.outputs)))

    def _capture(self, inputs: Sequence[Any], ptrs: list[int]) -> Any:
        assert self.first_ptrs is not None
        tensors = [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor)]
        self.staged = [i for i in tensors if ptrs[i] != self.first_ptrs[i]]
        self.direct = [(i, ptrs[i]) for i in tensors if i not in self.staged]
        copy_bytes = sum(_nbytes(inputs[i]) for i in self.staged)
        if copy_bytes > self.max_copy_bytes or any(inputs[i].requires_grad for i in self.staged):
            self.failed = True
            return None
        self.static = list(inputs)
        for i in self.staged:
            t = inputs[i]
            self.static[i] = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
            self.static[i].copy_(t)
        try:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                self.run(self.static)  # warm-up: library workspaces, lazy inits
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outputs = self.run(self.static)
        except Exception as exc:  # noqa: BLE001 - an op that cannot be captured: no graphs
            log.info("kiln: CUDA graph capture failed (%s); running without", exc)
            self.failed = True
            return None
        flat = (outputs,) if isinstance(outputs, torch.Tensor) else outputs
        out_bytes = sum({o.untyped_storage().data_ptr(): o.untyped_storage().nbytes()
                         for o in flat if isinstance(o, torch.Tensor)}.values())
        if copy_bytes + out_bytes > self.max_copy_bytes:
            self.failed = True
            return None
        self.graph, self.outputs = graph, outputs
        graph.replay()
        return self._clone_outputs()
