"""migrate.py: replicas migrating one empty database together, and databases from newer code.

(That the migrations build what the models describe is tests/registry_db/test_migrations.py.)
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from sqlalchemy import event, text

from oscar_zoo.registry_db import migrate
from oscar_zoo.registry_db.session import Database
from oscar_zoo.zoo.errors import InvalidInput, SchemaOutOfDate


def _wait_until_blocked(url: str, application_name: str, timeout_s: float = 30) -> None:
    """Return once the PostgreSQL session named `application_name` waits on a lock."""
    import psycopg

    from tests.utils.databases import POSTGRES_URL

    deadline = time.monotonic() + timeout_s
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        while time.monotonic() < deadline:
            if conn.execute("select 1 from pg_stat_activity where application_name = %s "
                            "and wait_event_type = 'Lock'", (application_name,)).fetchone():
                return
            time.sleep(0.02)
    pytest.fail(f"the second replica never waited for the first ({url})")


def test_replicas_starting_together_on_an_empty_database_both_start(registry_db_url):
    """Replica A migrates; before A commits, replica B finds the database still empty and starts
    migrating too. B must wait for A and then find the schema done, not fail on A's tables
    (PostgreSQL: UniqueViolation on pg_type) or migrate twice."""
    first = Database(registry_db_url)
    second_name = f"oz_replica_{uuid.uuid4().hex[:8]}"
    sep = "&" if "?" in registry_db_url else "?"
    second = Database(registry_db_url if first.is_sqlite
                      else f"{registry_db_url}{sep}application_name={second_name}")
    outcome: list[BaseException | None] = []

    def second_replica():
        try:
            migrate.ensure_schema(second)
            outcome.append(None)
        except BaseException as e:  # reported by the assertion below
            outcome.append(e)

    racer = threading.Thread(target=second_replica)

    @event.listens_for(first.engine, "commit")
    def start_second_before_committing(_conn):
        # A has migrated and is about to commit: B starts now, and A commits once B waits.
        if racer.ident is None:
            racer.start()
            if first.is_sqlite:
                time.sleep(0.5)     # SQLite has no view of who waits; B needs microseconds
            else:
                _wait_until_blocked(registry_db_url, second_name)

    try:
        migrate.ensure_schema(first)
        racer.join(60)
        assert outcome == [None], outcome
        assert migrate.current(first) == migrate.head()
        with first.engine.connect() as conn:
            assert conn.execute(text("select count(*) from alembic_version")).scalar() == 1
    finally:
        first.dispose()
        second.dispose()


def test_upgrade_after_another_replica_upgraded_is_a_no_op(registry_db_url):
    db = Database(registry_db_url)
    migrate.upgrade(db)
    migrate.upgrade(db)
    migrate.ensure_schema(db)
    assert migrate.current(db) == migrate.head()
    db.dispose()


def _migrated_by_a_newer_release(url: str) -> Database:
    db = Database(url)
    migrate.upgrade(db)
    with db.engine.begin() as conn:
        conn.execute(text("update alembic_version set version_num = '9999_from_the_future'"))
    return db


def test_a_database_migrated_by_newer_code_says_upgrade_oscar_zoo(registry_db_url):
    """A rollback of the code, or an old replica during a rolling upgrade: `oscar-zoo db upgrade`
    cannot help (it fails with "Can't locate revision"); a newer oscar-zoo can."""
    db = _migrated_by_a_newer_release(registry_db_url)
    try:
        for step in (migrate.ensure_schema, migrate.upgrade):
            with pytest.raises(SchemaOutOfDate) as raised:
                step(db)
            message = str(raised.value)
            assert "9999_from_the_future" in message and "newer oscar-zoo" in message
            assert "pip install -U oscar-zoo" in message and "db upgrade" not in message
        with db.engine.connect() as conn:    # and nothing was touched
            assert conn.execute(text("select version_num from alembic_version")).scalar() \
                == "9999_from_the_future"
    finally:
        db.dispose()


def test_an_older_database_still_says_db_upgrade(registry_db_url):
    db = Database(registry_db_url)
    migrate.upgrade(db, "0005")
    with pytest.raises(SchemaOutOfDate, match="oscar-zoo db upgrade"):
        migrate.ensure_schema(db)
    migrate.upgrade(db)
    migrate.ensure_schema(db)
    db.dispose()


@pytest.mark.parametrize("target", ["bogus", "-1"])
def test_a_target_alembic_cannot_reach_is_one_line_naming_the_revisions(registry_db_url, target):
    """`oscar-zoo db upgrade --revision bogus` printed Alembic's 60-line traceback ending
    "CommandError: Can't locate revision identified by 'bogus'"."""
    db = Database(registry_db_url)
    try:
        with pytest.raises(InvalidInput) as raised:
            migrate.upgrade(db, target)
        said = str(raised.value)
        assert said.startswith(f"schema revision {target!r}: ") and "\n" not in said
        assert f"revisions are 0001 to {migrate.head()}" in said and "`head`" in said
        assert migrate.current(db) is None      # nothing was migrated
    finally:
        db.dispose()
