"""Calibration jobs, the user's side: submit, list, follow (server-sent events), cancel.

    POST /v1/jobs                    {spec}, scope jobs:submit (and bundles:publish for a spec
                                     that moves aliases); `Idempotency-Key` header (or
                                     "idempotency_key" in the body): same key from the same
                                     token -> same job (keys are each token's own)
    GET  /v1/jobs?status=&model=&limit=&cursor=
    GET  /v1/jobs/{id}
    GET  /v1/jobs/{id}/events        text/event-stream: `event: job` + `data: <job JSON>` on
                                     every change, until the job ends
    POST /v1/jobs/{id}/cancel        scope jobs:submit, and the token that submitted the job or
                                     an admin token (403 otherwise, naming the submitter; a job
                                     submitted before migration 0008: admin only)

{id}: the whole id, or a prefix of at least 8 characters that starts no other job's id (409
when it does, naming some; 404 when it starts none). The worker's side (claim, heartbeat,
progress, result; routes/workers.py) takes whole ids only.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, AsyncIterator

from fastapi import APIRouter, Body, Depends, Header, Query, Request
from pydantic import BaseModel, Field
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from sqlalchemy.orm import Session

from ...calibrate import jobspec
from ...registry_db import jobs as jobs_db
from ...registry_db import queries
from ...registry_db import workers as workers_db
from ...registry_db.models import BundleVersion, Job
from ...registry_db.publish import hub_id_clash, known_model
from ...zoo.errors import Forbidden, InvalidInput, ModelNotFound
from ...zoo.geometry import ModelGeometry
from ..auth import Caller, caller
from ..serialize import iso, public_error

router = APIRouter(tags=["jobs"])
POLL_S = 0.3
KEEPALIVE_S = 15.0

SPEC_EXAMPLE = {"model": "smollm2-135m", "tokens": 8192, "seq_len": 2048,
                "validation": {"context_len": 2048, "windows": 2}, "aliases": ["recommended"]}


# --- the job JSON (the UI's job pages apply it as is) ------------------------------------------

def _public_progress(progress: dict | None) -> dict:
    # a requeued job's reason is its attempt's error, with whatever an older worker appended
    progress = dict(progress or {})
    if isinstance(progress.get("requeued"), str):
        progress["requeued"] = public_error(progress["requeued"])
    return progress


def job_summary(job: Job, result: BundleVersion | None) -> dict[str, Any]:
    return {"id": job.id, "status": job.status, "phase": job.phase, "model": job.model,
            "progress": _public_progress(job.progress), "attempts": job.attempts,
            "max_attempts": job.max_attempts, "cancel_requested": job.cancel_requested,
            "created_at": iso(job.created_at), "updated_at": iso(job.updated_at),
            "result_version": result.number if result else None,
            # the version's own model: jobs from before migration 0002 have no `model`
            "result_model": result.model.name if result else None}


def job_detail(job: Job, result: BundleVersion | None) -> dict[str, Any]:
    lease = None
    if job.status == "running":
        lease = {"holder": job.lease_holder, "expires_at": iso(job.lease_expires_at),
                 "heartbeat_at": iso(job.heartbeat_at), "seconds": job.lease_seconds}
    return {**job_summary(job, result), "spec": job.spec, "timings": job.timings or {},
            "error": public_error(job.error), "gpus": job.gpus, "lease": lease,
            "started_at": iso(job.started_at), "finished_at": iso(job.finished_at),
            "created_by": job.created_by,
            "result": None if result is None else {
                "model": result.model.name, "version": result.number, "status": result.status,
                "digest": result.digest, "validation_passed": result.validation_passed}}


def results_of(session: Session, jobs: list[Job]) -> dict[int, BundleVersion]:
    ids = [j.result_version_id for j in jobs if j.result_version_id is not None]
    if not ids:
        return {}
    from sqlalchemy import select
    from sqlalchemy.orm import selectinload

    stmt = select(BundleVersion).where(BundleVersion.id.in_(ids)).options(selectinload(BundleVersion.model))
    return {v.id: v for v in session.scalars(stmt)}


def detail_of(session: Session, job: Job) -> dict[str, Any]:
    """The job as the API shows it; a queued one that no worker seen lately can run says why
    in `waiting` (registry_db/workers.py)."""
    return {**job_detail(job, results_of(session, [job]).get(job.result_version_id)),
            "waiting": workers_db.waiting_reason(session, job)}


def read_detail(request: Request, job_id: str) -> dict[str, Any]:
    """job_id: whole, or a unique prefix."""
    with request.app.state.registry.db.read() as session:
        return detail_of(session, jobs_db.resolve(session, job_id))


# --- submit ----------------------------------------------------------------------------------

def prepare_spec(session: Session, body: dict) -> tuple[jobspec.JobSpec, str]:
    """The completed spec and the registry name its bundle goes under. Raises InvalidInput,
    ModelNotFound (with suggestions)."""
    spec = _spell_out_registry_models(session, jobspec.parse_spec(body))
    name, hub_id, entry = jobspec.identity(spec)
    _check_name_free(session, spec, name, hub_id)
    spec = jobspec.complete(spec, entry)
    jobspec.check(spec, _known_geometry(session, name, entry))
    return spec, name


def _spell_out_registry_models(session: Session, spec: jobspec.JobSpec) -> jobspec.JobSpec:
    """The spec with a model only this registry knows (someone uploaded its bundles: no catalog
    name, no hub id) written as the workers need it, who have no registry to ask: `publish_as`
    its registry name with `publish_hub_id`, and `model` its hub id (the weights they load).
    Taken as given, the runner could load no such `model`, and stamped no bundle for such a
    `publish_as` (jobspec.identity): the job failed after the whole calibration.

    Raises ModelNotFound (with suggestions) for a name nobody knows, InvalidInput for a
    publish_hub_id that is not the registry's."""
    upd: dict = {"publish_hub_id": None}    # the registry's word, not the caller's
    if not jobspec.is_path(spec.model) and jobspec.named_identity(spec.model) is None:
        row = _registry_model(session, spec.model)
        upd.update(model=row.hub_id, publish_as=spec.publish_as or row.name)
    publish_as = upd.get("publish_as", spec.publish_as)
    if publish_as is not None and jobspec.named_identity(publish_as) is None:
        row = _registry_model(session, publish_as)
        upd.update(publish_as=row.name, publish_hub_id=row.hub_id)
    given, found = spec.publish_hub_id, upd["publish_hub_id"]
    if given is not None and given.lower() != (found or "").lower():
        raise InvalidInput(f"publish_hub_id {given!r}: "
                           + (f"this registry knows {upd['publish_as']!r} as {found}" if found
                              else "it is only for a publish_as that names a model this "
                                   "registry holds from an upload")
                           + "; leave publish_hub_id out, submit fills it in")
    return spec.model_copy(update=upd)


