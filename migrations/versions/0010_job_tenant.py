"""Jobs record the tenant that submitted them (jobs.tenant), so the queue serves tenants in
turn (docs/operations.md, Fair queueing). Existing jobs take the tenant of their first
owner's token when it is still known, else `default`.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-09
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('tenant', sa.String(length=64), nullable=False,
                                      server_default='default'))
    jobs = sa.table('jobs', sa.column('id'), sa.column('tenant'))
    owners = sa.table('job_owners', sa.column('job_id'), sa.column('owner'))
    tokens = sa.table('api_tokens', sa.column('token_hash'), sa.column('tenant'))
    # The first owner (lowest token hash, for determinism) whose token still exists.
    first_tenant = (sa.select(tokens.c.tenant)
                    .select_from(owners.join(tokens, tokens.c.token_hash == owners.c.owner))
                    .where(owners.c.job_id == jobs.c.id)
                    .order_by(owners.c.owner).limit(1).scalar_subquery())
    op.execute(jobs.update().where(sa.exists(first_tenant)).values(tenant=first_tenant))


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('tenant')
