"""Read queries the web UI needs beyond queries.py: filter choices, each model's headline
version, its versions by status, the validated filter, what a job's bundle was calibrated on,
whether a version's source_job is a job here, which names are models, and the orders the UI's
tables sort by.

Everything here composes queries.py (same resolution, same filters, same pagination cursors),
so a page and the JSON API never disagree about what exists. The default orders (models by
name, versions newest first) are queries.py's own, cursors included; the others are sorted and
paged by the database too, one query a page, whatever the number of models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable

from sqlalchemy import ColumnElement, Select, and_, func, or_, select
from sqlalchemy.orm import Session, aliased, defer, raiseload

from ..zoo.errors import InvalidInput
from . import queries
from .models import Alias, BundleVersion, Job, Model, extra_loss  # noqa: F401 (pages read it here)

HEADLINE = ("recommended", "latest")   # the version a page summarises: recommended, else latest


def architectures(session: Session) -> list[str]:
    """Distinct architectures of known models, for the home page's filter."""
    return list(session.scalars(select(Model.architecture).distinct()
                                .where(Model.architecture.is_not(None)).order_by(Model.architecture)))


def headline_versions(session: Session, model_ids: list[int]) -> dict[int, BundleVersion]:
    """model id -> the version `recommended` points at, else `latest` (models with neither are
    absent). Loaded for summaries: manifest, files and model are not loaded (raise if used)."""
    if not model_ids:
        return {}
    # A list needs the summary columns only: not the manifest, not the file rows.
    rows = session.execute(select(Alias.model_id, Alias.name, BundleVersion)
                           .join(BundleVersion, Alias.version_id == BundleVersion.id)
                           .where(Alias.model_id.in_(model_ids), Alias.name.in_(HEADLINE))
                           .options(defer(BundleVersion.manifest, raiseload=True),
                                    raiseload(BundleVersion.files), raiseload(BundleVersion.model)))
    out: dict[int, BundleVersion] = {}
    for model_id, alias, version in sorted(rows, key=lambda r: HEADLINE.index(r[1])):
        out.setdefault(model_id, version)
    return out


def status_counts(session: Session, model_ids: list[int]) -> dict[int, dict[str, int]]:
    """model id -> {status: number of versions}: the home page counts published versions apart
    from drafts and yanked ones, which a bare pull never gets."""
    out: dict[int, dict[str, int]] = {i: {} for i in model_ids}
    if not model_ids:
        return out
    rows = session.execute(select(BundleVersion.model_id, BundleVersion.status, func.count())
                           .where(BundleVersion.model_id.in_(model_ids))
                           .group_by(BundleVersion.model_id, BundleVersion.status))
    for model_id, status, count in rows:
        out[model_id][status] = count
    return out


def calibrated_on(session: Session, version_id: int | None) -> str | None:
    """The hardware a job's bundle records it was calibrated on ("1 x NVIDIA H100 80GB HBM3",
    "cpu (x86_64, 2 cores)"), None if unknown: a job's `gpus` is only what it asked for."""
    if version_id is None:
        return None
    manifest = session.scalar(select(BundleVersion.manifest).where(BundleVersion.id == version_id))
    return ((manifest or {}).get("calibration") or {}).get("hardware")


def job_exists(session: Session, job_id: str | None) -> bool:
    """Whether `job_id` names a job: a version's source_job is free text when uploaded."""
    return bool(job_id) and session.scalar(select(Job.id).where(Job.id == job_id)) is not None


def known_models(session: Session, names: list[str | None]) -> set[str]:
    """The names that are models here: a job is filed under the name it was submitted with,
    which for a hub id nobody has published yet is no model's (its page would be a 404)."""
    names = sorted({n for n in names if n})
    if not names:
        return set()
    return set(session.scalars(select(Model.name).where(Model.name.in_(names))))


def last_published(session: Session, model_ids: list[int]) -> dict[int, datetime]:
    """model id -> when its newest published version was uploaded (absent: none is published;
    drafts and yanked versions are not what a pull gets, so they do not count)."""
    if not model_ids:
        return {}
    rows = session.execute(select(BundleVersion.model_id, func.max(BundleVersion.created_at))
                           .where(BundleVersion.model_id.in_(model_ids),
                                  BundleVersion.status == "published")
                           .group_by(BundleVersion.model_id))
    return {model_id: at for model_id, at in rows if at is not None}


