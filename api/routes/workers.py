"""The worker protocol: plain HTTP, so `oscar-zoo worker --registry URL` runs on any host.
Every call needs a token with scope `jobs:work` (or admin).

    POST /v1/workers/claim           {worker, gpus, ray, wait} -> 200 {job, lease: {token,
                                     seconds, expires_at}} | 204 (nothing within `wait` s)
    POST /v1/jobs/{id}/attach        {lease, worker}: a Ray task takes over its dispatcher's lease
                                     -> the job, `lease.token` the task's own for later calls
    POST /v1/jobs/{id}/heartbeat     {lease} -> {status, cancel_requested, lease_expires_at}
    POST /v1/jobs/{id}/progress      {lease, phase, progress, timings} -> same as heartbeat
    POST /v1/jobs/{id}/result        multipart bundle files (+ status draft|published), header
                                     X-Lease-Token -> the version (201 new, 200 recorded before);
                                     a new published version moves the spec's aliases and is
                                     mirrored (spec `mirror` + OSCAR_ZOO_MIRROR_TARGETS)
    POST /v1/jobs/{id}/complete      {lease, timings, progress, error?}: the attempt's end
    POST /v1/jobs/{id}/fail          {lease, error, retryable, cancelled}: requeue or end
    POST /v1/jobs/{id}/release       {lease}: requeue without spending an attempt (shutdown)

A call with a lease that is no longer the job's answers 409 (Lease lost): the worker stops.
A Ray task's token is replaced when another task process attaches (Ray's retry), so only the
latest reports; its dispatcher's claim token stays good for the dispatcher's own calls.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Depends, Header, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from sqlalchemy import exists, select

from ...registry_db import jobs as jobs_db
from ...registry_db import workers as workers_db
from ...registry_db.mirrors import mirror_published
from ...registry_db.models import Job
from ...registry_db.publish import model_for, prepare_bundle, store_blobs
from ...registry_db.tokens import check_live
from ...zoo.errors import LeaseLost
from ...zoo.manifest import check_finite
from ..auth import Caller, caller, require
from ..serialize import iso
from .jobs import detail_of
from .publish import staged_upload
from .versions import version_body

router = APIRouter(tags=["workers"])
log = logging.getLogger("oscar_zoo.jobs")
work = require("jobs:work")
CLAIM_POLL_S = 0.5


class Strict(BaseModel):
    # NaN or Infinity in timings or progress would be stored, and then every read of the job
    # answers 500: its JSON cannot be written
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _no_nul(cls, value):
        if isinstance(value, str) and "\x00" in value:
            raise ValueError("may not contain NUL characters")
        return value

    @field_validator("*")
    @classmethod
    def _finite(cls, value, info: ValidationInfo):
        return check_finite(value, info.field_name)


class ClaimRequest(Strict):
    worker: str = Field(min_length=1, max_length=200, description="host:pid:nonce")
    gpus: int | None = Field(None, ge=0, le=1024, description="GPUs this worker has; null: any")
    ray: bool = Field(False, description="a Ray dispatcher: may take jobs with ray_resources")
    wait: float = Field(0, ge=0, le=30, description="long poll: seconds to wait for a job")


class LeaseRequest(Strict):
    lease: str = Field(min_length=1, max_length=64)


class AttachRequest(LeaseRequest):
    worker: str = Field(min_length=1, max_length=200)


class HeartbeatRequest(LeaseRequest):
    worker: str | None = Field(None, min_length=1, max_length=200,
                               description="who beats, when not the holder (a Ray dispatcher)")


class ProgressRequest(LeaseRequest):
    phase: str = Field(max_length=40)
    progress: dict[str, Any] = {}
    timings: dict[str, float] | None = None


class CompleteRequest(LeaseRequest):
    timings: dict[str, float] | None = None
    progress: dict[str, Any] | None = None
    error: str | None = Field(None, max_length=20000)


class FailRequest(LeaseRequest):
    error: str = Field(max_length=20000)
    retryable: bool = True
    cancelled: bool = False


def _lease_state(job) -> dict:
    return {"status": job.status, "cancel_requested": job.cancel_requested,
            "lease_expires_at": iso(job.lease_expires_at), "lease_seconds": job.lease_seconds}


@router.post("/v1/workers/claim", summary="Lease the oldest queued job this worker can run",
             responses={204: {"description": "no job to run"}})
async def claim(body: ClaimRequest, request: Request, who: Caller = Depends(caller("jobs:work"))):
    deadline = time.monotonic() + body.wait
    await run_in_threadpool(_seen, request.app.state.registry, body)
    while True:
        got = await run_in_threadpool(_claim, request.app.state.registry, body, who.token_id)
        if got is not None:
            return got
        if time.monotonic() >= deadline or await request.is_disconnected():
            return Response(status_code=204)
        await asyncio.sleep(CLAIM_POLL_S)


def _seen(registry, body: ClaimRequest) -> None:
    with registry.db.write() as session:
        workers_db.seen(session, body.worker, body.gpus, body.ray)


def _claim(registry, body: ClaimRequest, token_id: int) -> dict | None:
    with registry.db.read() as session:     # the common case, cheaply: nothing queued
        if not session.scalar(select(exists().where(Job.status == "queued"))):
            return None
    with registry.db.write() as session:
        check_live(session, token_id)       # revoked during the long poll: lease nothing
        got = jobs_db.claim(session, body.worker, body.gpus, body.ray)
        if got is None:
            return None
        job, token = got
        return {"job": detail_of(session, job),
                "lease": {"token": token, "seconds": job.lease_seconds,
                          "expires_at": iso(job.lease_expires_at)}}


@router.post("/v1/jobs/{job_id}/attach", summary="Take over a dispatcher's lease (Ray task)")
def attach(job_id: str, body: AttachRequest, request: Request, actor: str = Depends(work)):
    with request.app.state.registry.db.write() as session:
        job, token = jobs_db.attach(session, job_id, body.lease, body.worker)
        detail = detail_of(session, job)
    if detail["status"] != "running":     # a cancelled job has no error to add
        why = f": {detail['error']}" if detail["error"] else ""
        raise LeaseLost(f"job {job_id} {detail['status']}{why}")
    return {**detail, "lease": {**detail["lease"], "token": token}}


@router.post("/v1/jobs/{job_id}/heartbeat", summary="Extend the lease; learn about a cancel")
def heartbeat(job_id: str, body: HeartbeatRequest, request: Request, actor: str = Depends(work)):
    with request.app.state.registry.db.write() as session:
        job = jobs_db.heartbeat(session, job_id, body.lease)
        workers_db.touch(session, body.worker or job.lease_holder)
        return _lease_state(job)


@router.post("/v1/jobs/{job_id}/progress", summary="Report phase and per-layer progress")
def progress(job_id: str, body: ProgressRequest, request: Request, actor: str = Depends(work)):
    with request.app.state.registry.db.write() as session:
        job = jobs_db.report_progress(session, job_id, body.lease, body.phase, body.progress,
                                      body.timings)
        return _lease_state(job)


@router.post("/v1/jobs/{job_id}/complete", summary="End the attempt with its result")
def complete(job_id: str, body: CompleteRequest, request: Request, actor: str = Depends(work)):
    with request.app.state.registry.db.write() as session:
        job = jobs_db.complete(session, job_id, body.lease, body.timings, body.progress, body.error)
        return detail_of(session, job)


@router.post("/v1/jobs/{job_id}/fail", summary="End the attempt without a result")
def fail(job_id: str, body: FailRequest, request: Request, actor: str = Depends(work)):
    with request.app.state.registry.db.write() as session:
        job = jobs_db.fail(session, job_id, body.lease, body.error, body.retryable, body.cancelled)
        return detail_of(session, job)


@router.post("/v1/jobs/{job_id}/release", summary="Give the job back (worker shutting down)")
def release(job_id: str, body: LeaseRequest, request: Request, actor: str = Depends(work)):
    with request.app.state.registry.db.write() as session:
        return detail_of(session, jobs_db.release(session, job_id, body.lease))


@router.post("/v1/jobs/{job_id}/result", status_code=201,
             summary="Upload the job's bundle (multipart, like publishing); one version per job")
async def result(job_id: str, request: Request,
                 x_lease_token: str = Header(..., max_length=64),
                 who: Caller = Depends(caller("jobs:work"))):
    async with staged_upload(request, "job-", f"job {job_id}'s result") as (staging, fields):
        body, created = await run_in_threadpool(
            _record, request.app.state.registry, job_id, x_lease_token, staging,
            fields.get("status") or None, who)
    return JSONResponse(body, status_code=201 if created else 200)


def _record(registry, job_id: str, token: str, staging: Path, status: str | None,
            who: Caller):
    """Verify (no side effects), fence, store blobs, then one transaction (as Registry.publish).
    The upload may take long: a token revoked or expired meanwhile writes nothing."""
    prepared = prepare_bundle(staging)
    with registry.db.read() as session:
        job = jobs_db.leased(session, job_id, token)
        if job.result_version_id is None:
            jobs_db.refuse_if_cancelled(job)        # before storing its blobs
        model_for(session, prepared.manifest, job.model, create=False)
    store_blobs(registry.blobs, prepared)
    with registry.db.write() as session:
        check_live(session, who.token_id)
        version, created = jobs_db.record_result(session, job_id, token, prepared, status,
                                                 who.actor)
        body = version_body(session, version)
    if created:     # in the background; the spec's targets only where the server allows them
        mirror_published(registry, body["model"], body["version"])
    return body, created
