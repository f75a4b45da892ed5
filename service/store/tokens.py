"""API tokens and dashboard sessions, stored by their sha256 (service.auth hashes and
decides; this module only reads and writes rows). Callers own the transaction."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from service.models import DashboardSessionRow, TokenRow


def add_token(session: Session, token_hash: str, role: str, name: str | None,
              tenant: str) -> None:
    """Store a token's hash with its role and tenant."""
    session.add(TokenRow(token_hash=token_hash, role=role, name=name, tenant=tenant))


def token_by_hash(session: Session, token_hash: str) -> TokenRow | None:
    """The stored token with this hash, or None."""
    return session.scalars(select(TokenRow).where(TokenRow.token_hash == token_hash)).one_or_none()


def add_dashboard_session(session: Session, id_hash: str, token_hash: str,
                          created_at: datetime, expires_at: datetime) -> None:
    """Store a dashboard session by the hash of its id and of the token that opened it."""
    session.add(DashboardSessionRow(id_hash=id_hash, token_hash=token_hash,
                                    created_at=created_at, expires_at=expires_at))


def dashboard_session(session: Session, id_hash: str) -> DashboardSessionRow | None:
    """The dashboard session with this id hash, or None."""
    return session.get(DashboardSessionRow, id_hash)


def delete_dashboard_session(session: Session, id_hash: str) -> None:
    """End a dashboard session."""
    session.execute(delete(DashboardSessionRow).where(DashboardSessionRow.id_hash == id_hash))


def list_tokens(session: Session) -> list[TokenRow]:
    """Every stored token, oldest first."""
    return list(session.scalars(select(TokenRow).order_by(TokenRow.id)))


def revoke_token(session: Session, token_id: int) -> bool:
    """Revoke the token with this id; False when there is none."""
    row = session.get(TokenRow, token_id)
    if row is None:
        return False
    row.revoked = True
    return True
