"""Client configuration: environment variables, overridden by `kiln.configure(...)`.

The environment is read each time `current()` is called, so a process (or a test) that
changes `KILN_*` variables before compiling gets what it set. Values passed to
`configure()` win over the environment until `configure(reset=True)`.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from kiln.cache import DEFAULT_MAX_BYTES

Mode = Literal["wait", "async"]
MODES: tuple[str, ...] = ("wait", "async")

DEFAULT_URL = "http://127.0.0.1:8000"
_SIZE_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "kiln" / "schedules"


@dataclass(frozen=True)
class Config:
    """Everything the backend needs to know about where and how to fetch schedules.

    `url` None (or `KILN_URL=off`) means no service at all: every graph is built locally
    from the heuristic schedule, silently.
    """

    url: str | None = DEFAULT_URL
    token: str | None = None
    mode: Mode = "wait"
    cache_dir: Path | None = None  # None: the default under ~/.cache/kiln
    connect_timeout: float = 2.0  # seconds to open a connection to the service
    request_timeout: float = 10.0  # seconds for one HTTP exchange
    wait_timeout: float = 120.0  # wait mode: longest block for the tuned schedule per graph
    poll_interval: float = 0.5  # seconds between two polls of a pending schedule
    poll_for: float = 3600.0  # background poller gives up on a graph after this long
    retries: int = 2  # extra attempts for a failed request (connection error, 429, 502-504)
    tag: str | None = None  # optional model tag sent with each graph (dashboard)
    cache: bool = True  # use the local disk cache
    cache_max_bytes: int = DEFAULT_MAX_BYTES  # its size cap (least recently used go)
    background: bool = False  # compile off the training thread; run eagerly until ready
    binaries: bool = True  # load kernels the service compiled (KILN_BINARIES=off: compile all)
    plans: bool = True  # keep and fetch AOTAutograd's results (kiln.plans; KILN_PLANS=off: not)
    gc_freeze: bool = True  # at the backend's lookup, freeze what the process holds (kiln.preload)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"kiln mode must be one of {MODES}, not {self.mode!r}")
        for name in ("connect_timeout", "request_timeout", "wait_timeout", "poll_interval",
                     "poll_for"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value < 0:
                raise ValueError(f"kiln {name} must be a number >= 0, not {value!r}")
        if not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"kiln retries must be an int >= 0, not {self.retries!r}")
        if not isinstance(self.cache_max_bytes, int) or self.cache_max_bytes < 0:
            raise ValueError(f"kiln cache_max_bytes must be an int >= 0, not "
                             f"{self.cache_max_bytes!r}")

    @property
    def schedule_dir(self) -> Path:
        """Directory of the local schedule cache."""
        return Path(self.cache_dir) if self.cache_dir is not None else _default_cache_dir()

    @property
    def plan_dir(self) -> Path:
        """Directory of the local plan cache (`kiln.plans`)."""
        return self.schedule_dir / "plans"


def _mode(value: str) -> str:
    mode = value.strip().lower()
    if mode not in MODES:
        raise ValueError(f"expected one of {MODES}")
    return mode


def _flag(value: str) -> bool:
    flag = value.strip().lower()
    if flag in ("1", "true", "yes", "on"):
        return True
    if flag in ("", "0", "false", "no", "off"):
        return False
    raise ValueError("expected 1 or 0")


def parse_size(value: str) -> int:
    """A size in bytes from `1073741824`, `512M`, `1G`, `1.5GiB` (K, M, G, T are powers of
    1024); raises ValueError for anything else."""
    text = value.strip().lower().removesuffix("ib").removesuffix("b")
    unit = text[-1:] if text[-1:] in _SIZE_UNITS else ""
    try:
        size = float(text.removesuffix(unit)) * _SIZE_UNITS.get(unit, 1)
    except ValueError:
        raise ValueError(f"{value!r} is not a size (bytes, or a number with K, M, G or T)") \
            from None
    if size < 0 or size != size or size == float("inf"):
        raise ValueError(f"{value!r} is not a size >= 0")
    return int(size)


def _non_negative(parse: Any) -> Any:
    def check(value: str) -> Any:
        number = parse(value)
        if number < 0:
            raise ValueError("must be >= 0")
        return number

    return check


_ENV: dict[str, tuple[str, Any]] = {
    # variable -> (field, parser)
    "KILN_URL": ("url", lambda v: None if v.strip().lower() in ("", "off", "none") else v),
    "KILN_TOKEN": ("token", lambda v: v or None),
    "KILN_MODE": ("mode", _mode),
    "KILN_CACHE_DIR": ("cache_dir", lambda v: Path(v) if v else None),
    "KILN_CACHE_MAX_BYTES": ("cache_max_bytes", parse_size),
    "KILN_CONNECT_TIMEOUT": ("connect_timeout", _non_negative(float)),
    "KILN_TIMEOUT": ("request_timeout", _non_negative(float)),
    "KILN_WAIT_TIMEOUT": ("wait_timeout", _non_negative(float)),
    "KILN_POLL_INTERVAL": ("poll_interval", _non_negative(float)),
    "KILN_RETRIES": ("retries", _non_negative(int)),
    "KILN_TAG": ("tag", lambda v: v or None),
    "KILN_BACKGROUND": ("background", _flag),
    "KILN_BINARIES": ("binaries", _flag),
    "KILN_PLANS": ("plans", _flag),
    "KILN_GC_FREEZE": ("gc_freeze", _flag),
}

_FIELDS = {f.name for f in dataclasses.fields(Config)}
_lock = threading.Lock()
_overrides: dict[str, Any] = {}


def from_env(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """The `Config` fields set by `KILN_*` variables; a bad value raises `ValueError`
    naming the variable."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    for variable, (field, parse) in _ENV.items():
        if variable not in environ:
            continue
        try:
            values[field] = parse(environ[variable])
        except ValueError as exc:
            raise ValueError(f"{variable}={environ[variable]!r} is not valid: {exc}") from exc
    return values


def configure(reset: bool = False, **options: Any) -> Config:
    """Set client options for this process; they win over `KILN_*` environment variables.

    Accepts any `Config` field (`url`, `token`, `mode`, `cache_dir`, `connect_timeout`,
    `request_timeout`, `wait_timeout`, `poll_interval`, `poll_for`, `retries`, `tag`,
    `cache`, `cache_max_bytes`, `background`, `binaries`, `plans`). `reset=True` first forgets earlier calls. Returns the resulting
    config.
    """
    unknown = set(options) - _FIELDS
    if unknown:
        raise TypeError(f"kiln.configure got unknown option(s) {sorted(unknown)}; "
                        f"known: {sorted(_FIELDS)}")
    with _lock:
        merged = {} if reset else dict(_overrides)
        merged.update(options)
        if reset and not options:
            _overrides.clear()
            return Config()
        config = _build(merged)  # validate before keeping anything
        _overrides.clear()
        _overrides.update(merged)
    return config


def current() -> Config:
    """The config in force now: defaults, then the environment, then `configure()`."""
    with _lock:
        overrides = dict(_overrides)
    return _build(overrides)


def _build(overrides: dict[str, Any]) -> Config:
    values = from_env()
    values.update(overrides)
    if values.get("cache_dir") is not None:
        values["cache_dir"] = Path(values["cache_dir"])
    return Config(**values)
