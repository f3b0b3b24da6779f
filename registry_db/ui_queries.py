"""Read queries the web UI needs beyond queries.py: filter choices, each model's headline
version, its versions by status, the validated filter, what a job's bundle was calibrated on,
and whether a version's source_job is a job here.

Everything here composes queries.py (same resolution, same pagination cursors), so a page and
the JSON API never disagree about what exists.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session, defer, raiseload

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
