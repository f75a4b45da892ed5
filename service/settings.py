"""One validated configuration for the API and the workers, read from the environment."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, Field, field_validator

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def default_database_url() -> str:
    """SQLite file under ~/.local/share/kiln, or ./.kiln when the home is not writable."""
    for base in (Path.home() / ".local" / "share" / "kiln", Path.cwd() / ".kiln"):
        try:
            base.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(base, os.W_OK):
            return f"sqlite:///{base / 'kiln.db'}"
    raise RuntimeError("no writable place for the default SQLite database; set KILN_DATABASE_URL")


class Settings(BaseModel):
    """Everything the service reads from its environment (`KILN_*`), checked once."""

    database_url: str = Field(default_factory=default_database_url)
    redis_url: str | None = None  # absent: in-process queue (embedded mode)
    redis_prefix: str = "kiln:"
    admin_token: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    rate_limit_per_s: float = Field(default=200.0, ge=0)  # per token; 0 disables the limit
    rate_limit_burst: int = Field(default=400, ge=1)
    lease_s: float = Field(default=60.0, gt=0)
    heartbeat_s: float = Field(default=5.0, gt=0)
    max_attempts: int = Field(default=3, ge=1)
    tune_trials: int = Field(default=64, ge=1)
    tune_seconds: float = Field(default=600.0, gt=0)
    build_timeout_s: float = Field(default=120.0, gt=0)  # a build child's wall time, then it fails
    max_build_cost: int = Field(default=1_000_000, ge=0)  # a build's price (compiler.lowering.budget); 0: none
    interpret_max_numel: int = Field(default=1 << 16, ge=0)  # CPU check on the interpreter
    build_memory_mb: int = Field(default=4096, ge=0)  # a build child's data segment; 0: no cap
    intake_slots: int = Field(default=4, ge=1)  # submissions read and validated at once
    intake_bytes: int = Field(default=32 << 20, ge=1)  # their bodies together
    intake_wait_s: float = Field(default=10.0, ge=0)  # for room, then 503
    intake_memory_mb: int = Field(default=2048, ge=0)  # an intake child's data segment; 0: no cap
    intake_budget_s: float = Field(default=30.0, gt=0)  # an intake child's wall time, then 422
    body_timeout_s: float = Field(default=60.0, gt=0)  # a request body in all, then 408
    body_idle_s: float = Field(default=10.0, gt=0)  # between two pieces of a body, then 408
    db_pool_size: int = Field(default=10, ge=1)
    lookup_cache_s: float = Field(default=1.0, ge=0)  # a settled lookup answer, reused; 0: off
    token_cache_s: float = Field(default=10.0, ge=0)  # a token's checked grant; revocation lag

    @field_validator("database_url")
    @classmethod
    def _known_database(cls, value: str) -> str:
        if not value.startswith(("sqlite", "postgresql")):
            raise ValueError("KILN_DATABASE_URL must be a sqlite:// or postgresql:// URL")
        if value.startswith("postgresql://"):
            value = "postgresql+psycopg://" + value.removeprefix("postgresql://")
        return value

    @field_validator("redis_url")
    @classmethod
    def _known_redis(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("KILN_REDIS_URL must be a redis:// URL")
        return value

    @property
    def loopback(self) -> bool:
        """Bound to loopback only: client endpoints may go without a token."""
        return self.host in LOOPBACK_HOSTS

    @property
    def body_limit(self) -> int:
        """Largest request body accepted, in bytes: the wire limit on a graph
        (KILN_MAX_BODY_BYTES, compiler/wire/limits.py) plus room for the target and tag."""
        from compiler.wire.limits import limits

        return limits().max_body_bytes + 64 * 1024

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: object) -> Settings:
        """Read `KILN_<FIELD>` variables (e.g. KILN_DATABASE_URL, KILN_LEASE_S)."""
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for name in cls.model_fields:
            raw = env.get(f"KILN_{name.upper()}")
            if raw is not None and raw != "":
                values[name] = raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
