"""Jobs: the id of the token that submitted the job, so that only it (or an admin token) may
cancel it (registry_db/jobs.py request_cancel). `created_by` holds the token's name, which is
not unique. NULL for jobs stored before: only an admin token may cancel those.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('created_by_token_id', ID, nullable=True))
        batch_op.create_foreign_key(batch_op.f('fk_jobs_created_by_token_id_api_tokens'),
                                    'api_tokens', ['created_by_token_id'], ['id'])


def downgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('fk_jobs_created_by_token_id_api_tokens'),
                                 type_='foreignkey')
        batch_op.drop_column('created_by_token_id')
