"""Jobs: the lease's fencing tokens (`lease_token`, the claim's, and `task_token`, an attached
Ray task's) are stored as their sha256 hex, not in plain text (registry_db/jobs.py compares the
hash of the token a worker presents). The tokens stored are hashed here, so a worker holding a
lease across the upgrade keeps it.

The downgrade cannot give the tokens back, and the code before this migration compares them in
plain text: every lease would be lost without a word and each job left `running` until its
lease ran out, the sweep then spending an attempt on it (and failing a job on its last one).
Instead it gives the running jobs back as a worker shutting down does (registry_db/jobs.py
release): queued again without spending the attempt, or cancelled when a cancel is pending.
Their workers' next call is refused (Lease lost) and they stop; any worker claims the job anew.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""

import hashlib
from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None

REQUEUED = "the registry's database was downgraded (migration 0011), which ends every lease"
jobs = sa.table('jobs', sa.column('id', sa.String), sa.column('status', sa.String),
                sa.column('phase', sa.String), sa.column('progress', sa.JSON),
                sa.column('attempts', sa.Integer), sa.column('cancel_requested', sa.Boolean),
                sa.column('lease_holder', sa.String), sa.column('lease_token', sa.String),
                sa.column('task_token', sa.String), sa.column('lease_expires_at', sa.DateTime),
                sa.column('timings', sa.JSON), sa.column('finished_at', sa.DateTime),
                sa.column('updated_at', sa.DateTime))


def _sha256(token: str | None) -> str | None:
    # registry_db/tokens.py hash_token, as it is today: a migration must not change with it
    return hashlib.sha256(token.encode()).hexdigest() if token is not None else None


def upgrade() -> None:
    bind = op.get_bind()
    held = bind.execute(sa.select(jobs.c.id, jobs.c.lease_token, jobs.c.task_token).where(
        jobs.c.lease_token.is_not(None) | jobs.c.task_token.is_not(None))).all()
    for job_id, lease_token, task_token in held:
        bind.execute(jobs.update().where(jobs.c.id == job_id).values(
            lease_token=_sha256(lease_token), task_token=_sha256(task_token)))


def downgrade() -> None:
    bind = op.get_bind()
    now = datetime.now(timezone.utc)
    if bind.dialect.name == "sqlite":     # as models.UTCDateTime stores it there: naive UTC
        now = now.replace(tzinfo=None)
    running = bind.execute(sa.select(jobs.c.id, jobs.c.attempts, jobs.c.cancel_requested,
                                     jobs.c.progress).where(jobs.c.status == 'running')).all()
    for job_id, attempts, cancel_requested, progress in running:
        bind.execute(jobs.update().where(jobs.c.id == job_id).values(
            lease_holder=None, lease_token=None, task_token=None, lease_expires_at=None,
            updated_at=now, **_given_back(attempts, cancel_requested, progress, now)))


def _given_back(attempts, cancel_requested, progress, now) -> dict:
    """registry_db/jobs.py _requeue(refund=True), as it was at this revision."""
    if cancel_requested:
        return dict(status='cancelled', phase='cancelled', finished_at=now,
                    progress={**(progress or {}), "phase": "cancelled"})
    return dict(status='queued', phase='queued', attempts=max((attempts or 0) - 1, 0), timings={},
                progress={"phase": "queued", "done": 0, "total": 0, "layer": None,
                          "requeued": REQUEUED})
