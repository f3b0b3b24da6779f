"""Jobs: an idempotency key is unique per submitting token, not across the registry. A key was
global: token B submitting with the key token A had used got A's job back (its id, spec, state
and progress), and could not submit its own job under a key it chose (registry_db/jobs.py).

Jobs stored before keep their keys (unique across tokens already, so unique per token too).
Jobs of no token (stored before migration 0008) hold NULL there, which a unique constraint never
compares equal: nothing submits such jobs any more (POST /v1/jobs always records the token).

The downgrade keeps a key on the oldest job that holds it and clears it on the others, so that
the global constraint can be built again: those jobs stay, only their retries by key are lost.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None

GLOBAL = 'uq_jobs_idempotency_key'
PER_TOKEN = 'uq_jobs_created_by_token_id_idempotency_key'
jobs = sa.table('jobs', sa.column('id', sa.String), sa.column('idempotency_key', sa.String),
                sa.column('created_at', sa.DateTime))


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_constraint(GLOBAL, type_='unique')
        batch_op.create_unique_constraint(PER_TOKEN, ['created_by_token_id', 'idempotency_key'])


def downgrade() -> None:
    _clear_shared_keys(op.get_bind())
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_constraint(PER_TOKEN, type_='unique')
        batch_op.create_unique_constraint(GLOBAL, ['idempotency_key'])


def _clear_shared_keys(bind) -> None:
    rows = bind.execute(sa.select(jobs.c.id, jobs.c.idempotency_key)
                        .where(jobs.c.idempotency_key.is_not(None))
                        .order_by(jobs.c.created_at, jobs.c.id)).all()
    seen: set[str] = set()
    later = []
    for job_id, key in rows:
        if key in seen:
            later.append(job_id)
        seen.add(key)
    for job_id in later:
        bind.execute(jobs.update().where(jobs.c.id == job_id).values(idempotency_key=None))
