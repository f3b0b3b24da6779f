"""Read queries: resolve names, refs and layers; list with stable keyset pagination."""

from __future__ import annotations

import base64
import difflib
import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import exists, func, select
from sqlalchemy.orm import Session

from ..zoo import catalog
from ..zoo.errors import (AliasNotFound, InvalidInput, LayerNotFound, ModelNotFound,
                          VersionNotFound)
from .models import Alias, AliasEvent, BundleVersion, LayerIndex, MirrorRecord, Model

MAX_LIMIT = 200


# --- pagination ------------------------------------------------------------------------------

def encode_cursor(value: Any) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")


def decode_cursor(cursor: str | None, kind: type) -> Any:
    """The value a cursor was made from. Raises InvalidInput for one this API did not hand out."""
    if not cursor:
        return None
    try:
        value = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except Exception:
        value = None
    if not isinstance(value, kind) or isinstance(value, bool) or (
            isinstance(value, str) and "\x00" in value) or (
            isinstance(value, int) and not 0 <= value < 2**63):
        raise InvalidInput("invalid cursor: pass the next_cursor of a previous page unchanged")
    return value


def check_text(value: str | None, what: str) -> str | None:
    """Refuse NUL characters, which PostgreSQL text cannot hold. Raises InvalidInput."""
    if value is not None and "\x00" in value:
        raise InvalidInput(f"{what} may not contain NUL characters")
    return value


def check_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidInput(f"limit must be between 1 and {MAX_LIMIT}")
    return limit


@dataclass
class Page:
    items: list
    next_cursor: str | None


# --- models ----------------------------------------------------------------------------------

def resolve_model(session: Session, name: str) -> Model:
    """A model by catalog name, alias or hub id (any case; `org--repo` also names `org/repo`).

    Raises ModelNotFound with close matches from the catalog and the database.
    """
    key = name.strip().lower()
    if "\x00" in key:
        raise ModelNotFound(f"unknown model {name!r}.")
    # In a fixed order, so that every process and replica agrees: a name before a hub id,
    # the key as typed before its `org--repo` reading.
    candidates = list(dict.fromkeys([key, key.replace("--", "/")])) if key else []
    for k in candidates:
        for column in (Model.name, Model.hub_id_lower):
            row = session.scalar(select(Model).where(column == k))
            if row is not None:
                return row
    for row in session.scalars(select(Model).order_by(Model.id)):
        if set(candidates) & set(row.aliases or ()) or key == row.hub_id_lower.split("/")[-1]:
            return row
    raise ModelNotFound(f"unknown model {name!r}.", suggestions=suggest_models(session, name))


def suggest_models(session: Session, name: str, n: int = 3) -> list[str]:
    names = list(session.scalars(select(Model.name)))
    out = catalog.suggest(name, n)
    for close in difflib.get_close_matches(name.strip().lower(), names, n=n, cutoff=0.5):
        if close not in out:
            out.append(close)
    return out[:n]


def glob_to_like(pattern: str) -> str:
    """Shell glob (* ?) to SQL LIKE with backslash escapes; a bare word matches as a substring."""
    pattern = check_text(pattern, "q").strip().lower()
    if not any(c in pattern for c in "*?"):
        pattern = f"*{pattern}*"
    out = []
    for c in pattern:
        out.append({"*": "%", "?": "_", "%": r"\%", "_": r"\_", "\\": "\\\\"}.get(c, c))
    return "".join(out)


def model_filters(q: str | None = None, architecture: str | None = None,
                  published: bool = False) -> list:
    """list_models' filters as WHERE clauses on Model, for other lists of models to share.
    Raises InvalidInput (NUL characters)."""
    where = []
    if q:
        like = glob_to_like(q)
        where.append(Model.name.like(like, escape="\\") | Model.hub_id_lower.like(like, escape="\\"))
    if architecture:
        check_text(architecture, "architecture")
        where.append(func.lower(Model.architecture) == architecture.strip().lower())
    if published:
        where.append(exists().where(BundleVersion.model_id == Model.id,
                                    BundleVersion.status == "published"))
    return where


def list_models(session: Session, q: str | None = None, architecture: str | None = None,
                published: bool = False, limit: int = 50, cursor: str | None = None) -> Page:
    """Models ordered by name; `q` is a glob over name and hub id."""
    limit, after = check_limit(limit), decode_cursor(cursor, str)
    stmt = (select(Model).where(*model_filters(q, architecture, published))
            .order_by(Model.name).limit(limit + 1))
    if after is not None:
        stmt = stmt.where(Model.name > after)
    rows = list(session.scalars(stmt))
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(rows, encode_cursor(rows[-1].name) if more else None)


