"""Tenants: every token belongs to one (api_tokens.tenant) and plans are stored per tenant
(plans keyed by key and tenant, published ones under the tenant `*`). Existing tokens and
plans get the tenant `default`.

The plans table is rebuilt (its primary key changes), the same way on SQLite and PostgreSQL:
a new table, the rows copied, the old one dropped. Downgrading keeps one plan per key (the
published one, else the `default` tenant's) and drops the others: a plan is a cache that a
client's next compile refills.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

_COPIED = ('key', 'kind', 'body', 'bytes', 'created_at', 'hits', 'last_hit_at')


def _plan_columns(tenants: bool) -> list[sa.Column]:
    columns = [
        sa.Column('key', sa.String(length=64), nullable=False),
        sa.Column('kind', sa.String(length=16), nullable=False),
        sa.Column('body', sa.Text(), nullable=False),
        sa.Column('bytes', sa.Integer(), nullable=False),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('hits', sa.Integer(), nullable=False),
        sa.Column('last_hit_at', sa.DateTime(timezone=True), nullable=True),
    ]
    if tenants:
        columns[1:1] = [sa.Column('tenant', sa.String(length=64), nullable=False)]
        columns.append(sa.Column('published_from', sa.String(length=64), nullable=True))
    return columns


def _table(name: str, tenants: bool) -> sa.Table:
    """A lightweight table for copying rows (no metadata of the app's models)."""
    return sa.table(name, *(sa.column(c.name) for c in _plan_columns(tenants)))


def upgrade() -> None:
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.add_column(sa.Column('tenant', sa.String(length=64), nullable=False,
                                      server_default='default'))

    op.create_table('plans_by_tenant', *_plan_columns(tenants=True),
                    sa.PrimaryKeyConstraint('key', 'tenant', name='plans_key_tenant_pkey'))
    old, new = _table('plans', False), _table('plans_by_tenant', True)
    op.execute(new.insert().from_select(
        [*_COPIED, 'tenant'],
        sa.select(*(old.c[name] for name in _COPIED), sa.literal('default'))))
    op.drop_table('plans')
    op.rename_table('plans_by_tenant', 'plans')


def downgrade() -> None:
    op.create_table('plans_by_key', *_plan_columns(tenants=False),
                    sa.PrimaryKeyConstraint('key', name='plans_key_pkey'))
    old, new = _table('plans', True), _table('plans_by_key', False)
    for tenant in ('*', 'default'):  # the published plan first, then the default tenant's
        op.execute(new.insert().from_select(list(_COPIED), sa.select(
            *(old.c[name] for name in _COPIED)).where(
            old.c.tenant == tenant, old.c.key.not_in(sa.select(new.c.key)))))
    op.drop_table('plans')
    op.rename_table('plans_by_key', 'plans')
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.drop_column('tenant')
