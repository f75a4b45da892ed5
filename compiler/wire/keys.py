"""Graph hashes, compile targets and tuning keys (docs/wire-format.md, "Keys").

`graph_hash` is sha256 over the canonical JSON of a validated graph (names are already
positional, keys sorted), so the same computation traced anywhere hashes the same.
`tuning_key` adds what changes generated code: architecture, device name, torch
major.minor, triton version and kiln's compiler version. The device index never enters.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field, fields
from importlib import metadata
from typing import Any

import torch

from compiler.wire.graph import Graph, WireError, WireIdentity, from_wire
from compiler.wire.schema import brief

# Bump whenever generated code changes (or the graphs a client makes: plans are keyed by
# it too): every tuning key changes with it.
COMPILER_VERSION = "0.1.10"

_HEX64 = re.compile(r"[0-9a-f]{64}")
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+\-]{0,63}")
_NAME = re.compile(r"[ -~]{1,128}")  # printable ASCII
_TORCH_MINOR = re.compile(r"\d+\.\d+")
_SM = re.compile(r"sm_(\d+)(\d)[a-z]?")
DEVICE_TYPES = ("cuda", "cpu")


def compute_capability(arch: str) -> tuple[int, int] | None:
    """CUDA compute capability named by an `sm_XY` arch (`(9, 0)` for sm_90 and sm_90a); None
    for anything else. The one parser of arch names: targets and the tuner's limits use it."""
    match = _SM.fullmatch(arch)
    return (int(match.group(1)), int(match.group(2))) if match else None


def _torch_version() -> str:
    return ".".join(torch.__version__.split("+")[0].split(".")[:2])


def _triton_version() -> str:
    # Read from the installed metadata, so a process that only hashes never imports Triton.
    try:
        return metadata.version("triton")
    except metadata.PackageNotFoundError:
        return "none"


def _as_graph(graph: Graph | WireIdentity | dict | str | bytes) -> Graph | WireIdentity:
    return graph if isinstance(graph, Graph | WireIdentity) else from_wire(graph)


def graph_hash(graph: Graph | WireIdentity | dict | str | bytes) -> str:
    """sha256 (64 hex digits) of the graph's canonical JSON; wire forms are parsed first
    (a `WireIdentity` names a graph before it is validated, with the same hash)."""
    return hashlib.sha256(_as_graph(graph).canonical_text().encode("ascii")).hexdigest()


@dataclass(frozen=True)
class Target:
    """What kiln compiles for: device type, architecture, device name, code-changing versions."""

    device_type: str
    arch: str
    name: str
    torch: str = field(default_factory=_torch_version)
    triton: str = field(default_factory=_triton_version)
    compiler: str = COMPILER_VERSION

    def __post_init__(self) -> None:
        self._validate()

    def _validate(self) -> None:
        for f in fields(self):
            if not isinstance(getattr(self, f.name), str):
                raise WireError(f"target field {f.name!r} must be a string")
        if self.device_type not in DEVICE_TYPES:
            raise WireError(f"target device_type {self.device_type[:40]!r} is not one of {list(DEVICE_TYPES)}")
        if self.device_type == "cpu" and self.arch != "cpu":
            raise WireError(f"a cpu target has arch 'cpu', not {self.arch[:40]!r}")
        for name in ("arch", "triton", "compiler"):
            if not _TOKEN.fullmatch(getattr(self, name)):
                raise WireError(f"target {name} {getattr(self, name)[:40]!r} is malformed")
        if not _TORCH_MINOR.fullmatch(self.torch):
            raise WireError(f"target torch {self.torch[:40]!r} must be major.minor, e.g. '2.13'")
        if not _NAME.fullmatch(self.name):
            raise WireError("target name must be 1-128 printable ASCII characters")

    @classmethod
    def detect(cls, device: str | torch.device = "cuda") -> Target:
        """The target of a local device (`"cuda"`, `"cuda:3"`, `"cpu"`); the index only picks
        which GPU to ask, it never enters the target."""
        device = torch.device(device)
        if device.type == "cpu":
            return cls.cpu()
        if device.type != "cuda":
            raise ValueError(f"kiln targets cuda or cpu devices, not {device.type!r}")
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device is visible; use Target.named(...) for a remote GPU")
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        arch = getattr(props, "gcnArchName", "").split(":")[0] if torch.version.hip else f"sm_{props.major}{props.minor}"
        return cls("cuda", arch, props.name)

    @classmethod
    def cpu(cls) -> Target:
        """The CPU target (kernels under the Triton interpreter)."""
        return cls("cpu", "cpu", "cpu")

    @classmethod
    def named(cls, arch: str, name: str, **versions: str) -> Target:
        """A GPU target that need not be present: `Target.named("sm_90", name="NVIDIA H200")`;
        versions default to this process's torch, triton and compiler."""
        return cls("cpu" if arch == "cpu" else "cuda", arch, name, **versions)

    def to_json(self) -> dict[str, str]:
        """Exactly the six fields, as strings."""
        return asdict(self)

    @classmethod
    def from_json(cls, obj: Any) -> Target:
        """A target from its JSON dict; WireError on missing, unknown or malformed fields."""
        if not isinstance(obj, dict):
            raise WireError(f"target must be a JSON object, got {type(obj).__name__}")
        expected = {f.name for f in fields(cls)}
        if set(obj) != expected:
            missing, unknown = expected - set(obj), set(obj) - expected
            raise WireError(f"target lacks {sorted(missing)} / has unknown {sorted(brief(k) for k in unknown)[:5]}")
        return cls(**obj)

    @property
    def queue_class(self) -> str:
        """A short stable slug naming the queue for this target (`cuda-sm_90-nvidia-h200`, `cpu`)."""
        if self.device_type == "cpu":
            return "cpu"
        slug = re.sub(r"[^a-z0-9]+", "-", self.name.lower()).strip("-")
        return f"{self.device_type}-{self.arch.lower()}-{slug}"

    @property
    def cc(self) -> tuple[int, int] | None:
        """CUDA compute capability from `sm_XY` (`(9, 0)` for sm_90); None otherwise."""
        return compute_capability(self.arch)

    @property
    def cuda_arch(self) -> int | None:
        """The compute capability as Triton's `GPUTarget` takes it (90 for sm_90); None when
        the arch names none."""
        cc = self.cc
        return cc[0] * 10 + cc[1] if cc else None


def tuning_key(graph: Graph | WireIdentity | dict | str | bytes, target: Target) -> str:
    """sha256 of (graph hash, arch, device name, torch major.minor, triton, compiler version).

    `graph` may also be a graph hash (64 lowercase hex digits).
    """
    if isinstance(graph, str) and _HEX64.fullmatch(graph):
        digest = graph
    else:
        digest = graph_hash(graph)
    parts = [digest, target.arch, target.name, target.torch, target.triton, target.compiler]
    return hashlib.sha256(json.dumps(parts, separators=(",", ":")).encode("utf-8")).hexdigest()
