"""Keep the models table in step with zoo.catalog: insert new entries, update changed ones.

Runs at every start, so a new release's catalog meets rows users made: a model uploaded under
its own name keeps its row (the catalog's names become its aliases), and a catalog entry never
overwrites an uploaded model that happens to share its name. Either case is logged, not fatal.
"""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..zoo.catalog import CATALOG, CatalogEntry
from .models import Model

log = logging.getLogger("oscar_zoo.registry")


def catalog_row(entry: CatalogEntry) -> dict:
    aliases = sorted(set(entry.names) - {entry.name.lower(), entry.hub_id.lower()})
    return dict(name=entry.name.lower(), hub_id=entry.hub_id, hub_id_lower=entry.hub_id.lower(),
                architecture=entry.architecture, aliases=aliases,
                geometry=entry.geometry.to_dict(), geometry_verified=entry.geometry_verified,
                source="catalog")


def seed_catalog(session: Session) -> int:
    """Upsert every catalog entry; returns how many rows were inserted or updated."""
    rows = list(session.scalars(select(Model)))
    by_name = {m.name: m for m in rows}
    by_hub = {m.hub_id_lower: m for m in rows}
    changed = 0
    for entry in CATALOG:
        values = catalog_row(entry)
        named, same_hub = by_name.get(values["name"]), by_hub.get(values["hub_id_lower"])
        if named is not None and named.source != "catalog":
            log.warning("catalog model %s is not seeded: an uploaded model has that name (hub id "
                        "%s); rename one of them to use both", values["name"], named.hub_id)
            continue
        if named is None and same_hub is not None:
            changed += _adopt(same_hub, values)
            continue
        if named is not None and same_hub not in (None, named):
            log.warning("catalog model %s keeps hub id %s: %s already has %s", values["name"],
                        named.hub_id, same_hub.name, values["hub_id"])
            continue
        if named is None:
            session.add(Model(**values))
        elif any(getattr(named, k) != v for k, v in values.items()):
            for key, value in values.items():
                setattr(named, key, value)
        else:
            continue
        changed += 1
    return changed


def _adopt(row: Model, values: dict) -> int:
    """A row with the entry's hub id under another name: a catalog entry renamed since (the row
    takes the new name, the old one stays an alias), or a model users uploaded before the
    catalog knew it (it keeps its name and rows; the catalog's names become aliases)."""
    if row.source == "catalog":
        old = row.name
        for key, value in values.items():
            setattr(row, key, value)
        row.aliases = sorted({*values["aliases"], old})
        return 1
    names = sorted({*(row.aliases or ()), values["name"], *values["aliases"]})
    if names == sorted(row.aliases or ()):
        return 0
    row.aliases = names
    log.info("catalog model %s is the uploaded model %s (hub id %s): its names are now aliases "
             "of %s", values["name"], row.name, row.hub_id, row.name)
    return 1