# --- sorted lists ----------------------------------------------------------------------------
# A sort is COLUMN (ascending) or -COLUMN (descending); the page checks it against its
# whitelist. Rows without a value (no published version, no validation report) come last in
# either direction, and ties keep a fixed order (by name; versions newest first), so the cursor,
# [sort, value, tie] of the last row shown, names one place in the order: the next page starts
# after it even when rows were added since. The database sorts, compares names (its collation
# decides both the order and where a page starts) and pages: ORDER BY (value IS NULL), value,
# tie with a keyset WHERE and a LIMIT, so a page costs the same whatever the number of rows.

@dataclass(frozen=True)
class _Order:
    value: ColumnElement            # what the rows sort by
    nullable: bool                  # rows may have no value: they come last either way
    load: Callable[[Any], Any]      # the value a cursor holds -> the one to compare with
    dump: Callable[[Any], Any]      # a row's value -> the one a cursor holds


def _text(value: Any) -> str:
    # PostgreSQL text holds no NUL: a comparison with one would be a 500, not a 422
    if not isinstance(value, str) or "\x00" in value:
        raise ValueError(value)
    return value


def _whole(bits: int) -> Callable[[Any], int]:
    def load(value: Any) -> int:
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < 2 ** bits:
            raise ValueError(value)     # past the column's range: PostgreSQL would error
        return value
    return load


def _real(value: Any) -> float:
    # json.loads takes NaN and Infinity: no row compares with them as the order needs, so a
    # page after one would skip rows in silence
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (
            isinstance(value, int) and not -2 ** 63 < value < 2 ** 63) or not math.isfinite(value):
        raise ValueError(value)
    return float(value)


def _time(value: Any) -> datetime:
    at = datetime.fromisoformat(_text(value))
    if at.tzinfo is None:
        raise ValueError(value)
    return at.astimezone(timezone.utc)      # out of range (year 1 at +05:00): raises here, not in SQL


def _iso(at: datetime) -> str:
    return at.isoformat()


def _same(value: Any) -> Any:
    return value


def _after(cursor: str | None, sort: str, order: _Order, tie: Callable[[Any], Any]) -> tuple | None:
    """The (value, tie) a cursor of this sort holds. Raises InvalidInput for any other."""
    after = queries.decode_cursor(cursor, list)
    if after is None:
        return None
    try:
        if len(after) != 3 or after[0] != sort or (after[1] is None and not order.nullable):
            raise ValueError(after)
        return (None if after[1] is None else order.load(after[1])), tie(after[2])
    except (ValueError, OverflowError):
        raise InvalidInput("invalid cursor: pass the next_cursor of a previous page unchanged "
                           "(a cursor belongs to the sort it was made with)") from None


def _sorted(session: Session, stmt: Select, sort: str, order: _Order, tie: ColumnElement,
            tie_descending: bool, after: tuple | None, limit: int) -> queries.Page:
    """The page of `stmt` (selecting the item, then order.value and `tie`) that follows the
    cursor's place `after`, in the order `sort` names."""
    value, descending = order.value, sort.startswith("-")
    nulls_last = [value.is_(None)] if order.nullable else []
    stmt = stmt.order_by(*nulls_last, value.desc() if descending else value,
                         tie.desc() if tie_descending else tie).limit(limit + 1)
    if after is not None:
        at, last = after
        past_tie = tie < last if tie_descending else tie > last
        if at is None:
            stmt = stmt.where(value.is_(None), past_tie)
        else:
            past = or_(value < at if descending else value > at, and_(value == at, past_tie))
            stmt = stmt.where(or_(value.is_(None), past) if order.nullable else past)
    rows = session.execute(stmt).all()
    more = len(rows) > limit
    rows = rows[:limit]
    cursor = None
    if more:
        _, at, last = rows[-1]
        cursor = queries.encode_cursor([sort, None if at is None else order.dump(at), last])
    return queries.Page([r[0] for r in rows], cursor)


def _headline_of(stmt: Select) -> tuple[Select, Any]:
    """`stmt` (over Model) joined to each model's headline version (headline_versions': the
    version `recommended` points at, else `latest`'s; none: NULL columns), and that version."""
    recommended, latest, head = aliased(Alias), aliased(Alias), aliased(BundleVersion)
    stmt = (stmt.outerjoin(recommended, and_(recommended.model_id == Model.id,
                                             recommended.name == HEADLINE[0]))
            .outerjoin(latest, and_(latest.model_id == Model.id, latest.name == HEADLINE[1]))
            .outerjoin(head, head.id == func.coalesce(recommended.version_id, latest.version_id)))
    return stmt, head


