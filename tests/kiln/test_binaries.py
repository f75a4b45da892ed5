"""The client's side of compiled kernels from the service (kiln/binaries.py, Resolver._build):
what it refuses, what it installs, and a binary that does not load (a GPU fault here
simulated) makes it compile the graph's kernels itself, with one warning."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from compiler.aot import CompileJob, ahead, binaries
from kiln import degrade
from kiln.binaries import ServiceBinaries, refusal
from kiln.client import Binary, ServiceError
from tests.kiln.helpers import causes

KEY, SOURCE = "c" * 64, "5" * 64


def _files(key: str = KEY) -> dict[str, bytes]:
    meta = json.dumps({"hash": key, "name": "k_1234", "target": {"backend": "cuda", "arch": 90,
                                                                  "warp_size": 32}}).encode()
    return {"k_1234.json": meta, "k_1234.cubin": b"\x7fELF cubin bytes"}


def _binary(files: dict[str, bytes] | None = None, source: str = SOURCE,
            digests: dict[str, str] | None = None) -> Binary:
    files = files or _files()
    digests = digests or {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}
    return Binary(KEY, source, {n: (digests[n], d) for n, d in files.items()})


def _job(key: str | None = KEY) -> CompileJob:
    return CompileJob("k_0", source="", source_hash=SOURCE, fn_name="k_1234",
                      spec=json.dumps({"cache_key": key}))


def test_a_binary_is_refused_unless_source_sha256_and_files_all_check() -> None:
    assert refusal(_job(), KEY, _binary()) is None
    assert "compiled from source 666666666666" in refusal(_job(), KEY, _binary(source="6" * 64))
    bad = {"k_1234.json": "0" * 64, "k_1234.cubin": hashlib.sha256(b"\x7fELF cubin bytes").hexdigest()}
    assert refusal(_job(), KEY, _binary(digests=bad)) == "file k_1234.json does not match its sha256"
    other = _files("d" * 64)  # metadata of another cache key
    assert refusal(_job(), KEY, _binary(other)) == "its metadata names another cache key"
    extra = {**_files(), "k_1234.ptx": b"ptx"}
    assert refusal(_job(), KEY, _binary(extra)).startswith("unexpected files")


class _Client:
    def __init__(self, answer: dict[str, Binary] | Exception) -> None:
        self.answer, self.asked = answer, []

    def binaries(self, keys: list[str]) -> dict[str, Binary]:
        self.asked.append(keys)
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_checked_binaries_are_written_into_tritons_cache(tmp_path: Path, monkeypatch,
                                                         kiln_state: dict, kiln_warnings) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    tampered = Binary("e" * 64, SOURCE, {n: ("0" * 64, d) for n, d in _files("e" * 64).items()})
    client = _Client({KEY: _binary(), "e" * 64: tampered})
    jobs = [_job(), _job("e" * 64), _job("f" * 64), _job(None)]
    assert ServiceBinaries(client)(jobs) == {KEY}
    assert client.asked == [[KEY, "e" * 64, "f" * 64]]  # one request; a job with no key not asked
    assert binaries.is_cached(KEY, "k_1234") and not binaries.is_cached("e" * 64, "k_1234")
    stats = degrade.stats()
    assert (stats["binaries_fetched"], stats["binaries_refused"], stats["binaries_missed"]) == (1, 1, 1)
    assert causes(kiln_warnings) == {"binary_refused": 1}
    # The service failing costs nothing but the binaries (no warning of its own).
    assert ServiceBinaries(_Client(ServiceError("timeout", "slow")))([_job("f" * 64)]) == set()
    assert causes(kiln_warnings) == {"binary_refused": 1}


def test_an_installed_binary_is_laid_out_as_tritons_own_put_writes_it(tmp_path: Path,
                                                                       monkeypatch) -> None:
    from triton.runtime.cache import FileCacheManager, get_cache_manager

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "fast"))
    with monkeypatch.context() as patched:  # at once: not a file through the manager
        patched.setattr(FileCacheManager, "put", lambda *a, **k: pytest.fail("put"))
        binaries.install_binary(KEY, _files())
    fast = get_cache_manager(KEY)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "slow"))
    monkeypatch.setattr(binaries, "_install_at_once", lambda directory, files, metadata: False)
    binaries.install_binary(KEY, _files())
    slow = get_cache_manager(KEY)
    for manager, root in ((fast, "fast"), (slow, "slow")):
        group = manager.get_group("k_1234.json")
        assert sorted(group) == ["k_1234.cubin", "k_1234.json"]
        assert all(Path(p).read_bytes() == _files()[n] for n, p in group.items())
        assert sorted(p.name for p in Path(manager.cache_dir).iterdir()) == [
            "__grp__k_1234.json", "k_1234.cubin", "k_1234.json"]
        assert Path(manager.cache_dir).parent == tmp_path / root
    assert sorted(p.name for p in (tmp_path / "fast").iterdir()) == [Path(fast.cache_dir).name]


def test_a_layout_tritons_manager_does_not_read_is_given_up_after_the_first_binary(
        tmp_path: Path, monkeypatch, caplog) -> None:
    from triton.runtime import cache

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setattr(binaries, "_layout_confirmed", None)
    # A Triton whose manager names a key's directory otherwise than kiln expects.
    monkeypatch.setattr(cache, "get_cache_manager", lambda key: cache.FileCacheManager(key.upper()))
    with caplog.at_level("WARNING"):
        binaries.install_binary(KEY, _files())
        binaries.install_binary("e" * 64, _files("e" * 64))
    assert binaries._layout_confirmed is False
    assert binaries.is_cached(KEY, "k_1234") and binaries.is_cached("e" * 64, "k_1234")
    assert sorted(p.name for p in (tmp_path / "triton").iterdir()) == [KEY.upper(), "E" * 64]
    assert sum("through Triton's cache manager" in r.message for r in caplog.records) == 1


def test_asking_whether_a_binary_is_cached_makes_no_directory(tmp_path: Path,
                                                              monkeypatch) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    assert not binaries.is_cached(KEY, "k_1234")
    assert list(tmp_path.iterdir()) == []  # a cache manager would have made the key's
    binaries.install_binary(KEY, _files())
    assert binaries.is_cached(KEY, "k_1234")


def test_a_binary_beside_anothers_files_goes_through_the_cache_manager(tmp_path: Path,
                                                                        monkeypatch) -> None:
    from triton.runtime.cache import get_cache_manager

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    other = Path(get_cache_manager(KEY).cache_dir) / "other.txt"
    other.write_text("another process's file")
    binaries.install_binary(KEY, _files())
    assert binaries.is_cached(KEY, "k_1234") and other.read_text() == "another process's file"
    assert sorted(p.name for p in tmp_path.iterdir()) == [other.parent.name]  # no staging left


def test_compile_ahead_asks_its_source_only_for_what_tritons_cache_lacks(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    binaries.install_binary(KEY, _files())
    asked: list[list[str]] = []

    def source(jobs: list[CompileJob]) -> set[str]:
        asked.append([ahead.job_key(j) for j in jobs])
        return {"e" * 64}

    monkeypatch.setattr(ahead, "shared", lambda: None)
    with ahead.binary_source(source) as placed:
        ahead.compile_ahead([_job(), _job("e" * 64), _job(None)])
    assert asked == [["e" * 64]] and placed == ["e" * 64]
    binaries.forget_binaries([KEY], [])
    assert not binaries.is_cached(KEY, "k_1234")


class _Built:
    """A built graph whose precompile loads binaries from the thread's source, and fails to
    load them (as a cubin the GPU rejects would) while any came from there."""

    def __init__(self) -> None:
        self.precompiles = 0
        self.kernels: list[Any] = []  # what a build generated (counted by the client)

    def precompile(self, _device: Any) -> int:
        self.precompiles += 1
        with_source = ahead._not_cached([_job()])
        if not with_source:
            raise RuntimeError("cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE")
        return 1

    def launches(self) -> list:
        return []


def test_a_binary_that_does_not_load_is_compiled_here_with_one_warning(
        tmp_path: Path, monkeypatch, kiln_state: dict, kiln_warnings) -> None:
    import compiler
    from kiln.config import Config
    from kiln.resolve import Resolver

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    built = _Built()
    monkeypatch.setattr(compiler, "build", lambda _graph, _schedule: built)
    resolver = Resolver.from_config(Config(url="http://127.0.0.1:9", cache=False))
    monkeypatch.setattr(resolver, "binaries", lambda: ServiceBinaries(_Client({KEY: _binary()})))
    entry = type("Entry", (), {"graph": None, "key": "k" * 64, "device": "cuda:0"})()
    assert resolver._build(entry, None) is built
    assert built.precompiles == 2  # once with the service's binary, once compiling
    assert causes(kiln_warnings) == {"binary_load": 1}
    assert not binaries.is_cached(KEY, "k_1234")  # taken back


@pytest.mark.parametrize("value", ["0", "off"])
def test_kiln_binaries_off_means_no_source(value: str, monkeypatch, kiln_state: dict) -> None:
    from kiln import config as kiln_config
    from kiln.resolve import Resolver

    monkeypatch.setenv("KILN_BINARIES", value)
    config = kiln_config.current()
    assert config.binaries is False and Resolver.from_config(config).binaries() is None
    assert Resolver.from_config(kiln_config.Config()).binaries() is not None
