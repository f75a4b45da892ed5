"""Compiled kernels from the service (docs/client.md, same title): a client on a fresh machine
loads the binaries a worker compiled instead of compiling them.

`Built.precompile` asks Triton's JIT, per distinct launch, what it would compile, and that
specialisation gives the launch's Triton cache key (`compiler.aot`). While
`Resolver` precompiles a graph, `ServiceBinaries` is that thread's binary source: it asks
the service for the keys Triton's cache lacks (one request), and each binary it receives is
written into Triton's cache only if
- the kernel's source hash the service recorded is the one this client regenerated (and
  checked against the schedule) for that launch,
- every file's bytes have the sha256 the worker recorded when it stored them,
- the files are one kernel's metadata and cubin, the metadata naming that cache key.
Triton's JIT then finds the binary under the key it computes itself and loads it without
compiling. A refused binary is compiled here (one warning); a binary that does not load
makes the resolver compile the graph's kernels here (one warning, `precompile`).
Binaries are never required: no service, a miss or `KILN_BINARIES=off` compile as before.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

from compiler import aot
from kiln import degrade
from kiln.client import Binary, ServiceClient, ServiceError

log = logging.getLogger("kiln")


def refusal(job: aot.CompileJob, key: str, binary: Binary) -> str | None:
    """Why `binary` may not stand for `job`'s compile under `key`, or None."""
    if binary.source_hash != job.source_hash:
        return (f"it was compiled from source {binary.source_hash[:12]}, this client generated "
                f"{job.source_hash[:12]}")
    for name, (digest, data) in binary.files.items():
        if hashlib.sha256(data).hexdigest() != digest:
            return f"file {name[:80]} does not match its sha256"
    return aot.check_binary_files(key, binary.data)


class ServiceBinaries:
    """A `compiler.aot.BinarySource` that fetches binaries from the kiln service."""

    def __init__(self, client: ServiceClient) -> None:
        self.client = client

    def __call__(self, jobs: list[aot.CompileJob]) -> set[str]:
        with degrade.timed("fetch_binaries"):
            return self._fetch(jobs)

    def _fetch(self, jobs: list[aot.CompileJob]) -> set[str]:
        wanted: dict[str, aot.CompileJob] = {}
        for job in jobs:
            key = aot.job_key(job)
            if key is not None:
                wanted.setdefault(key, job)
        if not wanted:
            return set()
        try:
            got = self.client.binaries(list(wanted))
        except ServiceError as exc:  # the schedule's own request reported the service's state
            log.debug("kiln: no compiled kernels from the service: %s", exc)
            degrade.count("binaries_unavailable")
            if exc.cause == "malformed":  # which that request may not have seen
                degrade.warn_once("malformed", str(exc), url=self.client.url)
            return set()
        installed: set[str] = set()
        for key, job in wanted.items():
            binary = got.get(key)
            if binary is None:
                continue
            why = refusal(job, key, binary)
            if why is not None:
                degrade.count("binaries_refused")
                degrade.warn_once("binary_refused", f"kernel {job.kernel}: {why}")
                continue
            try:
                aot.install_binary(key, binary.data)
            except (OSError, ValueError) as exc:
                degrade.warn_once("cache", f"Triton's cache: {exc}")
                continue
            installed.add(key)
        degrade.count("binaries_fetched", len(installed))
        degrade.count("binaries_missed", len(wanted) - len(got))
        return installed


def precompile(built: Any, device: Any, source: ServiceBinaries | None, key: str) -> None:
    """Compile or load every kernel of `built` onto `device`, taking the compiled kernels
    `source` has (None: compile them all here). Should one of those not load, they are
    all taken back (nothing of theirs stays in Triton's cache or its JIT) and the graph's
    kernels are compiled here, with one warning."""
    with aot.binary_source(source) as placed:
        try:
            built.precompile(device)
        except Exception as exc:
            if not placed:
                raise
            degrade.warn_once("binary_load", f"{key[:12]}: {type(exc).__name__}: "
                                             f"{str(exc)[:200]}")
            aot.forget_binaries(placed, [i.fn for i in built.launches()])
            with aot.binary_source(None):
                built.precompile(device)