def _published() -> Any:
    """Per model with a published version: `at`, the newest one's upload time, and `n`, how
    many are published (drafts and yanked versions are not what a pull gets)."""
    return (select(BundleVersion.model_id, func.max(BundleVersion.created_at).label("at"),
                   func.count().label("n"))
            .where(BundleVersion.status == "published").group_by(BundleVersion.model_id)
            .subquery("published"))


def sorted_models(session: Session, q: str | None, architecture: str | None, validated: bool,
                  sort: str = "name", limit: int = 50, cursor: str | None = None) -> queries.Page:
    """The home page's models: list_models' filters and, with `validated`, only the models
    whose headline version passed validation (the version the row shows, and the one
    `oscar-zoo list --validated` checks: queries.model_stats' validation_passed), not those
    where only an older one did. In the order `sort` names (COLUMN or -COLUMN, descending):
    name; published: the newest published version's upload time; versions: how many are
    published; loss: the extra loss of the headline version.

    "name" is list_models' own order and cursor (the last name shown), which GET /v1/models
    takes too. Raises InvalidInput for a bad cursor."""
    queries.check_limit(limit)
    if sort == "name" and not validated:
        return queries.list_models(session, q, architecture, False, limit, cursor)
    column = sort.lstrip("-")
    if column not in ("name", "published", "versions", "loss"):
        raise ValueError(f"unknown model sort {sort!r}")
    stmt, head = select(Model), None
    if validated or column == "loss":
        stmt, head = _headline_of(stmt)
    stmt = stmt.where(*queries.model_filters(q, architecture, published=validated))
    if validated:   # the headline version passed: not an older one; no report is not a pass
        stmt = stmt.where(head.validation_passed.is_(True))
    if sort == "name":
        after = queries.decode_cursor(cursor, str)
        stmt = stmt.order_by(Model.name).limit(limit + 1)
        rows = list(session.scalars(stmt if after is None else stmt.where(Model.name > after)))
        more = len(rows) > limit
        rows = rows[:limit]
        return queries.Page(rows, queries.encode_cursor(rows[-1].name) if more else None)
    if column == "name":
        order = _Order(Model.name, False, _text, _same)
    elif column == "loss":
        order = _Order(head.extra_loss, True, _real, _same)
    else:
        published = _published()
        stmt = stmt.outerjoin(published, published.c.model_id == Model.id)
        order = (_Order(published.c.at, True, _time, _iso) if column == "published" else
                 _Order(func.coalesce(published.c.n, 0), False, _whole(63), _same))
    after = _after(cursor, sort, order, _text)
    return _sorted(session, stmt.add_columns(order.value, Model.name), sort, order, Model.name,
                   False, after, limit)


_VERSION_ORDERS = {"version": _Order(BundleVersion.number, False, _whole(31), _same),
                   "created": _Order(BundleVersion.created_at, False, _time, _iso),
                   "size": _Order(BundleVersion.size, False, _whole(63), _same),
                   "loss": _Order(BundleVersion.extra_loss, True, _real, _same)}


def sorted_versions(session: Session, model: Model, sort: str = "-version", limit: int = 50,
                    cursor: str | None = None) -> queries.Page:
    """A model's versions in the order `sort` names (COLUMN or -COLUMN, descending): version
    number, created (upload time), size, loss (the bundle's extra loss over BF16); ties newest
    first. "-version" is list_versions' own order and cursor. Loaded for summaries (the
    manifest and files are not). Raises InvalidInput for a bad cursor."""
    queries.check_limit(limit)
    if sort == "-version":
        return queries.list_versions(session, model, None, limit, cursor)
    order = _VERSION_ORDERS[sort.lstrip("-")]
    after = _after(cursor, sort, order, _whole(31))
    stmt = (select(BundleVersion, order.value, BundleVersion.number)
            .where(BundleVersion.model_id == model.id)
            .options(defer(BundleVersion.manifest, raiseload=True), raiseload(BundleVersion.files)))
    return _sorted(session, stmt, sort, order, BundleVersion.number, True, after, limit)
