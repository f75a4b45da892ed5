"""Server-side dashboard sessions (the cookie holds a random id, revocable) and the owners of
each job (a client token reads only the jobs it submitted).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'dashboard_sessions',
        sa.Column('id_hash', sa.String(length=64), nullable=False),
        sa.Column('token_hash', sa.String(length=64), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('id_hash'),
    )
    op.create_index('ix_dashboard_sessions_token_hash', 'dashboard_sessions', ['token_hash'])
    op.create_index('ix_dashboard_sessions_expires_at', 'dashboard_sessions', ['expires_at'])
    op.create_table(
        'job_owners',
        sa.Column('job_id', sa.Integer(), nullable=False),
        sa.Column('owner', sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('job_id', 'owner'),
    )


def downgrade() -> None:
    op.drop_table('job_owners')
    op.drop_index('ix_dashboard_sessions_expires_at', table_name='dashboard_sessions')
    op.drop_index('ix_dashboard_sessions_token_hash', table_name='dashboard_sessions')
    op.drop_table('dashboard_sessions')
