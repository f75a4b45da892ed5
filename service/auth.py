"""Bearer tokens: random, shown once, stored only as sha256; roles client and admin."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import TokenRow

ROLES = ("client", "admin")
TOKEN_PREFIX = "kiln_"


@dataclass(frozen=True)
class Principal:
    """Who is calling: a role, and an identity for rate limiting (a token hash or an IP)."""

    role: str | None  # None: anonymous (allowed only for client routes on loopback)
    ident: str


def hash_token(token: str) -> str:
    """sha256 hex of a token: what the database keeps."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh random token."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def create_token(session: Session, role: str, name: str | None = None) -> str:
    """Store a new token's hash with its role; return the token (shown once, never stored)."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, not {role!r}")
    token = new_token()
    session.add(TokenRow(token_hash=hash_token(token), role=role, name=name))
    return token


def resolve_token(session: Session, token: str, admin_token: str | None) -> str | None:
    """The role a presented token carries, or None when it is unknown or revoked."""
    digest = hash_token(token)
    if admin_token and hmac.compare_digest(digest, hash_token(admin_token)):
        return "admin"
    row = session.scalars(select(TokenRow).where(TokenRow.token_hash == digest)).one_or_none()
    if row is None or row.revoked:
        return None
    return row.role
