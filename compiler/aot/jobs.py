"""A compile job: one kernel's generated source and Triton's specialisation of one launch,
the unit the compile workers take and a binary source is asked for. Torch-free."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class CompileJob:
    """One kernel to compile: its generated source and Triton's specialisation of a launch."""

    kernel: str  # the schedule's name for it, for messages
    source: str
    source_hash: str
    fn_name: str
    spec: str  # Triton's specialization data (JSON text)
    launcher: bool = True  # also build its launcher (`build_launcher`) where Triton has one each


def spec_field(job: CompileJob, name: str) -> Any:
    """Field `name` of a job's specialisation data; None when the data is no JSON object."""
    try:
        return json.loads(job.spec).get(name)
    except (ValueError, AttributeError):
        return None


def job_key(job: CompileJob) -> str | None:
    """The Triton cache key `specialization` put in a job's data, or None."""
    key = spec_field(job, "cache_key")
    return key if isinstance(key, str) else None


def launcher_signature(job: CompileJob) -> str | None:
    """What a job's launcher source depends on (Triton 3.6's `make_launcher`: the kernel's
    signature), as text; None when its specialisation data does not say."""
    signature = spec_field(job, "signature")
    return json.dumps(signature, sort_keys=True) if isinstance(signature, dict) else None
