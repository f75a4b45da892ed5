"""Initial schema: graphs, schedules and their kernels, jobs and their history,
measurements, workers, API tokens, lookup counters.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('api_tokens',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('revoked', sa.Boolean(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('token_hash')
    )
    op.create_table('graphs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('graph_hash', sa.String(length=64), nullable=False),
    sa.Column('wire', sa.Text(), nullable=False),
    sa.Column('op_summary', sa.JSON(), nullable=False),
    sa.Column('num_nodes', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('graph_hash')
    )
    op.create_table('lookup_counts',
    sa.Column('bucket', sa.DateTime(timezone=True), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('count', sa.Integer(), nullable=False),
    sa.PrimaryKeyConstraint('bucket', 'kind')
    )
    op.create_table('workers',
    sa.Column('id', sa.String(length=200), nullable=False),
    sa.Column('device', sa.String(length=32), nullable=False),
    sa.Column('queue_class', sa.String(length=128), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('current_job_id', sa.Integer(), nullable=True),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('workers', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_workers_queue_class'), ['queue_class'], unique=False)

    op.create_table('schedules',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('graph_hash', sa.String(length=64), nullable=False),
    sa.Column('device_type', sa.String(length=16), nullable=False),
    sa.Column('arch', sa.String(length=32), nullable=False),
    sa.Column('device_name', sa.String(length=128), nullable=False),
    sa.Column('torch_version', sa.String(length=32), nullable=False),
    sa.Column('triton_version', sa.String(length=32), nullable=False),
    sa.Column('compiler_version', sa.String(length=32), nullable=False),
    sa.Column('queue_class', sa.String(length=128), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('schedule', sa.Text(), nullable=True),
    sa.Column('tag', sa.String(length=200), nullable=True),
    sa.Column('eager_ms', sa.Float(), nullable=True),
    sa.Column('heuristic_ms', sa.Float(), nullable=True),
    sa.Column('tuned_ms', sa.Float(), nullable=True),
    sa.Column('tuning_s', sa.Float(), nullable=True),
    sa.Column('hits', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['graph_hash'], ['graphs.graph_hash'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('key')
    )
    with op.batch_alter_table('schedules', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_schedules_graph_hash'), ['graph_hash'], unique=False)
        batch_op.create_index('ix_schedules_last_used', ['last_used_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_schedules_queue_class'), ['queue_class'], unique=False)
        batch_op.create_index(batch_op.f('ix_schedules_status'), ['status'], unique=False)
        batch_op.create_index(batch_op.f('ix_schedules_tag'), ['tag'], unique=False)

    op.create_table('jobs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('stage', sa.String(length=8), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('progress', sa.Float(), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('worker_id', sa.String(length=200), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('lease_until', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['key'], ['schedules.key'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('key')
    )
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_jobs_status'), ['status'], unique=False)

    op.create_table('measurements',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('schedule_key', sa.String(length=64), nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=True),
    sa.Column('worker_id', sa.String(length=200), nullable=True),
    sa.Column('kernel', sa.String(length=200), nullable=False),
    sa.Column('variant', sa.String(length=32), nullable=True),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('ms', sa.Float(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('verified', sa.Boolean(), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['schedule_key'], ['schedules.key'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('measurements', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_measurements_schedule_key'), ['schedule_key'], unique=False)

    op.create_table('schedule_kernels',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('schedule_key', sa.String(length=64), nullable=False),
    sa.Column('position', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('variant', sa.String(length=32), nullable=False),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('nodes', sa.JSON(), nullable=False),
    sa.Column('ops', sa.JSON(), nullable=False),
    sa.Column('source', sa.Text(), nullable=True),
    sa.Column('source_hash', sa.String(length=64), nullable=True),
    sa.Column('heuristic_ms', sa.Float(), nullable=True),
    sa.Column('tuned_ms', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['schedule_key'], ['schedules.key'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('schedule_kernels', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_schedule_kernels_schedule_key'), ['schedule_key'], unique=False)

    op.create_table('job_events',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('worker_id', sa.String(length=200), nullable=True),
    sa.Column('message', sa.Text(), nullable=True),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('job_events', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_job_events_job_id'), ['job_id'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('job_events', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_job_events_job_id'))

    op.drop_table('job_events')
    with op.batch_alter_table('schedule_kernels', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_schedule_kernels_schedule_key'))

    op.drop_table('schedule_kernels')
    with op.batch_alter_table('measurements', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_measurements_schedule_key'))

    op.drop_table('measurements')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_jobs_status'))

    op.drop_table('jobs')
    with op.batch_alter_table('schedules', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_schedules_tag'))
        batch_op.drop_index(batch_op.f('ix_schedules_status'))
        batch_op.drop_index(batch_op.f('ix_schedules_queue_class'))
        batch_op.drop_index('ix_schedules_last_used')
        batch_op.drop_index(batch_op.f('ix_schedules_graph_hash'))

    op.drop_table('schedules')
    with op.batch_alter_table('workers', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_workers_queue_class'))

    op.drop_table('workers')
    op.drop_table('lookup_counts')
    op.drop_table('graphs')
    op.drop_table('api_tokens')
