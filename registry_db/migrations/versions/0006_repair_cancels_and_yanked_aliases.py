"""Repair what two fixed bugs left in a registry's data (no schema change):

- queued jobs with a cancel pending: a requeue used to ignore the cancel, and `claim` skips such
  a job, so it stayed queued forever. They are cancelled, as registry_db/jobs.py now does.
- aliases on yanked versions: a yank used to leave `recommended` (or any alias but `latest`) on
  the yanked version, which a bare pull and the model page still offered. They are removed and
  `latest` is pointed at the newest published version (or removed), as `yank_version` now does;
  each move is appended to `alias_events`, like any other.

Not reversible: the downgrade leaves the repaired rows as they are.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25
"""

from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None

BY = "migration 0006"
jobs = sa.table('jobs', sa.column('id', sa.String), sa.column('status', sa.String),
                sa.column('phase', sa.String), sa.column('progress', sa.JSON),
                sa.column('cancel_requested', sa.Boolean), sa.column('finished_at', sa.DateTime),
                sa.column('updated_at', sa.DateTime))
versions = sa.table('bundle_versions', sa.column('id', sa.Integer), sa.column('model_id', sa.Integer),
                    sa.column('number', sa.Integer), sa.column('status', sa.String))
aliases = sa.table('aliases', sa.column('id', sa.Integer), sa.column('model_id', sa.Integer),
                   sa.column('name', sa.String), sa.column('version_id', sa.Integer),
                   sa.column('updated_at', sa.DateTime), sa.column('updated_by', sa.String))
events = sa.table('alias_events', sa.column('model_id', sa.Integer), sa.column('alias', sa.String),
                  sa.column('from_version_id', sa.Integer), sa.column('to_version_id', sa.Integer),
                  sa.column('at', sa.DateTime), sa.column('by', sa.String),
                  sa.column('reason', sa.Text))


def upgrade() -> None:
    bind = op.get_bind()
    now = datetime.now(timezone.utc)
    if bind.dialect.name == "sqlite":     # as models.UTCDateTime stores it there: naive UTC
        now = now.replace(tzinfo=None)
    _cancel_stuck_jobs(bind, now)
    _move_aliases_off_yanked(bind, now)


def _cancel_stuck_jobs(bind, now) -> None:
    stuck = bind.execute(sa.select(jobs.c.id, jobs.c.progress).where(
        jobs.c.status == 'queued', jobs.c.cancel_requested.is_(True))).all()
    for job_id, progress in stuck:
        bind.execute(jobs.update().where(jobs.c.id == job_id).values(
            status='cancelled', phase='cancelled', progress={**(progress or {}), "phase": "cancelled"},
            finished_at=now, updated_at=now))


def _move_aliases_off_yanked(bind, now) -> None:
    on_yanked = bind.execute(
        sa.select(aliases.c.id, aliases.c.model_id, aliases.c.name, aliases.c.version_id,
                  versions.c.number)
        .join(versions, versions.c.id == aliases.c.version_id)
        .where(versions.c.status == 'yanked')).all()
    for alias_id, model_id, name, old, number in on_yanked:
        new = _newest_published(bind, model_id) if name == 'latest' else None
        if new is None:
            bind.execute(aliases.delete().where(aliases.c.id == alias_id))
        else:
            bind.execute(aliases.update().where(aliases.c.id == alias_id).values(
                version_id=new, updated_at=now, updated_by=BY))
        bind.execute(events.insert().values(
            model_id=model_id, alias=name, from_version_id=old, to_version_id=new, at=now, by=BY,
            reason=f"version {number} was yanked before yanks moved aliases"))


def _newest_published(bind, model_id: int) -> int | None:
    return bind.execute(sa.select(versions.c.id).where(
        versions.c.model_id == model_id, versions.c.status == 'published')
        .order_by(versions.c.number.desc()).limit(1)).scalar()


def downgrade() -> None:
    pass
