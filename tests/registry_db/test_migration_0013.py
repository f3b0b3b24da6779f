"""Migration 0013: idempotency keys unique per submitting token, not across the registry
(SQLite and PostgreSQL)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from alembic import command
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from oscar_zoo.registry_db import migrate
from oscar_zoo.registry_db.models import ApiToken, Job
from oscar_zoo.registry_db.session import Database

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def _tokens(s: Session) -> tuple[int, int]:
    ids = []
    for name in ("a", "b"):
        # Core, not ORM objects: the ORM writes every column of today's models
        ids.append(s.execute(ApiToken.__table__.insert().values(
            name=name, prefix=f"ozk_{name}", token_hash=name * 64, scopes=["jobs:submit"],
            created_at=T0)).inserted_primary_key[0])
    return ids[0], ids[1]


def _job(job_id: str, key: str | None, token: int | None, minutes: int) -> dict:
    return dict(id=job_id, spec={}, status="queued", phase="queued", progress={},
                cancel_requested=False, idempotency_key=key, created_by_token_id=token,
                created_at=T0 + timedelta(minutes=minutes))


def _downgrade(db: Database, revision: str) -> None:
    cfg = migrate._config()
    with db.engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, revision)


def test_keys_stored_before_stay_and_another_token_may_use_them(registry_db_url):
    db = Database(registry_db_url)
    migrate.upgrade(db, "0012")
    with Session(db.engine) as s, s.begin():
        a, b = _tokens(s)
        s.execute(Job.__table__.insert(), [_job("j1", "nightly", a, 0)])
    migrate.upgrade(db)
    with Session(db.engine) as s, s.begin():
        s.execute(Job.__table__.insert(), [_job("j2", "nightly", b, 1)])
    with Session(db.engine) as s:
        assert s.get(Job, "j1").idempotency_key == "nightly"
    with pytest.raises(IntegrityError), Session(db.engine) as s, s.begin():
        s.execute(Job.__table__.insert(), [_job("j3", "nightly", a, 2)])     # A's key, again
    db.dispose()


def test_the_downgrade_keeps_a_shared_key_on_its_oldest_job(registry_db_url):
    db = Database(registry_db_url)
    migrate.upgrade(db)
    with Session(db.engine) as s, s.begin():
        a, b = _tokens(s)
        s.execute(Job.__table__.insert(), [_job("old", "nightly", a, 0),
                                           _job("new", "nightly", b, 5),
                                           _job("own", "weekly", b, 6)])
    _downgrade(db, "0012")
    with Session(db.engine) as s:
        keys = dict(s.execute(select(Job.__table__.c.id, Job.__table__.c.idempotency_key)).all())
    assert keys == {"old": "nightly", "new": None, "own": "weekly"}
    with pytest.raises(IntegrityError), Session(db.engine) as s, s.begin():
        s.execute(Job.__table__.insert(), [_job("x", "weekly", a, 7)])   # global again
    db.dispose()
