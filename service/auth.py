"""Bearer tokens: random, shown once, stored only as sha256; roles client and admin, each in
one tenant (service/tenants.py). Dashboard sessions: a random id in the cookie, its sha256
in the database, revocable."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy.orm import Session

from service.models import utcnow
from service.store import tokens
from service.tenants import DEFAULT_TENANT, check_tenant

ROLES = ("client", "admin")
TOKEN_PREFIX = "kiln_"
# A configured admin token must be at least this long with this many distinct characters:
# `kiln token create` and `kiln serve` make 43 random ones; "admin-secret" is refused.
MIN_ADMIN_TOKEN_CHARS = 24
MIN_ADMIN_TOKEN_DISTINCT = 10
SESSION_TTL_S = 24 * 3600  # a browser session; the operator logs in again after a day


@dataclass(frozen=True)
class Grant:
    """What a valid token carries: its role and its tenant."""

    role: str
    tenant: str


@dataclass(frozen=True)
class Principal:
    """Who is calling: a role, an identity for rate limiting (a token hash or an IP), and
    the tenant whose plans it reads and writes."""

    role: str | None  # None: anonymous (allowed only for client routes on loopback)
    ident: str
    tenant: str

    @property
    def owner(self) -> str | None:
        """Whose jobs these are: the token's hash; None for an anonymous caller on loopback,
        who shares the one scope of this machine and sees every job."""
        return self.ident.removeprefix("token:") if self.ident.startswith("token:") else None


def hash_token(token: str) -> str:
    """sha256 hex of a token: what the database keeps."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh random token."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def create_token(session: Session, role: str, name: str | None = None,
                 tenant: str = DEFAULT_TENANT) -> str:
    """Store a new token's hash with its role and tenant; return the token (shown once,
    never stored)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    token = new_token()
    tokens.add_token(session, hash_token(token), role, name, check_tenant(tenant))
    return token


def is_configured_admin(token: str, admin_token: str | None) -> bool:
    """Whether `token` is the configured admin token (KILN_ADMIN_TOKEN): no query."""
    return bool(admin_token) and hmac.compare_digest(hash_token(token), hash_token(admin_token))


def resolve_token(session: Session, token: str, admin_token: str | None) -> Grant | None:
    """The role and tenant a presented token carries, or None when it is unknown or revoked.
    The configured admin token is in the default tenant."""
    if is_configured_admin(token, admin_token):
        return Grant("admin", DEFAULT_TENANT)
    row = tokens.token_by_hash(session, hash_token(token))
    if row is None or row.revoked:
        return None
    return Grant(row.role, row.tenant)


def admin_token_weakness(token: str) -> str | None:
    """Why a configured admin token is too weak to guard a public bind, or None."""
    if len(token) < MIN_ADMIN_TOKEN_CHARS:
        return f"it has {len(token)} characters; at least {MIN_ADMIN_TOKEN_CHARS} are needed"
    if len(set(token)) < MIN_ADMIN_TOKEN_DISTINCT:
        return f"it uses fewer than {MIN_ADMIN_TOKEN_DISTINCT} distinct characters"
    return None


def create_session(session: Session, admin_token: str, ttl_s: float = SESSION_TTL_S) -> str:
    """Open a dashboard session for a checked admin token; returns the id for the cookie
    (only its sha256 is stored, with the hash of the token that opened it)."""
    sid = secrets.token_urlsafe(32)
    now = utcnow()
    tokens.add_dashboard_session(session, hash_token(sid), hash_token(admin_token), now,
                                 now + timedelta(seconds=ttl_s))
    return sid


def session_is_admin(session: Session, sid: str, admin_token: str | None) -> bool:
    """True while the dashboard session `sid` exists, has not expired, and the admin token
    that opened it is still valid (the configured one, or a stored one not revoked)."""
    row = tokens.dashboard_session(session, hash_token(sid))
    if row is None or row.expires_at <= utcnow():
        return False
    if admin_token and hmac.compare_digest(row.token_hash, hash_token(admin_token)):
        return True
    token = tokens.token_by_hash(session, row.token_hash)
    return token is not None and not token.revoked and token.role == "admin"


def end_session(session: Session, sid: str) -> None:
    """Log out: the session id stops working at once, wherever the cookie was copied."""
    tokens.delete_dashboard_session(session, hash_token(sid))
