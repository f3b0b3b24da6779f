"""API test fixtures: a client holding a publish token, and a snapshot of the database and blob
store so a rejected request can be shown to change nothing."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from oscar_zoo.registry_db import models as orm

TABLES = [orm.Model, orm.BundleVersion, orm.VersionFile, orm.LayerIndex, orm.Alias,
          orm.AliasEvent, orm.ApiToken, orm.AuditEvent, orm.Job, orm.MirrorRecord]


def take_snapshot(server) -> dict:
    """Row counts of every table, the stored blobs, and anything left in the staging dir."""
    with server.registry.db.read() as session:
        rows = {t.__tablename__: session.scalar(select(func.count()).select_from(t)) for t in TABLES}
    staging = server.data_dir / "staging"
    return {"rows": rows, "blobs": sorted(p.name for p in server.registry.blobs.root.iterdir()),
            "staging": sorted(p.name for p in staging.iterdir()) if staging.exists() else []}


@pytest.fixture
def snapshot():
    return take_snapshot


@pytest.fixture
def publisher(registry_server):
    """(server, httpx client holding a bundles:publish token)."""
    with registry_server.client(registry_server.token("bundles:publish", name="pub")) as http:
        yield registry_server, http
