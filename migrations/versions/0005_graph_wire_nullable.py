"""A graph's stored wire form may be dropped (`kiln db prune --wire-days`) once its entries
went unused; a resubmission of the graph stores it again: graphs.wire becomes nullable.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('graphs', schema=None) as batch_op:
        batch_op.alter_column('wire', existing_type=sa.Text(), nullable=True)


def downgrade() -> None:
    pruned = op.get_bind().scalar(sa.text("SELECT count(*) FROM graphs WHERE wire IS NULL"))
    if pruned:
        raise RuntimeError(f"{pruned} graph(s) have no stored wire form (pruned); a schema "
                           "before 0005 cannot hold them: delete those graphs' entries first")
    with op.batch_alter_table('graphs', schema=None) as batch_op:
        batch_op.alter_column('wire', existing_type=sa.Text(), nullable=False)
