"""Engines and transactions for the registry database.

SQLite (the embedded default) gets WAL, foreign keys and a busy timeout, and one writer at a
time: write transactions take a process-wide lock and start with BEGIN IMMEDIATE, so a writer
never fails half-way when it upgrades a read lock (datasette funnels writes through one thread
for the same reason). PostgreSQL needs neither; it relies on row locks and unique constraints.
"""

from __future__ import annotations

import sqlite3
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import NoSuchModuleError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from ..zoo import settings
from ..zoo.errors import ConfigError, DatabaseUnavailable, StorageFull

SQLITE_BUSY_MS = 30_000

URL_FIX = ("check OSCAR_ZOO_DATABASE_URL (SQLite: sqlite:///path; PostgreSQL: "
           "postgresql://user@host:port/db)")

# The package that installs each DB-API module SQLAlchemy's dialects import (by module name).
DRIVER_PACKAGES = {"psycopg": "psycopg[binary]", "psycopg2": "psycopg2-binary",
                   "asyncpg": "asyncpg", "pg8000": "pg8000", "MySQLdb": "mysqlclient",
                   "pymysql": "PyMySQL", "mysql": "mysql-connector-python",
                   "mariadb": "mariadb", "aiomysql": "aiomysql", "aiosqlite": "aiosqlite",
                   "oracledb": "oracledb", "pyodbc": "pyodbc", "pymssql": "pymssql"}


def default_url(data_dir: str | Path | None = None) -> str:
    """OSCAR_ZOO_DATABASE_URL, else SQLite in the data dir."""
    if data_dir is None:
        return settings.get("database_url")
    return f"sqlite:///{Path(data_dir) / 'registry.sqlite'}"


def normalize_url(url: str) -> str:
    """Bare postgresql:// URLs use psycopg 3 (the driver we ship), not psycopg2."""
    try:
        parsed = make_url(url)
    except Exception:
        raise ConfigError(f"database URL {settings.redact_url(url)!r} is not a SQLAlchemy URL "
                          "(e.g. sqlite:////path/registry.sqlite or postgresql://host/db)") from None
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


class Database:
    """One engine plus the two kinds of session the registry uses: read and write."""

    def __init__(self, url: str | None = None):
        self.url = normalize_url(url or default_url())
        self.is_sqlite = self.url.startswith("sqlite")
        try:
            self.engine = _sqlite_engine(self.url) if self.is_sqlite else _server_engine(self.url)
        except ModuleNotFoundError as e:    # the dialect imports its driver in create_engine
            raise _missing_driver(self.url, e) from None
        except NoSuchModuleError:           # foo://: no dialect of that name
            raise ConfigError(f"cannot connect to the database at {settings.redact_url(self.url)}: "
                              f"SQLAlchemy knows no database kind "
                              f"{make_url(self.url).drivername!r}; {URL_FIX}") from None
        event.listen(self.engine, "handle_error", _note_connect_failure)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._write_lock = threading.Lock() if self.is_sqlite else None

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._sessions() as session:
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A transaction that commits on clean exit and rolls back on error. Raises StorageFull
        (rolled back) when the database's disk is full."""
        with _full_disk_told():
            if self._write_lock is None:
                with self._sessions() as session, session.begin():
                    yield session
                return
            with self._write_lock:
                immediate = self.engine.execution_options(sqlite_immediate=True)
                with Session(immediate, expire_on_commit=False) as session, session.begin():
                    yield session

    def dispose(self) -> None:
        self.engine.dispose()


def _missing_driver(url: str, e: ModuleNotFoundError) -> ConfigError:
    module = (e.name or "").split(".")[0]
    package = DRIVER_PACKAGES.get(module, module or "its driver")
    return ConfigError(f"cannot connect to the database at {settings.redact_url(url)}: its driver "
                       f"{module or e} is not installed; install it (pip install '{package}') "
                       f"or {URL_FIX}")


def _note_connect_failure(ctx) -> None:
    """handle_error: a driver error raised while connecting (no connection yet, so no statement
    failed) keeps the URL it was connecting to, for connect_failure."""
    if ctx.connection is None and ctx.sqlalchemy_exception is not None and ctx.engine is not None:
        ctx.sqlalchemy_exception.connecting_to = ctx.engine.url


