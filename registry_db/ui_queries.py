"""Read queries the web UI needs beyond queries.py: filter choices, each model's headline
version, its versions by status, the validated filter, what a job's bundle was calibrated on,
whether a version's source_job is a job here, which names are models, and the orders the UI's
tables sort by.

Everything here composes queries.py (same resolution, same pagination cursors), so a page and
the JSON API never disagree about what exists. The default orders (models by name, versions
newest first) are queries.py's own, cursors included; the others sort what those queries find.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from functools import total_ordering
from typing import Any, Callable

from sqlalchemy import func, select
from sqlalchemy.orm import Session, defer, raiseload

from ..zoo.errors import InvalidInput
from . import queries
from .models import Alias, BundleVersion, Job, Model

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


def validated_ids(session: Session, model_ids: list[int]) -> set[int]:
    """Models whose headline version passed validation: the version the row shows (and the
    one `oscar-zoo list --validated` checks), not any older one that passed."""
    stats = queries.model_stats(session, model_ids)     # its validation_passed is the headline's
    return {model_id for model_id, s in stats.items() if s["validation_passed"]}


def search_models(session: Session, q: str | None, architecture: str | None, validated: bool,
                  limit: int = 50, cursor: str | None = None) -> queries.Page:
    """queries.list_models, optionally keeping only validated models.

    Pages of list_models are filtered and refilled until `limit` models are found, so the
    cursor stays list_models' own (the last name shown). Raises InvalidInput for a bad cursor.
    """
    if not validated:
        return queries.list_models(session, q, architecture, False, limit, cursor)
    found: list[Model] = []
    while True:
        page = queries.list_models(session, q, architecture, True, queries.MAX_LIMIT, cursor)
        keep = validated_ids(session, [m.id for m in page.items])
        for m in page.items:
            if m.id in keep:
                found.append(m)
                if len(found) == limit + 1:
                    return queries.Page(found[:limit], queries.encode_cursor(found[limit - 1].name))
        if page.next_cursor is None:
            return queries.Page(found, None)
        cursor = page.next_cursor


def known_models(session: Session, names: list[str | None]) -> set[str]:
    """The names that are models here: a job is filed under the name it was submitted with,
    which for a hub id nobody has published yet is no model's (its page would be a 404)."""
    names = sorted({n for n in names if n})
    if not names:
        return set()
    return set(session.scalars(select(Model.name).where(Model.name.in_(names))))


def extra_loss(validation: dict | None, variant: str = "bundle") -> float | None:
    """The extra next-token loss over BF16 (nats/token) a validation report gives `variant`:
    the number the pages show as a version's quality, and sort by."""
    by = {r.get("name"): r for r in (validation or {}).get("variants", []) if isinstance(r, dict)}
    return by.get(variant, {}).get("delta_nll")


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
# after it even when rows were added since.

MODEL_SORTS = ("name", "published", "versions", "loss")
VERSION_SORTS = ("version", "created", "size", "loss")


@total_ordering
class _Descending:
    """Its value in reverse order: a descending key beside an ascending tie-break."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Descending) and self.value == other.value

    def __lt__(self, other: "_Descending") -> bool:
        return other.value < self.value


@dataclass(frozen=True)
class _Keyed:
    key: Any            # None: no value
    tie: Any            # unique within the list
    item: Any


def _number(value: Any) -> float | int | None:
    """A sort value from stored JSON: a finite number, else none (NaN would break the order)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value if math.isfinite(value) else None


def _timestamp(at: datetime | None) -> float | None:
    return None if at is None else at.timestamp()


def _sorted_page(rows: list[_Keyed], sort: str, tie_descending: bool, limit: int,
                 cursor: str | None, key_type: type | tuple, tie_type: type) -> queries.Page:
    descending = sort.startswith("-")

    def place(key: Any, tie: Any) -> tuple:
        if key is None:
            return (True, 0, _Descending(tie) if tie_descending else tie)
        return (False, _Descending(key) if descending else key,
                _Descending(tie) if tie_descending else tie)

    rows = sorted(rows, key=lambda r: place(r.key, r.tie))
    after = queries.decode_cursor(cursor, list)
    if after is not None:
        if not (len(after) == 3 and after[0] == sort and _is(after[2], tie_type)
                and (after[1] is None or _is(after[1], key_type))):
            raise InvalidInput("invalid cursor: pass the next_cursor of a previous page unchanged "
                               "(a cursor belongs to the sort it was made with)")
        start = place(after[1], after[2])
        rows = [r for r in rows if place(r.key, r.tie) > start]
    shown = rows[:limit]
    more = len(rows) > limit
    return queries.Page([r.item for r in shown],
                        queries.encode_cursor([sort, shown[-1].key, shown[-1].tie]) if more else None)


