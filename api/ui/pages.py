"""Browsing pages: home (search, filters, sortable), model (sortable versions, recent jobs),
version (with charts)."""

from __future__ import annotations

from urllib.parse import quote, urlencode

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from sqlalchemy.orm import Session

from ...registry_db import jobs as jobs_db
from ...registry_db import queries, ui_queries
from ...zoo import settings
from .. import serialize
from ..deps import reading
from ..routes.jobs import job_detail, results_of
from . import figures, sorting, views
from .render import PageRoute, page

router = APIRouter(route_class=PageRoute, include_in_schema=False,
                   default_response_class=HTMLResponse)
PAGE_SIZE = 50
HISTORY = 10       # alias moves on a model's page; older ones through the API
RECENT_JOBS = 10   # calibration jobs on a model's page; the rest on /jobs?model=


def endpoint(request: Request) -> str:
    """The registry URL the pages tell clients to use: OSCAR_ZOO_PUBLIC_URL where the operator
    set one, else the request's own (whose Host header a client chose)."""
    return (settings.get("public_url") or str(request.base_url)).rstrip("/")


MODEL_SORTS = sorting.Sorts({"name": sorting.ASC, "published": sorting.DESC,
                             "versions": sorting.DESC, "loss": sorting.ASC}, default="name")


@router.get("/")
def home(request: Request, q: str | None = Query(None, max_length=200),
         architecture: str | None = Query(None, max_length=200),
         validated: bool = Query(False), cursor: str | None = Query(None, max_length=500),
         sort: str | None = Query(None)):
    sort = MODEL_SORTS.parse(sort)
    with reading(request) as session:
        found = ui_queries.sorted_models(session, q or None, architecture or None, validated,
                                         sort, PAGE_SIZE, cursor)
        ids = [m.id for m in found.items]
        stats = queries.model_stats(session, ids)
        heads = ui_queries.headline_versions(session, ids)
        counts = ui_queries.status_counts(session, ids)
        published = ui_queries.last_published(session, ids)
        rows = [{**serialize.model_item(m, stats[m.id]), "kv": views.kv_geometry(m.geometry, 3),
                 "headline": views.headline(heads.get(m.id)),
                 "published": counts[m.id].get("published", 0),
                 "last_published": serialize.iso(published.get(m.id)),
                 "others": views.other_versions(counts[m.id])} for m in found.items]
        architectures = ui_queries.architectures(session)
    notes = ([API_NO_VALIDATED] if validated else []) + ([API_BY_NAME] if sort != "name" else [])
    return page(request, "home.html", {
        "models": rows, "q": q or "", "architecture": architecture or "", "validated": validated,
        "architectures": architectures, "more": next_page(request, found.next_cursor),
        "filtered": bool(q or architecture or validated),
        "sorts": MODEL_SORTS.headers(request, sort),
        # a sorted page's cursor is not list_models': the link names the JSON's first page
        "api": models_api(q, architecture, cursor if sort == "name" else None),
        "api_note": "; ".join(notes),
        # a new search keeps the order chosen (the form sends it); the default stays unsaid
        "sort": "" if sort == MODEL_SORTS.default else sort})


# GET /v1/models has no validated filter (its `published` is another test): the footer says so.
API_NO_VALIDATED = ("it has no validated filter, so it lists the models this page leaves out too; "
                    "those shown here have validation_passed: true")
API_BY_NAME = "it lists models by name, not in this page's order"


def models_api(q: str | None, architecture: str | None, cursor: str | None) -> str:
    """GET /v1/models with the filters it shares with this page; the cursor too, as both take
    list_models' own (the last name shown)."""
    params = {k: v for k, v in (("q", q), ("architecture", architecture), ("cursor", cursor)) if v}
    return "/v1/models" + (f"?{urlencode(params)}" if params else "")


def next_page(request: Request, cursor: str | None, anchor: str = "") -> str | None:
    """The next page's link, relative: behind a proxy the Host header names the backend."""
    return f"?{request.url.include_query_params(cursor=cursor).query}{anchor}" if cursor else None


