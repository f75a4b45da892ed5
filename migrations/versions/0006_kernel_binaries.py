"""Compiled kernels from the service: each kernel's binary files for its target, stored by
the worker that compiled it, content-addressed by Triton's cache key, with each file's
sha256 (kernel_binaries, kernel_binary_files).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'kernel_binaries',
        sa.Column('key', sa.String(length=64), nullable=False),
        sa.Column('source_hash', sa.String(length=64), nullable=False),
        sa.Column('arch', sa.String(length=32), nullable=False),
        sa.Column('kernel', sa.String(length=200), nullable=False),
        sa.Column('size', sa.Integer(), nullable=False),
        sa.Column('worker', sa.String(length=200), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint('key'),
    )
    with op.batch_alter_table('kernel_binaries', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_kernel_binaries_source_hash'), ['source_hash'],
                              unique=False)
    op.create_table(
        'kernel_binary_files',
        sa.Column('key', sa.String(length=64), nullable=False),
        sa.Column('name', sa.String(length=200), nullable=False),
        sa.Column('sha256', sa.String(length=64), nullable=False),
        sa.Column('data', sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(['key'], ['kernel_binaries.key'], ondelete='CASCADE'),
        sa.PrimaryKeyConstraint('key', 'name'),
    )


def downgrade() -> None:
    op.drop_table('kernel_binary_files')
    with op.batch_alter_table('kernel_binaries', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_kernel_binaries_source_hash'))
    op.drop_table('kernel_binaries')