def _registry_model(session: Session, name: str):
    try:
        return queries.resolve_model(session, name)
    except ModelNotFound:
        raise ModelNotFound(f"unknown model {name!r}: use a catalog name, a hub id (org/name), "
                            "a model this registry holds, or an absolute path the workers can "
                            "read.", suggestions=queries.suggest_models(session, name)) from None


def _check_name_free(session: Session, spec: jobspec.JobSpec, name: str, hub_id: str) -> None:
    """Raises InvalidInput when `name` is another hub model's in the registry: the job's
    result would be refused (publish.model_for) only after the whole calibration. A hub id's
    job goes under its repo part, so `otherorg/qwen3-8b` meets Qwen/Qwen3-8B's `qwen3-8b`."""
    model = known_model(session, name, hub_id)
    clash = hub_id_clash(model, hub_id)
    if clash:
        raise InvalidInput(
            f"{spec.publish_as or spec.model!r} would be published as model {name!r}, but "
            f"{clash}: its result would be refused after the calibration. If you meant that "
            f"model, submit {model.hub_id!r}; this registry cannot hold a second model under "
            f"that name, so {hub_id} is calibrated outside it (`oscar-zoo calibrate {hub_id}`)")


def _known_geometry(session: Session, name: str, entry) -> ModelGeometry | None:
    if entry is not None:
        return entry.geometry
    try:
        return ModelGeometry.from_dict(queries.resolve_model(session, name).geometry)
    except ModelNotFound:
        return None


class SubmitBody(jobspec.JobSpec):
    idempotency_key: str | None = Field(None, min_length=1, max_length=200,
                                        description="same key from the same token, same job (or the header)")


@router.post("/v1/jobs", status_code=201, summary="Submit a calibration job",
             responses={200: {"description": "this idempotency key's job, submitted before"},
                        404: {"description": "unknown model (with suggestions)"},
                        422: {"description": "invalid spec or impossible geometry"}})
def submit(request: Request, body: SubmitBody = Body(..., examples=[SPEC_EXAMPLE]),
           idempotency_key: str | None = Header(None, min_length=1, max_length=200),
           who: Caller = Depends(caller("jobs:submit"))):
    key = body.idempotency_key or idempotency_key
    if "\\u0000" in body.model_dump_json():
        raise InvalidInput("the job spec may not contain NUL characters")
    registry = request.app.state.registry
    with registry.db.read() as session:
        spec, name = prepare_spec(session, body.model_dump(exclude={"idempotency_key"}))
    _check_alias_scope(spec, who)
    with registry.db.write() as session:
        job, created = jobs_db.submit(
            session, _stored(spec), model=name, gpus=spec.gpus,
            max_attempts=spec.max_attempts, lease_seconds=spec.lease_seconds,
            idempotency_key=key, created_by=who.actor, created_by_token_id=who.token_id,
            given=given_fields(body))
        detail = detail_of(session, job)
    return JSONResponse(detail, status_code=201 if created else 200,
                        headers={"Location": f"/v1/jobs/{job.id}"})


def _stored(spec: jobspec.JobSpec) -> dict:
    """The spec as the job row keeps it. publish_hub_id only where set: a worker from before
    the field (JobSpec forbids unknown fields) refused every job whose spec carried it as null."""
    stored = spec.model_dump(mode="json")
    if stored.get("publish_hub_id") is None:
        stored.pop("publish_hub_id", None)
    return stored


