"""Engines and transactions for the registry database.

SQLite (the embedded default) gets WAL, foreign keys and a busy timeout, and one writer at a
time: write transactions take a process-wide lock and start with BEGIN IMMEDIATE, so a writer
never fails half-way when it upgrades a read lock (datasette funnels writes through one thread
for the same reason). PostgreSQL needs neither; it relies on row locks and unique constraints.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from ..zoo import settings
from ..zoo.errors import ConfigError

SQLITE_BUSY_MS = 30_000


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
        raise ConfigError(f"database URL {url!r} is not a SQLAlchemy URL "
                          "(e.g. sqlite:////path/registry.sqlite or postgresql://host/db)") from None
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


class Database:
    """One engine plus the two kinds of session the registry uses: read and write."""

    def __init__(self, url: str | None = None):
        self.url = normalize_url(url or default_url())
        self.is_sqlite = self.url.startswith("sqlite")
        self.engine = _sqlite_engine(self.url) if self.is_sqlite else _server_engine(self.url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._write_lock = threading.Lock() if self.is_sqlite else None

    @contextmanager
    def read(self) -> Iterator[Session]:
        with self._sessions() as session:
            yield session

    @contextmanager
    def write(self) -> Iterator[Session]:
        """A transaction that commits on clean exit and rolls back on error."""
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


def _sqlite_engine(url: str) -> Engine:
    path = make_url(url).database
    if path and path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(url, connect_args={"check_same_thread": False,
                                              "timeout": SQLITE_BUSY_MS / 1000},
                           pool_size=16, max_overflow=48)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        # Let SQLAlchemy, not the sqlite3 module, decide when a transaction begins.
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_MS}")
        cur.execute("PRAGMA synchronous=NORMAL")  # durable with WAL except on power loss
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        immediate = conn.get_execution_options().get("sqlite_immediate")
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def _server_engine(url: str) -> Engine:
    return create_engine(url, pool_size=16, max_overflow=48, pool_pre_ping=True)
