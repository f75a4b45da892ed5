"""Kernels keep what compiling them for the target's GPU gave (registers, spills, shared
memory, binary size): a nullable JSON column on schedule_kernels.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('schedule_kernels', schema=None) as batch_op:
        batch_op.add_column(sa.Column('compiled', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('schedule_kernels', schema=None) as batch_op:
        batch_op.drop_column('compiled')
