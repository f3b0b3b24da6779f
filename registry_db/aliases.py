"""Aliases: mutable names for versions (`latest`, `recommended`, user-defined), every move kept.

`latest` is maintained by the registry (the highest published version); every other alias is
moved by people. Each move appends an AliasEvent in the same transaction (MLflow keeps none:
mlflow#2169).
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError as DBIntegrityError
from sqlalchemy.orm import Session, lazyload

from ..zoo.catalog import ALIAS_NAME, ALIAS_RULE, STORED_ALIAS
from ..zoo.errors import Conflict, InvalidInput
from . import audit
from .models import Alias, AliasEvent, BundleVersion, Model

LATEST = "latest"


def check_alias_name(name: str, stored: bool = False) -> str:
    """Raises InvalidInput unless the name is a lower-case word that cannot be a version number.
    stored: an alias to read or remove, which may predate the rule against v<N> and rotationzoo*
    names (catalog.STORED_ALIAS): such an alias would otherwise block every yank of its version
    and could never be removed."""
    if not (STORED_ALIAS if stored else ALIAS_NAME).fullmatch(name or ""):
        raise InvalidInput(f"alias {name!r} is not valid: {ALIAS_RULE}")
    return name


def move_alias(session: Session, model: Model, name: str, version: BundleVersion | None,
               by: str | None, reason: str | None = None, _system: bool = False) -> bool:
    """Point alias `name` of `model` at `version` (None removes it); returns False if unchanged.

    Raises InvalidInput for a bad name or for `latest` (unless the registry itself moves it),
    Conflict for a version that is not published.
    """
    check_alias_name(name, stored=version is None)
    if name == LATEST and not _system:
        raise InvalidInput("`latest` always points at the newest published version and moves by "
                           "itself: it cannot be set or removed; use `recommended` or your own "
                           "alias to pin a version")
    if version is not None and version.model_id != model.id:
        raise InvalidInput(f"version {version.number} belongs to another model")
    if version is not None and not _system:
        _lock_status(session, version)
    lock_model(session, model)
    if version is not None and version.status != "published":
        raise Conflict(f"version {version.number} is {_unaliasable(model, version)}; aliases "
                       "point at published versions only")
    now = datetime.now(timezone.utc)
    new = version.id if version else None
    row = _alias_row(session, model, name)
    if row is None and new is not None and not _created(session, model, name, new, now, by):
        row = _alias_row(session, model, name)   # a concurrent move created it first: move that
        if row is None:
            raise Conflict(f"alias {name!r} of {model.name} changed during this move; retry")
    old = row.version_id if row else None
    if old == new:
        return False
    if row is not None and new is None:
        session.delete(row)
    elif row is not None:
        row.version_id, row.updated_at, row.updated_by = new, now, by
    session.add(AliasEvent(model_id=model.id, alias=name, from_version_id=old, to_version_id=new,
                           at=now, by=by, reason=reason))
    audit.record(session, by, "alias.move", f"{model.name}@{name}",
                 version=version.number if version else None, reason=reason)
    session.flush()
    return True


def _unaliasable(model: Model, version: BundleVersion) -> str:
    """Why `version` (not published) takes no alias, and what to do instead."""
    if version.status == "draft":
        return (f"a draft: publish it first (`oscar-zoo promote {model.name}@{version.number}`, "
                f"POST .../versions/{version.number}/publish)")
    return f"yanked ({version.yank_reason}): point the alias at another version"


def lock_model(session: Session, model: Model) -> None:
    """The model row, FOR UPDATE: every writer takes it before any alias row. Publishing holds
    it while it moves aliases, so an alias move that took the alias row first (its event then
    waiting on the model) deadlocked with a job's result (PostgreSQL); and a yank reading which
    aliases to remove is ordered after a move in flight instead of removing what it re-pointed."""
    session.execute(select(Model.id).where(Model.id == model.id).with_for_update())


def _alias_row(session: Session, model: Model, name: str) -> Alias | None:
    return session.scalar(select(Alias).options(lazyload("*"))
                          .where(Alias.model_id == model.id, Alias.name == name).with_for_update())


def _created(session: Session, model: Model, name: str, version_id: int, now, by) -> bool:
    """Insert the alias row; False when a concurrent move inserted it first (PostgreSQL: FOR
    UPDATE locks no row that does not exist yet, so both moves got here)."""
    try:
        with session.begin_nested():
            session.add(Alias(model_id=model.id, name=name, version_id=version_id, updated_at=now,
                              updated_by=by))
        return True
    except DBIntegrityError:
        return False


def _lock_status(session: Session, version: BundleVersion) -> None:
    # The status was read without a lock: a yank committed since would be missed and the alias
    # would point at a yanked version (PostgreSQL; SQLite has one writer). FOR SHARE waits for a
    # yank in flight and holds off a later one until this move commits. `latest` skips this: it
    # is moved under the model lock after every status change (refresh_latest), which orders it,
    # and a yank holding its version's lock while waiting for the model lock would deadlock here.
    session.execute(select(BundleVersion.id).where(BundleVersion.id == version.id)
                    .with_for_update(read=True))
    session.refresh(version)


def refresh_latest(session: Session, model: Model, by: str | None, reason: str) -> None:
    """Point `latest` at the highest published version (or remove it when there is none)."""
    # The model row lock (publish takes it too) orders this after a concurrent publish's
    # commit; otherwise a yank could compute `newest` without it and move `latest` back.
    lock_model(session, model)
    newest = session.scalar(select(BundleVersion)
                            .where(BundleVersion.model_id == model.id,
                                   BundleVersion.status == "published")
                            .order_by(BundleVersion.number.desc()).limit(1))
    move_alias(session, model, LATEST, newest, by, reason, _system=True)
