"""Fresh registry databases for tests: a SQLite file, or a PostgreSQL schema of its own.

    with fresh_database("postgresql", tmp_path) as url: ...

PostgreSQL: a uniquely named schema in the `test` database (OSCAR_ZOO_TEST_POSTGRES_URL
overrides the server), selected through the URL's search_path and dropped afterwards, so
parallel tests and test runs never see each other's rows.
"""

from __future__ import annotations

import functools
import os
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

BACKENDS = ("sqlite", "postgresql")
POSTGRES_URL = os.environ.get("OSCAR_ZOO_TEST_POSTGRES_URL",
                              "postgresql://postgres@127.0.0.1:5432/test")


@functools.lru_cache(maxsize=1)
def postgres_unavailable() -> str | None:
    """Why PostgreSQL tests cannot run here, or None when they can."""
    try:
        import psycopg

        with psycopg.connect(POSTGRES_URL, connect_timeout=3) as conn:
            conn.execute("select 1")
    except Exception as e:  # any failure means: skip, and say why
        return f"PostgreSQL at {POSTGRES_URL} is unreachable ({type(e).__name__}: {e})"
    return None


@contextmanager
def fresh_database(backend: str, tmp_path: Path) -> Iterator[str]:
    """A SQLAlchemy URL of an empty database; PostgreSQL schemas are dropped on exit."""
    if backend == "sqlite":
        yield f"sqlite:///{Path(tmp_path) / f'registry-{uuid.uuid4().hex[:8]}.sqlite'}"
        return
    import psycopg

    schema = f"oz_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'create schema "{schema}"')
    sep = "&" if "?" in POSTGRES_URL else "?"
    try:
        yield f"{POSTGRES_URL}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            conn.execute(f'drop schema if exists "{schema}" cascade')
