"""CUDA graph replay for built graphs, training graphs included.

A `Built` on CUDA hands each call to a `GraphRunner` first. The runner captures the graph's
launches into one CUDA graph (its own memory pool) once two consecutive calls agree on
where the inputs live:

- Inputs at the same address as on the previous call (parameters; a backward's saved
  activations when the forward replays from its own graph, whose outputs stay at fixed
  addresses) are read in place. The others are copied into static buffers before each
  replay. Capture waits (a few calls) while inputs settle: one that moved on this call but
  not on the one before (a backward's saved activations on the call after its forward was
  captured) would otherwise be copied on every replay (resnet18's training backward: 78
  inputs, 328 MiB per step on an H200). It waits too while the copies would be large, and
  is given up when they stay large.
- Outputs stay in the graph's memory: each replay returns fresh tensors over it (strides,
  offsets and aliasing as captured), without copying, so saved activations cost nothing.
  The next replay would overwrite them, so the runner replays only when no tensor still
  holds the memory that the previous replay handed out (the storages' use counts are
  back to the runner's own). When one does (a loss kept across steps, a gradient that
  `.grad` stole and a caller keeps), this call runs without the graph, and from then on
  that output is copied out of the graph's memory (strides and aliasing kept) before it
  is returned. Outputs that alias an input read in place are returned as views of it;
  those that alias a copied input are always copied.
- A graph with a CPU tensor input (read on the host while capturing) never captures.
- An input read in place that moved, or a held output, makes the call run without the
  graph and a later call capture again (with that output copied out from then on: a
  `.grad` that keeps the first gradient it stole); after MAX_RECAPTURES of those replay is
  given up for good, as it is on any capture failure.

Forward and backward have one pool each (not one shared pool as Inductor's cudagraph trees
have). In a shared pool a graph captured later may place its outputs in the memory of an
earlier graph's temporaries (the backward's gradients where the forward keeps its
intermediates), so before a replay a graph would also have to check the outputs of every
graph captured after it in the pool, and keep checking the held outputs of a graph that
was captured again (its old outputs are no longer its runner's). That is not built; the
cost of separate pools is memory (each pool keeps its own temporaries), not time.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

log = logging.getLogger(__name__)

# Copies into a graph cost memory traffic that plain launches do not: allow about what
# launch overhead costs, 4 MiB of copies per step the graph replaces.
COPY_BYTES_PER_STEP = 4 << 20
# Calls that may pass without capturing while inputs still move (a backward waits for its
# forward's graph), and captures made again after a refused replay (moved inputs, held
# outputs) before replay is given up.
MAX_WAIT = 8
MAX_RECAPTURES = 4


def enabled() -> bool:
    """CUDA graphs are on unless KILN_CUDA_GRAPHS=0."""
    return os.environ.get("KILN_CUDA_GRAPHS", "1") != "0"


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _ptrs(inputs: Sequence[Any]) -> list[int]:
    """Where each input lives (0 for a non-tensor)."""
    return [t.data_ptr() if isinstance(t, torch.Tensor) else 0 for t in inputs]


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


class _Out:
    """Where one tensor output lives: over base `base` (a tensor over its storage), or,
    `base` -1, over input `input` (read in place: a view of the call's own input); its
    size, strides and storage offset, and whether they are its base's own (`whole`: a
    replay hands out `detach()`, a few times cheaper than `as_strided`)."""

    __slots__ = ("base", "input", "offset", "size", "stride", "whole")

    def __init__(self, base: int, t: torch.Tensor, input: int = -1,
                 of: torch.Tensor | None = None) -> None:
        self.base, self.input, self.size, self.stride = base, input, tuple(t.shape), t.stride()
        self.offset = t.storage_offset()
        self.whole = of is not None and (
            self.size == tuple(of.shape) and self.stride == of.stride()
            and self.offset == of.storage_offset() and t.dtype == of.dtype)


class GraphRunner:
    """Captures `run(inputs)` once inputs' addresses settle, then replays it."""

    def __init__(self, run: Callable[[Sequence[Any]], Any], steps: int,
                 check: Callable[[Sequence[Any]], None] | None = None) -> None:
        """`run(inputs)` runs the graph; `check(inputs)` raises for inputs the graph does not
        take (a replay runs no Python of the graph, so it checks first)."""
        self.run = run
        self.check = check
        self.max_copy_bytes = steps * COPY_BYTES_PER_STEP
        self.last_ptrs: list[int] | None = None
        self.moved: set[int] | None = None  # inputs that moved between the last two calls
        self.graph: torch.cuda.CUDAGraph | None = None
        self.failed = False
        self.waited = 0
        self.recaptures = 0
        self.replays = 0
        self.static: list[Any] = []
        self.staged: list[int] = []
        self.direct: list[tuple[int, int]] = []
        # Outputs: the captured structure (one tensor, or a tuple) with tensors as _Out.
        self.single = False
        self.layout: list[Any] = []
        self.bases: list[torch.Tensor] = []  # one tensor per (storage, dtype) of the outputs
        self.copied: set[int] = set()  # bases whose outputs are copied out
        self.copy_outputs: set[int] = set()  # outputs a caller kept: copied from then on
        self.handed: list[int] = []  # bases a replay returns without copying
        # (base, its storage's address, that storage's use count held by the runner alone)
        self.handed_counts: list[tuple[int, int, int]] = []
        self.copy_at: list[int] = []  # outputs a replay copies out (their bases are copied)

    def __call__(self, inputs: Sequence[Any]) -> Any:
        """Replay (or capture); None means: run this call without a graph."""
        if self.failed:
            return None
        if self.graph is None:
            return self._maybe_capture(inputs, _ptrs(inputs))
        if self.check is not None:
            self.check(inputs)
        for i, ptr in self.direct:
            if inputs[i].data_ptr() != ptr:  # e.g. the forward ran without its graph
                return self._recapture(_ptrs(inputs), f"input {i} moved")
        # Per replay, for every output storage handed out: the storage's use count now
        # against the runner's own (storages kept by address: the bases keep them alive).
        held = [k for k, storage, count in self.handed_counts
                if torch._C._storage_Use_Count(storage) > count]
        if held:
            self.copy_outputs.update(j for j, out in enumerate(self.layout)
                                     if type(out) is _Out and out.base in held)
            return self._recapture(_ptrs(inputs),
                                   f"{len(held)} output(s) of the last replay still held")
        for i in self.staged:
            self.static[i].copy_(inputs[i])
        self.graph.replay()
        self.replays += 1
        return self._outputs(inputs)

    def _recapture(self, ptrs: list[int], why: str) -> None:
        """This call runs without the graph; a later one captures again (the memory a
        caller holds stays theirs: the old graph's pool lives as long as they hold it)."""
        self.recaptures += 1
        if self.recaptures > MAX_RECAPTURES:
            log.info("kiln: CUDA graph replay refused %d times (%s); running without",
                     self.recaptures, why)
            self._give_up()
            return None
        log.debug("kiln: CUDA graph captured again (%s)", why)
        self.graph, self.static, self.bases, self.layout = None, [], [], []
        self.last_ptrs, self.waited, self.moved = ptrs, 0, None
        return None

    def _give_up(self) -> None:
        self.failed, self.graph = True, None
        self.static, self.bases, self.layout = [], [], []

    def _maybe_capture(self, inputs: Sequence[Any], ptrs: list[int]) -> Any:
        last, self.last_ptrs = self.last_ptrs, ptrs
        tensors = [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor)]
        kinds = {inputs[i].device.type for i in tensors}
        if "cpu" in kinds and len(kinds) > 1:
            # A CPU tensor (a scalar beside CUDA ones) is read on the host while capturing:
            # a replay would use the captured value. Such graphs run without CUDA graphs.
            log.info("kiln: a CPU tensor input; running without CUDA graphs")
            self._give_up()
            return None
        if last is None or len(last) != len(ptrs):
            return None
        staged = [i for i in tensors if ptrs[i] != last[i]]
        moved_before, self.moved = self.moved, set(staged)
        settling = moved_before is None or not set(staged) <= moved_before
        if staged and settling and self.waited < MAX_WAIT:
            # Inputs that moved now and not before are settling (a backward's saved
            # activations once its forward replays from its graph): wait for them rather
            # than copy them in on every replay. Those that move on every call are staged.
            self.waited += 1
            return None
        if (sum(_nbytes(inputs[i]) for i in staged) > self.max_copy_bytes
                or any(inputs[i].requires_grad for i in staged)):
            self.waited += 1
            if self.waited > 2 * MAX_WAIT:
                self._give_up()
            return None
        return self._capture(inputs, staged)

    def _capture(self, inputs: Sequence[Any], staged: list[int]) -> Any:
        self.staged = staged
        self.direct = [(i, inputs[i].data_ptr()) for i, t in enumerate(inputs)
                       if isinstance(t, torch.Tensor) and i not in staged]
        self.static = list(inputs)
        for i in staged:
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
            # thread_local: a build on another thread (a tuned schedule swapped in) may load
            # modules or allocate while this thread captures
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                outputs = self.run(self.static)
        except Exception as exc:  # noqa: BLE001 - an op that cannot be captured: no graphs
            log.info("kiln: CUDA graph capture failed (%s); running without", exc)
            self._give_up()
            return None
        self._keep_outputs(outputs)
        if not hasattr(torch._C, "_storage_Use_Count"):  # no way to tell: copy them all out
            self.copied = set(range(len(self.bases)))
        self.handed = [k for k in range(len(self.bases)) if k not in self.copied]
        self.copy_at = [j for j, out in enumerate(self.layout)
                        if type(out) is _Out and out.base in self.copied]
        del outputs  # the bases alone hold the graph's output memory now
        # Keep the static copies only: holding an input read in place (a forward's output)
        # would look like a caller holding it to the graph that made it.
        self.static = [t if i in staged else None for i, t in enumerate(self.static)]
        # Each handed base's storage by address and its use count with only the runner
        # holding it (taken with no storage wrapper alive, as a replay looks at it).
        storages = [self.bases[k].untyped_storage()._cdata for k in self.handed]
        self.handed_counts = [(k, cdata, torch._C._storage_Use_Count(cdata))
                              for k, cdata in zip(self.handed, storages, strict=True)]
        self.graph = graph
        graph.replay()
        self.replays += 1
        return self._outputs(inputs)

    def _keep_outputs(self, outputs: Any) -> None:
        self.single = isinstance(outputs, torch.Tensor)
        flat = [outputs] if self.single else list(outputs)
        direct_storages = {self.static[i].untyped_storage().data_ptr(): i for i, _ in self.direct}
        staged_storages = {self.static[i].untyped_storage().data_ptr() for i in self.staged}
        index: dict[tuple[int, torch.dtype], int] = {}
        self.layout, self.bases, self.copied = [], [], set()
        for value in flat:
            if not isinstance(value, torch.Tensor):
                self.layout.append(value)
                continue
            storage = value.untyped_storage().data_ptr()
            if storage in direct_storages and value.dtype == self.static[direct_storages[storage]].dtype:
                self.layout.append(_Out(-1, value, direct_storages[storage]))
                continue
            key = (storage, value.dtype)
            if key not in index:
                index[key] = len(self.bases)
                self.bases.append(value)
            if storage in staged_storages or len(self.layout) in self.copy_outputs:
                self.copied.add(index[key])  # (a staged input: the next copy overwrites it)
            self.layout.append(_Out(index[key], value, of=self.bases[index[key]]))

    def _outputs(self, inputs: Sequence[Any]) -> Any:
        views: list[Any] = []
        for out in self.layout:
            if type(out) is not _Out:
                views.append(out)
            elif out.base < 0:
                views.append(inputs[out.input].as_strided(out.size, out.stride, out.offset))
            elif out.whole:
                views.append(self.bases[out.base].detach())
            else:
                views.append(self.bases[out.base].as_strided(out.size, out.stride, out.offset))
        copy = self.copy_at
        if copy:
            for j, value in zip(copy, _copy_out([views[j] for j in copy]), strict=True):
                views[j] = value
        return views[0] if self.single else tuple(views)
