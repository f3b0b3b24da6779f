"""Jobs: model name (for filtering), GPUs needed, the lease's fencing token and length,
start and finish times.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

UTC = sa.DateTime(timezone=True)

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('model', sa.String(length=200), nullable=True))
        batch_op.add_column(sa.Column('gpus', sa.Integer(), nullable=False, server_default='1'))
        batch_op.add_column(sa.Column('lease_token', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('lease_seconds', sa.Float(), nullable=False,
                                      server_default='60'))
        batch_op.add_column(sa.Column('started_at', UTC, nullable=True))
        batch_op.add_column(sa.Column('finished_at', UTC, nullable=True))
        batch_op.create_index(batch_op.f('ix_jobs_model'), ['model'], unique=False)
    # The server defaults only fill existing rows; the ORM always sets both columns.
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.alter_column('gpus', server_default=None)
        batch_op.alter_column('lease_seconds', server_default=None)


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_jobs_model'))
        batch_op.drop_column('finished_at')
        batch_op.drop_column('started_at')
        batch_op.drop_column('lease_seconds')
        batch_op.drop_column('lease_token')
        batch_op.drop_column('gpus')
        batch_op.drop_column('model')