def model_stats(session: Session, model_ids: list[int]) -> dict[int, dict]:
    """versions_count, latest_version, recommended_version and validation_passed (of the version
    a bare pull gets: recommended, else latest; None when it has no report) per model id."""
    stats = {i: {"versions_count": 0, "latest_version": None, "recommended_version": None,
                 "validation_passed": None} for i in model_ids}
    if not model_ids:
        return stats
    counts = session.execute(select(BundleVersion.model_id, func.count())
                             .where(BundleVersion.model_id.in_(model_ids))
                             .group_by(BundleVersion.model_id))
    for model_id, count in counts:
        stats[model_id]["versions_count"] = count
    pointed = session.execute(select(Alias.model_id, Alias.name, BundleVersion.number,
                                     BundleVersion.validation_passed)
                              .join(BundleVersion, Alias.version_id == BundleVersion.id)
                              .where(Alias.model_id.in_(model_ids),
                                     Alias.name.in_(("latest", "recommended"))))
    passed = {}
    for model_id, alias, number, ok in pointed:
        stats[model_id][f"{alias}_version"] = number
        passed[model_id, alias] = ok
    for model_id in model_ids:
        stats[model_id]["validation_passed"] = passed.get((model_id, "recommended"),
                                                          passed.get((model_id, "latest")))
    return stats


# --- versions --------------------------------------------------------------------------------

def _removed(session: Session, model: Model, ref: str) -> str:
    """Why an alias that once existed is gone (a deploy pinned to it asks exactly that)."""
    if not catalog.ALIAS_NAME.fullmatch(ref.lower()):
        return ""
    last = session.scalar(select(AliasEvent).where(AliasEvent.model_id == model.id,
                                                   AliasEvent.alias == ref.lower())
                          .order_by(AliasEvent.id.desc()).limit(1))
    if last is None or last.to_version_id is not None:
        return ""
    by = f" by {last.by}" if last.by else ""
    why = f" ({last.reason.strip().rstrip('.')})" if last.reason and last.reason.strip() else ""
    return f"; alias {ref.lower()!r} was removed {last.at:%Y-%m-%d %H:%M} UTC{by}{why}"


def names_a_number(ref: str | int) -> bool:
    """3 or v3 (V3: refs are compared in lower case): a version by number (immutable), not an
    alias (which moves)."""
    # the pattern, not catalog.version_number: int() refuses over 4,300 digits, which a URL can hold
    return catalog.VERSION_REF.fullmatch(str(ref).strip().lower()) is not None


def resolve_version(session: Session, model: Model, ref: str | int) -> BundleVersion:
    """A version by number or by alias (`latest`, `recommended`, user-defined).

    Raises VersionNotFound.
    """
    ref = str(ref).strip()
    if names_a_number(ref) and not ref.isdigit():
        ref = ref[1:]       # v3 is version 3, as pull reads NAME@v3 (no alias can be named so)
    if ref.isascii() and ref.isdigit():
        # int() of over 4,300 digits raises; no such number is a version anyway
        row = None if len(ref) > 10 or int(ref) >= 2**31 else session.scalar(
            select(BundleVersion).where(BundleVersion.model_id == model.id,
                                        BundleVersion.number == int(ref)))
    elif not catalog.ALIAS_NAME.fullmatch(ref.lower()):
        row = None  # no alias can have this name
    else:
        alias = session.scalar(select(Alias).where(Alias.model_id == model.id,
                                                   Alias.name == ref.lower()))
        row = alias.version if alias else None
    if row is None:
        newest = session.scalar(select(func.max(BundleVersion.number))
                                 .where(BundleVersion.model_id == model.id))
        known = sorted(alias_map(session, model))
        # one sentence, no closing period: clients join several sources' reasons with "; "
        if ref.isascii() and ref.isdigit():
            what = f"version {ref}"
        elif catalog.ALIAS_NAME.fullmatch(ref.lower()):
            what = f"alias {ref.lower()!r}"
        else:
            what = f"version or alias {ref!r}"
        span = "" if not newest else f"1 to {newest}" if newest > 1 else "1"
        hint = f"; its versions: {span}" if newest else "; it has no versions yet"
        hint += f"; aliases: {', '.join(known)}" if known else "; it has no aliases"
        raise VersionNotFound(f"{model.name} has no {what}{_removed(session, model, ref)}{hint}")
    return row