@router.get("/models/{name:path}/versions/{ref}")
def version_page(request: Request, name: str, ref: str):
    with reading(request) as session:
        model = queries.resolve_model(session, name)
        version = queries.resolve_version(session, model, ref)
        if name != model.name or ref != str(version.number):
            return RedirectResponse(f"/models/{quote(model.name)}/versions/{version.number}", 307)
        context = version_context(request, session, model, version)
    return page(request, "version.html", context)


def version_context(request: Request, session: Session, model, version) -> dict:
    aliases = queries.aliases_of(session, [version.id])[version.id]
    layers = queries.indexed_layers(session, version)
    clips = figures.layer_clips(request, version, layers)
    return {
        "model": serialize.model_item(model, queries.model_stats(session, [model.id])[model.id]),
        "v": views.version_view(version, aliases, endpoint(request)),
        "job_page": ui_queries.job_exists(session, version.source_job),
        "mirrors": [serialize.mirror(r) for r in queries.mirrors(session, version)],
        "attention": figures.attention_error(version.validation, layers),
        "spectra": figures.spectra(request, version, layers),
        "clips": figures.clip_grids(clips, layers), "layers": layers,
        "layer_table": figures.layer_table(layers, clips, version.validation),
        "api": f"/v1/models/{model.name}/versions/{version.number}"}


VERSION_SORTS = sorting.Sorts({"version": sorting.DESC, "created": sorting.DESC,
                               "size": sorting.ASC, "loss": sorting.ASC},
                              default="-version", anchor="#versions")


@router.get("/models/{name:path}")
def model_page(request: Request, name: str, cursor: str | None = Query(None, max_length=500),
               sort: str | None = Query(None)):
    sort = VERSION_SORTS.parse(sort)
    with reading(request) as session:
        model = queries.resolve_model(session, name)
        if name != model.name:
            query = f"?{request.url.query}" if request.url.query else ""    # keep the order
            return RedirectResponse(f"/models/{quote(model.name)}{query}", 307)
        context = model_context(request, session, model, cursor, sort)
    return page(request, "model.html", context)


def model_context(request: Request, session: Session, model, cursor: str | None,
                  sort: str = VERSION_SORTS.default) -> dict:
    stats = queries.model_stats(session, [model.id])[model.id]
    versions = ui_queries.sorted_versions(session, model, sort, PAGE_SIZE, cursor)
    aliases = queries.aliases_of(session, [v.id for v in versions.items])
    number = stats["recommended_version"] or stats["latest_version"]
    head = queries.resolve_version(session, model, number) if number else None
    head_aliases = queries.aliases_of(session, [head.id])[head.id] if head else []
    history = queries.alias_history(session, model, limit=HISTORY)
    return {
        "model": serialize.model_item(model, stats), "kv": views.kv_geometry(model.geometry),
        "versions": [{**serialize.version_summary(v, aliases[v.id]),
                      "delta_nll": ui_queries.extra_loss(v.validation)} for v in versions.items],
        # the next page opens at the table, as a re-sorted one does
        "more": next_page(request, versions.next_cursor, VERSION_SORTS.anchor),
        # only newest first are the next page's versions older ones
        "more_label": "Older versions" if sort == "-version" else "More versions",
        "sorts": VERSION_SORTS.headers(request, sort),
        "head": views.version_view(head, head_aliases, endpoint(request)) if head else None,
        "history": [serialize.alias_event(*e) for e in history.items],
        "older_history": history.next_cursor and
        f"/v1/models/{model.name}/aliases?{urlencode({'cursor': history.next_cursor})}",
        **recent_jobs(session, model),
        "api": f"/v1/models/{model.name}"}


def recent_jobs(session: Session, model) -> dict:
    """The model's latest jobs as GET /v1/jobs?model= lists them (the same query and the job
    JSON's own fields, `created_by` included), and the jobs page filtered to the model."""
    found = jobs_db.list_jobs(session, None, model.name, RECENT_JOBS)
    results = results_of(session, found.items)
    return {"jobs": [job_detail(j, results.get(j.result_version_id)) for j in found.items],
            "more_jobs": found.next_cursor is not None,
            "jobs_page": f"/jobs?{urlencode({'model': model.name})}"}