def connect_failure(e: BaseException) -> DatabaseUnavailable | None:
    """e as one actionable line when it (or an error it was raised from) is a failure to
    connect to the registry database: no such database, nothing listening, a refused login, or
    a PRAGMA SQLite refused on the new connection (_pragma), named with why and what to do.
    None for any other error, a failed statement included. The CLI tells it this way
    (zoo/cli/main.py); the API leaves it to its 500 handler, which names no server address."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        url = getattr(e, "connecting_to", None)
        if url is not None:
            # SQLAlchemy's URL prints its password as ***; the driver's reason may hold it too
            orig = getattr(e, "orig", None) or e
            reason = " ".join(_first_line(orig).split())
            if url.password:
                reason = reason.replace(str(url.password), "***")
            pragma = getattr(orig, "failed_pragma", None)
            if pragma is not None:      # connected: the URL is right, the file is not usable
                return DatabaseUnavailable(f"PRAGMA {pragma} failed on the database at {url} "
                                           f"while connecting: {reason}{_pragma_fix(orig)}")
            return DatabaseUnavailable(f"cannot connect to the database at {url}: {reason}; {URL_FIX}")
        e = e.__cause__ or e.__context__
    return None


_USER = "writable by the user running oscar-zoo"

# What to do about a PRAGMA SQLite refused, by its extended result code, else its primary one
_PRAGMA_FIXES = {
    sqlite3.SQLITE_READONLY_DIRECTORY: f"make the database's directory {_USER}: SQLite makes "
                                       "its -wal and -shm files there",
    sqlite3.SQLITE_READONLY: f"make the database file and its directory {_USER}: the registry "
                             "writes to the file, and SQLite makes its -wal and -shm files "
                             "beside it",
    sqlite3.SQLITE_BUSY: "another process holds a lock on the database (a long write, a backup, "
                         "an open sqlite3 shell): let it finish or stop it, then retry",
    sqlite3.SQLITE_NOTADB: "point OSCAR_ZOO_DATABASE_URL at the registry's SQLite database, or "
                           "move that file aside for a new one to be made there",
}


def _pragma_fix(e: BaseException) -> str:
    """"; to fix: ..." for a PRAGMA SQLite refused, where its result code says what to do."""
    code = getattr(e, "sqlite_errorcode", None)
    fix = None if code is None else _PRAGMA_FIXES.get(code) or _PRAGMA_FIXES.get(code & 0xFF)
    return f"; to fix: {fix}" if fix else ""


SQLITE_FULL = 13


@contextmanager
def _full_disk_told() -> Iterator[None]:
    """A database that cannot grow (SQLite's SQLITE_FULL, PostgreSQL's disk_full, 53100) as
    StorageFull: left as a driver error, the API answered a bare 500."""
    try:
        yield
    except OperationalError as e:
        orig = _disk_full(e)
        if orig is None:
            raise
        raise StorageFull(
            f"out of disk space in the registry's database ({_first_line(orig)}); the change "
            "was rolled back. To fix: the registry's operator frees space where the database "
            "keeps its files (for SQLite, the data dir: OSCAR_ZOO_DATA_DIR, where `oscar-zoo db "
            "gc` removes the blobs no version references); then send it again") from e


def _disk_full(e: BaseException | None) -> BaseException | None:
    """The driver's disk-full error behind e, if any. SQLite rolls the whole transaction back on
    SQLITE_FULL, so the error that surfaces may be SQLAlchemy's failed ROLLBACK TO SAVEPOINT,
    raised while handling it."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        orig = getattr(e, "orig", e)
        if getattr(orig, "sqlite_errorcode", None) == SQLITE_FULL \
                or getattr(orig, "sqlstate", None) == "53100":
            return orig
        e = e.__cause__ or e.__context__
    return None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def _sqlite_engine(url: str) -> Engine:
    parsed = make_url(url)
    path, query = parsed.database, parsed.query
    uri = str(query.get("uri", "")).lower() in ("true", "1")
    # a URI filename (file:...?uri=true) is the user's to have made: its "parent" would be a
    # stray file: directory in the working directory
    if path and path != ":memory:" and not uri:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    # opened read-only (a snapshot to browse): WAL and synchronous would write, and fail
    read_only = uri and (query.get("mode") == "ro" or str(query.get("immutable")) == "1")
    engine = create_engine(url, connect_args={"check_same_thread": False,
                                              "timeout": SQLITE_BUSY_MS / 1000},
                           pool_size=16, max_overflow=48)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        # Let SQLAlchemy, not the sqlite3 module, decide when a transaction begins.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        if not read_only:
            _pragma(cur, "journal_mode=WAL")
        _pragma(cur, "foreign_keys=ON")
        _pragma(cur, f"busy_timeout={SQLITE_BUSY_MS}")
        if not read_only:
            _pragma(cur, "synchronous=NORMAL")  # durable with WAL except on power loss
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        immediate = conn.get_execution_options().get("sqlite_immediate")
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _pragma(cur, setting: str) -> None:
    """PRAGMA <setting>. One SQLite refuses (a read-only file or directory, a lock held, a file
    that is no database) keeps which it was: SQLAlchemy raises it as a failure to connect, and
    connect_failure says the connection was made but this PRAGMA failed, and why."""
    try:
        cur.execute(f"PRAGMA {setting}")
    except sqlite3.Error as e:
        e.failed_pragma = setting
        e.add_note(f"while running PRAGMA {setting} on a new connection")   # for the server's log
        raise


def _server_engine(url: str) -> Engine:
    return create_engine(url, pool_size=16, max_overflow=48, pool_pre_ping=True)
