"""Keep the models table in step with zoo.catalog: insert new entries, update changed ones."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..zoo.catalog import CATALOG, CatalogEntry
from .models import Model


def catalog_row(entry: CatalogEntry) -> dict:
    aliases = sorted(set(entry.names) - {entry.name.lower(), entry.hub_id.lower()})
    return dict(name=entry.name.lower(), hub_id=entry.hub_id, hub_id_lower=entry.hub_id.lower(),
                architecture=entry.architecture, aliases=aliases,
                geometry=entry.geometry.to_dict(), geometry_verified=entry.geometry_verified,
                source="catalog")


def seed_catalog(session: Session) -> int:
    """Upsert every catalog entry; returns how many rows were inserted or updated."""
    existing = {m.name: m for m in session.scalars(select(Model))}
    changed = 0
    for entry in CATALOG:
        values = catalog_row(entry)
        row = existing.get(values["name"])
        if row is None:
            session.add(Model(**values))
        elif any(getattr(row, k) != v for k, v in values.items()):
            for key, value in values.items():
                setattr(row, key, value)
        else:
            continue
        changed += 1
    return changed