def _check_alias_scope(spec: jobspec.JobSpec, who: Caller) -> None:
    """Moving an alias is publishing (`recommended` is what `pull NAME` serves): a job may move
    them only for a token that could move them itself."""
    if spec.aliases and not who.holds("bundles:publish"):
        raise Forbidden(f"moving aliases {spec.aliases} needs scope 'bundles:publish' beside "
                        f"'jobs:submit', which {who.actor} lacks: submit with a token that has "
                        "both (the registry's operator makes one on its host: `oscar-zoo tokens "
                        "create --scope jobs:submit --scope bundles:publish ...`), or leave the aliases out and move them after the job "
                        "with `oscar-zoo alias NAME@VERSION ALIAS`")


def given_fields(spec: BaseModel) -> dict:
    """The fields the user set, not null ({field: True, or the same for a nested section}): a
    retry with its idempotency key is the same request even after a server default changed."""
    given = {}
    for name in spec.model_fields_set - {"idempotency_key"}:
        value = getattr(spec, name)
        if value is not None:
            given[name] = given_fields(value) if isinstance(value, BaseModel) else True
    return given


# --- read ------------------------------------------------------------------------------------

@router.get("/v1/jobs", summary="Jobs, newest first")
def list_jobs(request: Request, status: str | None = Query(None, max_length=20,
                                                           description="|".join(jobs_db.STATUSES)),
              model: str | None = Query(None, max_length=200),
              limit: int = Query(50, ge=1, le=queries.MAX_LIMIT),
              cursor: str | None = Query(None, max_length=500)):
    with request.app.state.registry.db.read() as session:
        page = jobs_db.list_jobs(session, status_filter(status), _model_name(session, model),
                                 limit, cursor)
        results = results_of(session, page.items)
        return {"items": [job_summary(j, results.get(j.result_version_id)) for j in page.items],
                "next_cursor": page.next_cursor}


def _model_name(session: Session, model: str | None) -> str | None:
    """The registry name jobs of `model` are filed under, as submit names it: a registry or
    catalog name, or a hub id's repo part (before anything is published there is no model row)."""
    if not model:
        return None
    queries.check_text(model, "model")  # the fallback below filters by it as given
    try:
        return queries.resolve_model(session, model).name
    except ModelNotFound:
        found = jobspec.named_identity(model.strip())
        return found[0] if found else model.strip().lower()


def status_filter(status: str | None) -> str | None:
    """A status to filter by; empty (an HTML form's "any") is none."""
    if not status:
        return None
    if status not in jobs_db.STATUSES:
        raise InvalidInput(f"status {status!r}: one of {', '.join(jobs_db.STATUSES)}, or none")
    return status


@router.get("/v1/jobs/{job_id}", summary="One job: phase, progress, attempts, timings, error",
            responses={404: {"description": "no job has this id, or an id starting so"},
                       409: {"description": "the prefix starts several jobs' ids"}})
def get_job(job_id: str, request: Request):
    return read_detail(request, job_id)


@router.post("/v1/jobs/{job_id}/cancel", status_code=202,
             summary="Cancel: a queued job at once; a running one stops between layers, then "
                     "its process group is killed after a grace period",
             responses={403: {"description": "another token submitted the job: that token or "
                                             "an admin token may cancel it"},
                        409: {"description": "the job already succeeded or failed, or recorded "
                                             "its result; or the prefix starts several jobs' ids "
                                             "(cancelling a cancelled job answers 202 again)"}})
def cancel(job_id: str, request: Request, who: Caller = Depends(caller("jobs:submit"))):
    with request.app.state.registry.db.write() as session:
        return detail_of(session, jobs_db.request_cancel(
            session, job_id, who.actor, token_id=who.token_id, admin=who.admin))


# --- events ----------------------------------------------------------------------------------

@router.get("/v1/jobs/{job_id}/events", summary="Live job updates until the job ends",
            responses={200: {"content": {"text/event-stream": {}}}})
async def events(job_id: str, request: Request) -> StreamingResponse:
    first = await run_in_threadpool(read_detail, request, job_id)   # 404 before the stream
    # polled by its whole id: a prefix might start another job's id too by the next poll
    return StreamingResponse(_stream(request, first["id"], first), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


def sse(job: dict) -> str:
    return f"event: job\ndata: {json.dumps(job, separators=(',', ':'))}\n\n"


async def _stream(request: Request, job_id: str, job: dict) -> AsyncIterator[str]:
    yield sse(job)
    quiet_since = time.monotonic()
    while job["status"] not in jobs_db.TERMINAL and not await request.is_disconnected():
        await asyncio.sleep(POLL_S)
        latest = await run_in_threadpool(read_detail, request, job_id)
        if latest != job:
            job, quiet_since = latest, time.monotonic()
            yield sse(job)
        elif time.monotonic() - quiet_since > KEEPALIVE_S:
            quiet_since = time.monotonic()
            yield ": keepalive\n\n"
