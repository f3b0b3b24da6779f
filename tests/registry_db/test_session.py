"""A PRAGMA SQLite refuses on a new connection (registry_db/session.py, _pragma) is told as what
it is: the database was reached, this PRAGMA failed, and why, with what to do, in one line; not
as a URL to check. Each case is a real condition SQLite meets: a file that is no database, a
lock another connection holds, a read-only file or directory (those two only for a user other
than root, whom file modes do not stop)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError

from oscar_zoo.registry_db import session as session_mod
from oscar_zoo.registry_db.session import Database, connect_failure
from oscar_zoo.zoo.cli.main import cli
from oscar_zoo.zoo.errors import DatabaseUnavailable

not_as_root = pytest.mark.skipif(os.geteuid() == 0, reason="root writes a read-only file or "
                             "directory all the same: no PRAGMA fails")


def _refused(url: str) -> DatabaseUnavailable:
    """What connect_failure makes of the error a first use of the database raises."""
    db = Database(url)
    try:
        with pytest.raises(DBAPIError) as e, db.read() as s:
            s.execute(text("select 1"))
    finally:
        db.dispose()
    told = connect_failure(e.value)
    assert isinstance(told, DatabaseUnavailable), e.value
    assert "\n" not in str(told)
    return told


def _rollback_journal_db(path: Path) -> None:
    """A database in SQLite's default journal mode, as a tool other than oscar-zoo makes it:
    setting WAL on it writes to the file."""
    conn = sqlite3.connect(path)
    conn.execute("create table t (x)")
    conn.commit()
    conn.close()


def test_a_file_that_is_no_database_names_the_pragma_and_what_to_do(tmp_path, monkeypatch):
    """It was "cannot connect to the database at ...: file is not a database; check
    OSCAR_ZOO_DATABASE_URL": the URL was right, the file is not a SQLite database."""
    where = tmp_path / "registry.sqlite"
    where.write_bytes(b"not a database, just text " * 40)
    told = str(_refused(f"sqlite:///{where}"))
    assert told == (f"PRAGMA journal_mode=WAL failed on the database at sqlite:///{where} while "
                    "connecting: file is not a database; to fix: point OSCAR_ZOO_DATABASE_URL at "
                    "the registry's SQLite database, or move that file aside for a new one to be "
                    "made there")
    # the CLI: one line, no traceback
    monkeypatch.setenv("OSCAR_ZOO_DATABASE_URL", f"sqlite:///{where}")
    result = CliRunner().invoke(cli, ["db", "upgrade"])
    assert result.exit_code == 1 and "Traceback" not in result.output + result.stderr
    assert result.stderr.strip().splitlines() == [f"Error: {told}"], result.stderr


def test_the_failed_pragma_is_in_the_servers_log_too(tmp_path):
    """The API answers a 500 that names no server path; the traceback it logs says which PRAGMA
    (the driver's error carries a note)."""
    where = tmp_path / "registry.sqlite"
    where.write_bytes(b"\x00" * 4096)
    db = Database(f"sqlite:///{where}")
    with pytest.raises(DBAPIError) as e, db.read() as s:
        s.execute(text("select 1"))
    db.dispose()
    orig = e.value.orig
    assert isinstance(orig, sqlite3.DatabaseError)
    assert orig.__notes__ == ["while running PRAGMA journal_mode=WAL on a new connection"]


def test_a_lock_another_connection_holds_says_to_wait_for_it(tmp_path, monkeypatch):
    """A sqlite3 shell (or a backup) holding the database exclusively: journal_mode waits out
    the busy timeout, then fails. The timeout shortened: the wait is not what is tested."""
    monkeypatch.setattr(session_mod, "SQLITE_BUSY_MS", 200)
    where = tmp_path / "registry.sqlite"
    _rollback_journal_db(where)
    holder = sqlite3.connect(where, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        told = str(_refused(f"sqlite:///{where}"))
    finally:
        holder.close()
    assert told.startswith(f"PRAGMA journal_mode=WAL failed on the database at sqlite:///{where} "
                           "while connecting: database is locked; to fix: another process holds "
                           "a lock on the database"), told
    assert "OSCAR_ZOO_DATABASE_URL" not in told
    assert _works(f"sqlite:///{where}")       # lock released: the same URL connects


@not_as_root
def test_a_read_only_file_says_to_make_it_writable(tmp_path):
    where = tmp_path / "registry.sqlite"
    _rollback_journal_db(where)
    where.chmod(0o444)
    told = str(_refused(f"sqlite:///{where}"))
    assert told == (f"PRAGMA journal_mode=WAL failed on the database at sqlite:///{where} while "
                    "connecting: attempt to write a readonly database; to fix: make the database "
                    "file and its directory writable by the user running oscar-zoo: the registry "
                    "writes to the file, and SQLite makes its -wal and -shm files beside it")


@not_as_root
def test_a_read_only_directory_says_to_make_it_writable(tmp_path):
    """The registry's own database (in WAL mode) in a directory that became read-only: SQLite
    cannot make its -shm file beside it."""
    folder = tmp_path / "data"
    url = f"sqlite:///{folder / 'registry.sqlite'}"
    assert _works(url)
    folder.chmod(0o555)
    try:
        told = str(_refused(url))
    finally:
        folder.chmod(0o755)
    assert told == (f"PRAGMA journal_mode=WAL failed on the database at {url} while connecting: "
                    "attempt to write a readonly database; to fix: make the database's directory "
                    "writable by the user running oscar-zoo: SQLite makes its -wal and -shm files "
                    "there")


def test_a_file_that_cannot_be_opened_is_still_a_connect_failure(tmp_path):
    """No PRAGMA ran: the URL is what to check, as before."""
    where = tmp_path / "registry.sqlite"
    where.mkdir()
    told = str(_refused(f"sqlite:///{where}"))
    assert told.startswith(f"cannot connect to the database at sqlite:///{where}: unable to open")
    assert "PRAGMA" not in told


def _works(url: str) -> bool:
    db = Database(url)
    try:
        with db.read() as s:
            return s.execute(text("select 1")).scalar() == 1
    finally:
        db.dispose()


def test_a_sqlite_uri_filename_makes_no_stray_directory(tmp_path, monkeypatch):
    """file:...?uri=true names the database as SQLite's URI; its text is not a path whose parent
    to create (that made a `file:` directory in the working directory)."""
    import sqlite3

    from sqlalchemy import text

    from oscar_zoo.registry_db.session import _sqlite_engine

    db = tmp_path / "made.sqlite"
    sqlite3.connect(db).close()
    monkeypatch.chdir(tmp_path)
    engine = _sqlite_engine(f"sqlite:///file:{db}?uri=true")
    with engine.connect() as conn:
        assert conn.execute(text("select 1")).scalar() == 1
    engine.dispose()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("made.sqlite")) == []


def test_a_read_only_sqlite_uri_connects_and_reads(tmp_path):
    """mode=ro: the registry browses a snapshot; the PRAGMAs that write (WAL, synchronous)
    would refuse every connection, and their fix hint would undo the user's choice."""
    import sqlite3

    from sqlalchemy import text

    from oscar_zoo.registry_db.session import _sqlite_engine

    db = tmp_path / "snap.sqlite"
    con = sqlite3.connect(db)
    con.execute("create table t (x)")
    con.execute("insert into t values (7)")
    con.commit()
    con.close()
    engine = _sqlite_engine(f"sqlite:///file:{db}?mode=ro&uri=true")
    with engine.connect() as conn:
        assert conn.execute(text("select x from t")).scalar() == 7
    engine.dispose()
