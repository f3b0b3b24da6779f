"""Workers the registry has heard from, and why a queued job waits.

A claim records the worker's name, GPUs and Ray flag; a heartbeat refreshes the time of the
worker holding the lease (a busy worker does not claim). Without this a job asking for more GPUs
than any worker has, or for Ray resources with no Ray dispatcher running, waits forever in
silence; so would a Ray task no node of the cluster can run (the dispatcher notes it in the
job's progress, calibrate/executors/ray_executor.py). Functions run inside the caller's
`Database.write()` / `read()` transaction.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError as DBIntegrityError
from sqlalchemy.orm import Session

from .models import Job, Worker

# Idle workers ask every few seconds and busy ones beat every lease_seconds / 3: one not heard
# from in this long is gone (or cut off)
SEEN_S = 300.0
FORGET_AFTER = timedelta(days=7)   # worker names carry a pid: rows of past processes go


def _now() -> datetime:
    return datetime.now(timezone.utc)


def seen(session: Session, name: str, gpus: int | None, ray: bool) -> None:
    """The worker asked for work just now, with what it can run."""
    now, name = _now(), name[:200]
    row = session.get(Worker, name)
    if row is None:
        try:
            with session.begin_nested():
                session.add(Worker(name=name, gpus=gpus, ray=ray, first_seen_at=now, seen_at=now))
            session.execute(delete(Worker).where(Worker.seen_at < now - FORGET_AFTER))
            return
        except DBIntegrityError:   # its previous request, on another connection, got there first
            row = session.get(Worker, name)
    row.gpus, row.ray, row.seen_at = gpus, ray, now


def touch(session: Session, name: str | None) -> None:
    """The worker beat for a job (its own, or its Ray task's); nothing for a name that never
    claimed (a Ray task itself)."""
    row = session.get(Worker, (name or "")[:200])
    if row is not None:
        row.seen_at = _now()


def recent(session: Session) -> list[Worker]:
    cutoff = _now() - timedelta(seconds=SEEN_S)
    return list(session.scalars(select(Worker).where(Worker.seen_at >= cutoff)
                                .order_by(Worker.seen_at.desc())))


def waiting_reason(session: Session, job: Job) -> str | None:
    """Why a queued job cannot start on any worker seen lately, with what to do; None when some
    worker could run it (it waits for that one to be free) or the job is not queued. A job a
    Ray dispatcher claimed whose task Ray cannot place says so too, in the dispatcher's words."""
    if job.cancel_requested:
        return None
    if job.status == "running" and job.phase == "queued":    # its Ray task not started yet
        return (job.progress or {}).get("unplaceable")
    if job.status != "queued":
        return None
    workers = recent(session)
    minutes = f"{SEEN_S / 60:g} minutes"
    if not workers:
        return (f"no worker has asked for work in the last {minutes}; start one with "
                "`oscar-zoo worker --registry URL` (a token with scope jobs:work)")
    if (job.spec or {}).get("ray_resources"):
        if any(w.ray for w in workers):
            return None
        return (f"it asks for Ray resources and no Ray dispatcher has asked for work in the last "
                f"{minutes}; start one with `oscar-zoo worker --executor ray`")
    if any(w.gpus is None for w in workers):   # a Ray dispatcher: Ray places any size
        return None
    largest = max(max(w.gpus or 0, 1) for w in workers)   # a CPU-only worker runs 1-GPU jobs
    if job.gpus > largest:
        return (f"it needs {job.gpus} GPUs and the largest worker seen in the last {minutes} has "
                f"{largest}; start a worker on a host with {job.gpus} GPUs (`oscar-zoo worker "
                f"--gpus {job.gpus}`), or cancel it and submit with gpus: {largest}")
    return None