def _is(value: Any, kind: type | tuple) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool)


def all_models(session: Session, q: str | None, architecture: str | None,
               validated: bool) -> list[Model]:
    """Every model search_models finds (its filters and validated test), all its pages."""
    found: list[Model] = []
    cursor = None
    while True:
        page = search_models(session, q, architecture, validated, queries.MAX_LIMIT, cursor)
        found += page.items
        if page.next_cursor is None:
            return found
        cursor = page.next_cursor


def sorted_models(session: Session, q: str | None, architecture: str | None, validated: bool,
                  sort: str = "name", limit: int = 50, cursor: str | None = None) -> queries.Page:
    """search_models in the order `sort` names (one of MODEL_SORTS, `-` for descending):
    name; published: the newest published version's time; versions: how many are published;
    loss: the extra loss of the headline version (the one the home page's row shows).

    "name" is list_models' own order and cursor (the last name shown), which GET /v1/models
    takes too. Raises InvalidInput for a bad cursor."""
    queries.check_limit(limit)
    if sort == "name":
        return search_models(session, q, architecture, validated, limit, cursor)
    column = sort.lstrip("-")
    models = all_models(session, q, architecture, validated)
    ids = [m.id for m in models]
    keys: Callable[[Model], Any]
    if column == "name":
        keys, key_type = (lambda m: m.name), str
    elif column == "published":
        at = last_published(session, ids)
        keys, key_type = (lambda m: _timestamp(at.get(m.id))), (int, float)
    elif column == "versions":
        counts = status_counts(session, ids)
        keys, key_type = (lambda m: counts[m.id].get("published", 0)), int
    elif column == "loss":
        heads = headline_versions(session, ids)
        keys, key_type = (lambda m: _number(extra_loss(
            heads[m.id].validation if m.id in heads else None))), (int, float)
    else:
        raise ValueError(f"unknown model sort {sort!r}")
    rows = [_Keyed(keys(m), m.name, m) for m in models]
    return _sorted_page(rows, sort, False, limit, cursor, key_type, str)


_VERSION_COLUMNS = {"version": (BundleVersion.number, lambda v: v, int),
                    "created": (BundleVersion.created_at, _timestamp, (int, float)),
                    "size": (BundleVersion.size, lambda v: v, int),
                    "loss": (BundleVersion.validation, lambda v: _number(extra_loss(v)), (int, float))}


def sorted_versions(session: Session, model: Model, sort: str = "-version", limit: int = 50,
                    cursor: str | None = None) -> queries.Page:
    """A model's versions in the order `sort` names (one of VERSION_SORTS, `-` for descending):
    version number, created (upload time), size, loss (the bundle's extra loss over BF16);
    ties newest first. "-version" is list_versions' own order and cursor. Loaded for summaries
    (the manifest and files are not). Raises InvalidInput for a bad cursor."""
    queries.check_limit(limit)
    if sort == "-version":
        return queries.list_versions(session, model, None, limit, cursor)
    column, key_of, key_type = _VERSION_COLUMNS[sort.lstrip("-")]
    # only the sort column: loading every version's whole row to show one page is what the
    # default order's keyset avoids
    rows = [_Keyed(key_of(value), number, number) for number, value in session.execute(
        select(BundleVersion.number, column).where(BundleVersion.model_id == model.id))]
    page = _sorted_page(rows, sort, True, limit, cursor, key_type, int)
    loaded = {v.number: v for v in session.scalars(
        select(BundleVersion).where(BundleVersion.model_id == model.id,
                                    BundleVersion.number.in_(page.items))
        .options(defer(BundleVersion.manifest, raiseload=True), raiseload(BundleVersion.files)))}
    return queries.Page([loaded[n] for n in page.items], page.next_cursor)
