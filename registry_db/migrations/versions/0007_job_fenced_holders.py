"""Jobs: the Ray task processes a later task's attach replaced, so that one of them attaching
again (its first reply was lost) is refused instead of taking the lease back from the retry
(registry_db/jobs.py attach). NULL for jobs stored before, and until a second task attaches.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('fenced_holders', sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('fenced_holders')
