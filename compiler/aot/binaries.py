"""Compiled kernel binaries in Triton's cache: the files a `triton.compile` result needs to
load (`binary_files`), their check (`check_binary_files`), whether the cache holds one
(`is_cached`), writing one there under its cache key so that the JIT loads it without
compiling (`install_binary`), and taking binaries back (`forget_binaries`). The client
installs the binaries the kiln service ships (`kiln/binaries.py`); the service's target
compile reads them off its compiles. Torch-free.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from typing import Any

log = logging.getLogger(__name__)

# A binary's files as Triton's cache keeps them: `<kernel>.json` (metadata) and
# `<kernel>.cubin`; the intermediate forms (ttir, ptx, ...) are not needed to load it.
BINARY_SUFFIXES = (".json", ".cubin")
_FILE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,150}\.(json|cubin)")


def binary_files(compiled: Any) -> dict[str, bytes]:
    """The files of a `triton.compile` result that loading it needs, by name, read from
    Triton's cache (metadata and cubin)."""
    files = {}
    for name, path in compiled.metadata_group.items():
        if name.endswith(BINARY_SUFFIXES) and not name.startswith("__grp__"):
            with open(path, "rb") as f:
                files[name] = f.read()
    return files


def check_binary_files(key: str, files: dict[str, bytes]) -> str | None:
    """Why `files` are not one kernel binary that `install_binary` may write under `key`
    (names, the metadata's own hash and name, the cubin beside it), or None."""
    names = sorted(files)
    if len(names) != 2 or not all(_FILE_NAME.fullmatch(n) for n in names):
        return f"unexpected files {names[:4]}"
    meta_name = next((n for n in names if n.endswith(".json")), None)
    if meta_name is None or f"{meta_name[:-5]}.cubin" not in files:
        return f"unexpected files {names}"
    try:
        meta = json.loads(files[meta_name])
    except ValueError as exc:
        return f"metadata is not JSON ({exc})"
    if not isinstance(meta, dict) or meta.get("hash") != key:
        return "its metadata names another cache key"
    if not isinstance(meta.get("name"), str) or meta["name"][:150] != meta_name[:-5]:
        return "its metadata names another kernel"
    return None


# Whether Triton's own cache manager found the first binary written at once where
# `_file_cache_dir` said (None: not written yet in this process; False: it did not, and
# binaries go through the manager from then on).
_layout_confirmed: bool | None = None


def _file_cache_dir(key: str) -> str | None:
    """The directory Triton's own file cache keeps `key` in (its cache directory, then the
    key in base32, as `get_cache_manager` names it), without making it as a cache manager
    does; None where another cache manager is configured or this Triton names it otherwise
    (imports, or the first binary's check in `install_binary`)."""
    if _layout_confirmed is False:
        return None
    try:
        from triton import knobs
        from triton.runtime.cache import _base32
    except ImportError:
        return None
    if knobs.cache.manager_class is not None or not knobs.cache.dir:
        return None
    return os.path.join(knobs.cache.dir, _base32(key))


def is_cached(key: str, fn_name: str) -> bool:
    """Whether Triton's cache holds a loadable binary under `key` for kernel `fn_name`
    (where Triton's own file cache has no directory for the key, without making one)."""
    from triton.runtime.cache import get_cache_manager

    directory = _file_cache_dir(key)
    if directory is not None and not os.path.isdir(directory):
        return False
    metadata = f"{fn_name[:150]}.json"
    group = get_cache_manager(key).get_group(metadata)
    return bool(group) and metadata in group


def install_binary(key: str, files: dict[str, bytes]) -> None:
    """Write a binary's files (checked by `check_binary_files`; raises ValueError
    otherwise) into Triton's cache under `key`, with the group record that makes the JIT
    find them: its next launch with that specialisation loads them without compiling.
    Into Triton's own file cache, where the key has no directory or an empty one, they go
    at once (`_install_at_once`; the process's first such binary is looked up through
    Triton's own manager, and should it not be found there, that one and all later ones go
    through the manager); otherwise through the cache manager, file by file."""
    global _layout_confirmed
    from triton.runtime.cache import get_cache_manager

    why = check_binary_files(key, files)
    if why is not None:
        raise ValueError(why)
    metadata = next(n for n in files if n.endswith(".json"))
    directory = _file_cache_dir(key)
    if directory is not None:
        os.makedirs(os.path.dirname(directory), exist_ok=True)
        if _install_at_once(directory, files, metadata):
            if _layout_confirmed:
                return
            _layout_confirmed = bool(get_cache_manager(key).get_group(metadata))
            if _layout_confirmed:
                return
            log.warning("kiln: Triton's cache did not find a binary where kiln wrote it; "
                        "writing binaries through Triton's cache manager")
            shutil.rmtree(directory, ignore_errors=True)
    manager = get_cache_manager(key)
    group = {name: manager.put(data, name, binary=True) for name, data in sorted(files.items())}
    manager.put_group(metadata, group)


def _install_at_once(directory: str, files: dict[str, bytes], metadata: str) -> bool:
    """Write a binary's files and group record as Triton's file cache lays them out into a
    fresh directory beside `directory`, then rename it to `directory`, which must be
    absent or empty: one rename where the manager's `put` makes, renames into place and removes a
    temporary directory per file (37 file system calls a binary: on an H200 host's disk,
    most of installing a graph's binaries). False, having changed nothing, when `directory`
    holds anything (another process's files) or a write fails. `metadata`: the name of the
    binary's metadata file, which names its group record."""
    group = {name: os.path.join(directory, name) for name in sorted(files)}
    contents = {**files, f"__grp__{metadata}": json.dumps({"child_paths": group}).encode()}
    staging = f"{directory}.tmp.pid_{os.getpid()}_{os.urandom(8).hex()}"
    try:
        os.mkdir(staging)
        for name, data in sorted(contents.items()):
            fd = os.open(os.path.join(staging, name), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
        os.rename(staging, directory)  # also over an empty directory; never over a full one
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        return False
    return True


def remove_binary(key: str) -> None:
    """Delete what Triton's cache holds under `key` (a binary that did not load)."""
    from triton.runtime.cache import get_cache_manager

    directory = getattr(get_cache_manager(key), "cache_dir", None)
    if directory and os.path.isdir(directory):
        shutil.rmtree(directory, ignore_errors=True)


def forget_binaries(keys: list[str], fns: list[Any]) -> None:
    """Take back binaries installed under `keys`: delete them from Triton's cache, and drop
    the kernels the JIT functions `fns` made of them, so that the next warmup compiles."""
    gone = set(keys)
    for key in gone:
        remove_binary(key)
    for fn in fns:
        for caches in list(getattr(fn, "device_caches", {}).values()):
            kernels = caches[0] if isinstance(caches, tuple) and caches else None
            if isinstance(kernels, dict):
                for k in [k for k, v in kernels.items() if getattr(v, "hash", None) in gone]:
                    del kernels[k]
