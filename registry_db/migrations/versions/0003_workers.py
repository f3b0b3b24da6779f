"""Workers the registry has heard from, so a queued job can say why it waits.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

UTC = sa.DateTime(timezone=True)

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'workers',
        sa.Column('name', sa.String(length=200), nullable=False),
        sa.Column('gpus', sa.Integer(), nullable=True),
        sa.Column('ray', sa.Boolean(), nullable=False),
        sa.Column('first_seen_at', UTC, nullable=False),
        sa.Column('seen_at', UTC, nullable=False),
        sa.PrimaryKeyConstraint('name', name=op.f('pk_workers')),
    )
    op.create_index(op.f('ix_workers_seen_at'), 'workers', ['seen_at'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_workers_seen_at'), table_name='workers')
    op.drop_table('workers')
