"""Schema management: Alembic, driven from code, with the scripts shipped inside the package.

Every migration runs in one transaction that first takes the schema lock: a PostgreSQL advisory
lock held until commit, or SQLite's write lock (BEGIN IMMEDIATE). Replicas that start together
on an empty database then migrate one after the other, and each looks at the revision again
once it holds the lock, so the later ones find the work done instead of failing on the tables
the first created. Both locks die with their session, so a crashed migration leaves none.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, inspect, text

from ..zoo.errors import InvalidInput, SchemaOutOfDate
from .session import Database

SCRIPTS = Path(__file__).parent / "migrations"
# First key of the advisory lock; the second is the schema, so registries that share a database
# in schemas of their own do not wait for each other.
_ADVISORY_LOCK = 0x6F7A6462  # "ozdb"


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(SCRIPTS))
    return cfg


def _scripts() -> ScriptDirectory:
    return ScriptDirectory.from_config(_config())


def head() -> str:
    return _scripts().get_current_head()


def current(db: Database) -> str | None:
    with db.engine.connect() as conn:
        return _current(conn)


def upgrade(db: Database, revision: str = "head") -> None:
    """Migrate to `revision` in one transaction (PostgreSQL has transactional DDL).

    Raises SchemaOutOfDate when a newer oscar-zoo migrated the database (Alembic would only say
    it "can't locate" that revision), InvalidInput for a `revision` Alembic cannot reach.
    """
    with _migrating(db) as conn:
        rev = _current(conn)
        if not _known(rev):
            raise _out_of_date(rev)
        try:
            _run_upgrade(conn, revision)
        except CommandError as e:   # nothing was migrated: the transaction rolls back
            raise _bad_target(revision, e) from None


def _bad_target(revision: str, e: CommandError) -> InvalidInput:
    """Alembic's refusal of a target (its traceback said only "Can't locate revision identified
    by 'bogus'"), with the revisions this code has, so the next try can pick one."""
    said = str(e).rstrip(".")
    return InvalidInput(f"schema revision {revision!r}: {said}; this oscar-zoo's revisions are "
                        f"{known_revisions()} (`head`, the default, is {head()}); give one of "
                        "them, or none to migrate to head")


def known_revisions() -> str:
    """The revision ids, oldest to newest, as a range (they are numbered 0001, 0002, ...)."""
    revisions = [script.revision for script in _scripts().walk_revisions()][::-1]
    return revisions[0] if len(revisions) == 1 else f"{revisions[0]} to {revisions[-1]}"


def ensure_schema(db: Database, upgrade_empty: bool = True) -> None:
    """Migrate an empty database; refuse one that is behind (migrating live data is explicit).

    Raises SchemaOutOfDate when the database has another schema than this code: an older one
    (`oscar-zoo db upgrade` migrates it) or a newer one (oscar-zoo itself needs an upgrade).
    """
    rev = current(db)
    if rev == head():
        return
    if rev is None and upgrade_empty and not _has_tables(db):
        rev = _upgrade_if_empty(db)
        if rev == head():
            return
    raise _out_of_date(rev)


def _upgrade_if_empty(db: Database) -> str | None:
    """Migrate the database if it is still empty once this process holds the schema lock
    (another replica may have migrated it meanwhile); returns the revision it is at after."""
    with _migrating(db) as conn:
        rev = _current(conn)
        if rev is None and not inspect(conn).get_table_names():
            _run_upgrade(conn, "head")
            return head()
        return rev


@contextmanager
def _migrating(db: Database) -> Iterator[Connection]:
    """A transaction holding the schema lock until it commits or rolls back."""
    if db.is_sqlite:
        # The write lock up front (waiting out the busy timeout), not at the first DDL: a
        # deferred transaction that read an empty database fails with "database is locked".
        with db.engine.execution_options(sqlite_immediate=True).begin() as conn:
            yield conn
        return
    with db.engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # Transaction-scoped, so the commit that publishes the schema also releases the lock;
            # READ COMMITTED statements after it see what the previous holder committed.
            conn.execute(text("select pg_advisory_xact_lock(:key, "
                              "hashtext(coalesce(current_schema(), '')))"),
                         {"key": _ADVISORY_LOCK})
        yield conn


def _run_upgrade(conn: Connection, revision: str) -> None:
    cfg = _config()
    cfg.attributes["connection"] = conn
    command.upgrade(cfg, revision)


def _current(conn: Connection) -> str | None:
    return MigrationContext.configure(conn).get_current_revision()


def _known(rev: str | None) -> bool:
    return rev is None or rev in {script.revision for script in _scripts().walk_revisions()}


def _out_of_date(rev: str | None) -> SchemaOutOfDate:
    if not _known(rev):
        return SchemaOutOfDate(
            f"the registry database is at schema {rev}, which this oscar-zoo does not know (it "
            f"knows up to {head()}): a newer oscar-zoo migrated it; upgrade oscar-zoo "
            "(pip install -U oscar-zoo) on this host")
    return SchemaOutOfDate(f"the registry database is at schema {rev or '(none)'}, this code needs "
                           f"{head()}; run `oscar-zoo db upgrade` (back up the database first)")


def _has_tables(db: Database) -> bool:
    with db.engine.connect() as conn:
        return bool(inspect(conn).get_table_names())