def list_versions(session: Session, model: Model, status: str | None = None, limit: int = 50,
                  cursor: str | None = None) -> Page:
    """Newest first."""
    limit, before = check_limit(limit), decode_cursor(cursor, int)
    if before is not None and before >= 2**31:  # past the 32-bit column: PostgreSQL errors
        raise InvalidInput("invalid cursor: pass the next_cursor of a previous page unchanged")
    stmt = (select(BundleVersion).where(BundleVersion.model_id == model.id)
            .order_by(BundleVersion.number.desc()).limit(limit + 1))
    if status:
        stmt = stmt.where(BundleVersion.status == status)
    if before is not None:
        stmt = stmt.where(BundleVersion.number < before)
    rows = list(session.scalars(stmt))
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(rows, encode_cursor(rows[-1].number) if more else None)


def alias_map(session: Session, model: Model) -> dict[str, int]:
    """alias -> version number, for one model."""
    rows = session.execute(select(Alias.name, BundleVersion.number)
                           .join(BundleVersion, Alias.version_id == BundleVersion.id)
                           .where(Alias.model_id == model.id).order_by(Alias.name))
    return dict(rows.all())


def aliases_of(session: Session, version_ids: list[int]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {i: [] for i in version_ids}
    if version_ids:
        rows = session.execute(select(Alias.version_id, Alias.name)
                               .where(Alias.version_id.in_(version_ids)).order_by(Alias.name))
        for version_id, name in rows:
            out[version_id].append(name)
    return out


def current_aliases(session: Session, model: Model) -> list[Alias]:
    return list(session.scalars(select(Alias).where(Alias.model_id == model.id).order_by(Alias.name)))


def alias_history(session: Session, model: Model, alias: str | None = None, limit: int = 50,
                  cursor: str | None = None) -> Page:
    """Alias moves, newest first; each item is (event, from_number, to_number)."""
    limit, before = check_limit(limit), decode_cursor(cursor, int)
    if alias is not None and not session.scalar(
            select(exists().where(AliasEvent.model_id == model.id, AliasEvent.alias == alias))):
        raise AliasNotFound(f"{model.name} has never had an alias {alias!r}.")
    numbers = {v: n for v, n in session.execute(
        select(BundleVersion.id, BundleVersion.number).where(BundleVersion.model_id == model.id))}
    stmt = (select(AliasEvent).where(AliasEvent.model_id == model.id)
            .order_by(AliasEvent.id.desc()).limit(limit + 1))
    if alias is not None:
        stmt = stmt.where(AliasEvent.alias == alias)
    if before is not None:
        stmt = stmt.where(AliasEvent.id < before)
    rows = list(session.scalars(stmt))
    more = len(rows) > limit
    rows = rows[:limit]
    items = [(e, numbers.get(e.from_version_id), numbers.get(e.to_version_id)) for e in rows]
    return Page(items, encode_cursor(rows[-1].id) if more else None)


# --- layers and mirrors ----------------------------------------------------------------------

def layer_rows(session: Session, version: BundleVersion, layer: int, side: str | None = None,
               head: int | None = None) -> list[LayerIndex]:
    """Index rows of one layer (optionally one side / KV head), ordered by side then head.

    Raises LayerNotFound naming the layers and heads the version has.
    """
    stmt = (select(LayerIndex).where(LayerIndex.version_id == version.id, LayerIndex.layer == layer)
            .order_by(LayerIndex.side, LayerIndex.kv_head))
    if side:
        stmt = stmt.where(LayerIndex.side == side)
    rows = list(session.scalars(stmt))
    if not rows:
        raise LayerNotFound(f"version {version.number} has no layer {layer}; its layers are "
                            f"{_short(indexed_layers(session, version))}")
    if head is not None:
        heads = sorted({r.kv_head for r in rows})
        rows = [r for r in rows if r.kv_head == head]
        if not rows:
            raise LayerNotFound(f"layer {layer} has KV heads {heads[0]}..{heads[-1]}, not {head}")
    return rows


def index_rows(session: Session, version: BundleVersion) -> list[LayerIndex]:
    return list(session.scalars(select(LayerIndex).where(LayerIndex.version_id == version.id)
                                .order_by(LayerIndex.layer, LayerIndex.side, LayerIndex.kv_head)))


def indexed_layers(session: Session, version: BundleVersion) -> list[int]:
    return list(session.scalars(select(LayerIndex.layer).distinct()
                                .where(LayerIndex.version_id == version.id)
                                .order_by(LayerIndex.layer)))


def _short(ids: list[int]) -> str:
    return str(ids) if len(ids) <= 8 else f"{ids[0]}, {ids[1]}, ..., {ids[-1]} ({len(ids)} layers)"


def mirrors(session: Session, version: BundleVersion) -> list[MirrorRecord]:
    return list(session.scalars(select(MirrorRecord).where(MirrorRecord.version_id == version.id)
                                .order_by(MirrorRecord.id)))
