"""`registry`: a registry on the test's database (SQLite, then PostgreSQL) in a temp data dir."""

from __future__ import annotations

import pytest

from oscar_zoo.registry_db.registry import open_registry


@pytest.fixture
def registry(registry_db_url, tmp_path):
    reg = open_registry(registry_db_url, tmp_path / "data")
    yield reg
    reg.close()
