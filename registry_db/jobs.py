"""Calibration jobs: the registry is the system of record (anchors A7, synthesis 1-5).

States: queued -> running -> succeeded | failed | cancelled; a running job whose lease expires
goes back to queued (or to failed after max_attempts). Every function here runs inside the
caller's `Database.write()` transaction.

Leases: a claim gives the worker a random fencing token; every later call (heartbeat, progress,
result, complete, fail) must present it, so a worker whose lease was swept and requeued can
never report on, or publish for, the attempt that replaced it (LeaseLost, 409). Heartbeats
extend the lease by the job's lease_seconds; `sweep` (run by the server itself, never a user's
cron) requeues expired ones. The row keeps only the sha256 of each fencing token (migration
0011): a token is in plain text only in the reply that hands it out, so a database dump or
backup gives no one a lease to report on, or publish for, a running job.

A Ray task attaches to the lease its dispatcher claimed and gets a token of its own; each task
process that attaches (Ray's retry of a task whose node it took for dead) replaces it, so an
earlier process still alive behind a partition is fenced too, and may not attach again. The
dispatcher's claim token stays good for its own calls (heartbeat, fail, release) and for the
attach of a retry (whose arguments carry it); progress, results and completion are the
attached task's alone. A task's token is derived from the claim's (an HMAC keyed by it, over
the job, the attempt and the task's name), so the same task attaching again, its reply lost,
gets the same token back though only its hash is stored, whichever of its two requests lands
last; anyone able to derive it holds the claim token, which may attach anyway.

Claims: PostgreSQL takes queued rows `FOR UPDATE SKIP LOCKED`, so concurrent claimers never
block on, or both get, one job; SQLite has a single writer (session.py), which serializes them.

Ownership: a job records the id of the token that submitted it (a revoked token's name may be
taken again); only that token or an admin token may cancel it. An idempotency key is the
submitting token's own (migration 0013): another token sending the same key submits a job of
its own, and learns nothing of the first one.

Naming a job: the user's side (read, follow, cancel) takes the whole id or a unique prefix of at
least SHORT_ID characters, as `jobs list` shows them (resolve); the worker side, whose ids come
from its claim, takes the whole id only (get).

Publishing: one version per job. The result is recorded in the job's row lock, guarded by
`result_version_id` and `BundleVersion.source_job`, so a retried attempt (its bundle has a new
timestamp, hence a new digest) returns the version the first attempt made.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import datetime, timedelta, timezone
from typing import Any, Iterator

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError as DBIntegrityError
from sqlalchemy.orm import Session

from ..zoo.errors import Conflict, Forbidden, InvalidInput, JobCancelled, JobNotFound, LeaseLost
from ..zoo.jobs_client import SHORT_ID, TERMINAL
from . import audit
from .aliases import move_alias
from .models import ApiToken, BundleVersion, Job
from .publish import Prepared, model_for, record_version
from .queries import Page, check_limit, decode_cursor, encode_cursor
from .tokens import actor_of, hash_token, is_expired

STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
# What a running job reports, in order (clip_search sits between fitting and validating).
RUN_PHASES = ("loading", "pass1", "pass2", "fitting", "clip_search", "validating", "publishing")
CLAIM_BATCH = 32
_JOB_ID = re.compile(r"[0-9a-fA-F-]{1,36}")
_UUID = "xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
_HEX = "0123456789abcdef"
CANDIDATES_SHOWN = 5    # of the jobs an ambiguous prefix names


def now_utc() -> datetime:
    return datetime.now(timezone.utc)


def _progress(phase: str, **extra) -> dict[str, Any]:
    return {"phase": phase, "done": 0, "total": 0, "layer": None, **extra}


# --- submit, read, cancel --------------------------------------------------------------------

def submit(session: Session, spec: dict, *, model: str, gpus: int, max_attempts: int,
           lease_seconds: float, idempotency_key: str | None = None,
           created_by: str | None = None, created_by_token_id: int | None = None,
           given: dict | None = None) -> tuple[Job, bool]:
    """A new queued job, or the one this idempotency key made before: (job, created).

    `created_by_token_id`: the submitting token, which may cancel the job; the key is looked up
    among its jobs only (keys are per token: clients pick them, and two may pick the same).

    `given`: the fields the user set ({field: True, or the same for a nested section}), stored
    with the job. A retry is compared with the key's job on the fields either request set (the
    side that omitted one contributes its completed value); the fields neither set are
    defaults that an operator may have changed since, not compared (None: the whole spec). A
    job stored before migration 0004 has no given fields: the retry's alone are compared.
    Raises Conflict, naming the fields that differ, when the key was used for a different spec.
    """
    if idempotency_key:
        existing = _by_key(session, idempotency_key, created_by_token_id)
        if existing is not None:
            return _same_spec(existing, spec, given), False
    job = Job(spec=spec, model=model, gpus=gpus, status="queued", phase="queued",
              progress=_progress("queued"), attempts=0, max_attempts=max_attempts,
              lease_seconds=lease_seconds, cancel_requested=False, timings={},
              idempotency_key=idempotency_key or None, created_by=created_by,
              created_by_token_id=created_by_token_id, given_fields=given)
    try:
        with session.begin_nested():
            session.add(job)
            session.flush()
    except DBIntegrityError:  # the same key, submitted concurrently
        existing = (_by_key(session, idempotency_key, created_by_token_id) if idempotency_key
                    else None)
        if existing is None:
            raise
        return _same_spec(existing, spec, given), False
    audit.record(session, created_by, "job.submit", f"job:{job.id}", model=model)
    return job, True


def _by_key(session: Session, key: str, token_id: int | None) -> Job | None:
    """The job this token submitted with this key (None: a job of no token, as submitted
    before migration 0008 and by callers in-process)."""
    owner = Job.created_by_token_id.is_(None) if token_id is None \
        else Job.created_by_token_id == token_id
    return session.scalar(select(Job).where(Job.idempotency_key == key, owner)
                          .order_by(Job.created_at).limit(1))


def _same_spec(job: Job, spec: dict, given: dict | None) -> Job:
    if given is not None and job.given_fields is not None:
        given = _union(job.given_fields, given)
    differ = _differences(job.spec, spec, given)
    if differ:
        raise Conflict(f"idempotency key already used by job {job.id} with a different spec "
                       f"(it differs in {', '.join(differ)}); send the same spec, or use a new "
                       "key for a new job")
    return job


def _union(a: dict, b: dict) -> dict:
    """The fields either given map names; a section one side set whole (True) is compared whole."""
    out = dict(a)
    for k, m in b.items():
        n = out.get(k)
        if n is None:
            out[k] = m
        else:
            out[k] = _union(n, m) if isinstance(n, dict) and isinstance(m, dict) else True
    return out


def _differences(old: dict, new: dict, given: dict | None) -> list[str]:
    """Dotted names of the fields of `given` (None: every field) whose values differ."""
    if given is None:
        return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    out = []
    for k, m in sorted(given.items()):
        if isinstance(m, dict):
            out += [f"{k}.{d}" for d in _differences(old.get(k) or {}, new.get(k) or {}, m)]
        elif old.get(k) != new.get(k):
            out.append(k)
    return out


def get(session: Session, job_id: str, lock: bool = False) -> Job:
    """The job of this whole id (the worker side: its ids come from its claim). Raises
    JobNotFound."""
    job = _by_id(session, job_id, lock)
    if job is None:
        raise JobNotFound(f"no job {job_id!r}: job ids are given whole; list them with "
                          "`oscar-zoo jobs list` (GET /v1/jobs)")
    return job


def resolve(session: Session, ref: str, lock: bool = False) -> Job:
    """The job a user names: its whole id, or a prefix of it of at least SHORT_ID characters
    that no other job's id starts with. Raises JobNotFound, or Conflict for an ambiguous
    prefix, naming a few of the jobs it starts."""
    job = _by_id(session, ref, lock)
    if job is not None:
        return job
    text = ref.lower()
    ids = _ids_starting(session, text.rstrip("-")) if _is_id_prefix(text) else []
    if len(ids) > 1:
        shown = ", ".join(ids[:CANDIDATES_SHOWN]) + (", ..." if ids[CANDIDATES_SHOWN:] else "")
        raise Conflict(f"job id prefix {ref!r} is ambiguous: it starts the ids of several jobs "
                       f"({shown}); give more of the id's characters")
    if not ids:
        raise JobNotFound(f"no job {ref!r}: name a job by its id or the id's first {SHORT_ID} or "
                          "more characters; list them with `oscar-zoo jobs list` (GET /v1/jobs)")
    return _by_id(session, ids[0], lock)


def _by_id(session: Session, job_id: str, lock: bool) -> Job | None:
    # ids are UUIDs: anything else (NUL included) is not looked up
    if not _JOB_ID.fullmatch(job_id):
        return None
    return session.get(Job, job_id, with_for_update=lock or None)


def _is_id_prefix(text: str) -> bool:
    """The start of a lower-case UUID, at least SHORT_ID characters (all of them hex)."""
    return SHORT_ID <= len(text) <= len(_UUID) and all(
        c == "-" if shape == "-" else c in _HEX for c, shape in zip(text, _UUID))


def _ids_starting(session: Session, prefix: str) -> list[str]:
    """Up to CANDIDATES_SHOWN + 1 ids starting with `prefix` (a lower-case UUID's start, not
    ending in '-'), in order.

    A range on the primary key's index, not LIKE, which PostgreSQL serves from a plain index
    only under the C collation. The bound is the prefix with its last hex digit raised to the
    next character in hex order, `9` -> `a` and `f` -> `g`, never punctuation (':' after '9'),
    which a linguistic collation sorts apart from the digits (ICU before them, glibc's en_US
    skips it): '0123456:' would end the range before it began. UUID hyphens stand at the same
    places in every id, so under any of these collations the ids order as under C.
    """
    upper = prefix[:-1] + (_HEX + "g")[_HEX.index(prefix[-1]) + 1]
    stmt = (select(Job.id).where(Job.id >= prefix, Job.id < upper).order_by(Job.id)
            .limit(CANDIDATES_SHOWN + 1))
    # the range is the index's business; the prefix test is exact whatever the collation
    return [i for i in session.scalars(stmt) if i.startswith(prefix)]


def list_jobs(session: Session, status: str | None = None, model: str | None = None,
              limit: int = 50, cursor: str | None = None) -> Page:
    """Newest first (keyset on created_at, id)."""
    limit = check_limit(limit)
    after = decode_cursor(cursor, list)
    stmt = select(Job).order_by(Job.created_at.desc(), Job.id.desc()).limit(limit + 1)
    if status:
        stmt = stmt.where(Job.status == status)
    if model:
        stmt = stmt.where(Job.model == model)
    if after is not None:
        try:
            at, last_id = datetime.fromisoformat(str(after[0])), str(after[1])
            # Ours always carry a UTC offset; a naive time or a NUL fails in the database (500).
            if at.tzinfo is None or "\x00" in last_id:
                raise ValueError
            at = at.astimezone(timezone.utc)    # year 1 at +01:00 overflows: refused here, not a 500
        except (ValueError, IndexError, OverflowError):
            raise InvalidInput("invalid cursor: pass the next_cursor of a previous page") from None
        stmt = stmt.where((Job.created_at < at) | ((Job.created_at == at) & (Job.id < last_id)))
    rows = list(session.scalars(stmt))
    more = len(rows) > limit
    rows = rows[:limit]
    return Page(rows, encode_cursor([rows[-1].created_at.isoformat(), rows[-1].id]) if more else None)


def request_cancel(session: Session, job_id: str, by: str | None, *, token_id: int,
                   admin: bool = False) -> Job:
    """A queued job is cancelled at once; a running one gets the flag its worker acts on.

    job_id: the whole id or a unique prefix (resolve). token_id, admin: the caller's token,
    which must be the one that submitted the job or hold the admin scope.

    Cancelling a cancelled job (or one whose cancel is pending) changes nothing and answers as
    the first request did. Raises Forbidden for another token's job, Conflict for a job that
    already succeeded or failed, JobNotFound.
    """
    job = resolve(session, job_id, lock=True)
    if not admin:
        _check_submitter(session, job, token_id)
    if job.status in ("succeeded", "failed") and job.result_version_id is None:
        raise Conflict(f"job {job.id} already {job.status}; nothing to cancel")
    if job.result_version_id is not None:
        # past the point of no return: the version is recorded, its aliases moved (a job
        # requeued after that only completes)
        version = session.get(BundleVersion, job.result_version_id)
        state = "is finishing" if job.status in ("running", "queued") else job.status
        raise Conflict(f"job {job.id} already recorded its result as {job.model}@{version.number} "
                       f"and {state}; to withdraw that version: oscar-zoo yank "
                       f"{job.model}@{version.number} --reason ...")
    if job.status == "cancelled" or job.cancel_requested:
        return job      # a retried request: already done, so no second audit row
    if job.status == "queued":
        _finish(job, "cancelled", None, now_utc())
    elif job.status == "running":
        job.cancel_requested = True
    audit.record(session, by, "job.cancel", f"job:{job.id}", status=job.status)
    return job


def _check_submitter(session: Session, job: Job, token_id: int) -> None:
    """Raises Forbidden, saying which token may cancel the job, unless `token_id` submitted it."""
    owner = job.created_by_token_id
    if owner == token_id:
        return
    if owner is None:
        raise Forbidden(f"job {job.id} was submitted (by {job.created_by or 'an unknown token'}) "
                        "before the registry recorded which token submits a job, so only an "
                        "admin token can cancel it")
    row = session.get(ApiToken, owner)
    who = f"{actor_of(row) if row is not None else job.created_by} (id {owner})"
    if row is None or row.revoked_at is not None:
        raise Forbidden(f"job {job.id} was submitted by {who}, which is revoked since; only an "
                        "admin token can cancel it now")
    if is_expired(row):     # its holder can no longer use it to cancel
        # not when: another principal's token is none of the caller's business
        raise Forbidden(f"job {job.id} was submitted by {who}, which has expired; only an admin "
                        "token can cancel it now")
    raise Forbidden(f"job {job.id} was submitted by {who}; cancel it with that token or an "
                    "admin token")


# --- the worker side -------------------------------------------------------------------------

def claim(session: Session, worker: str, gpus: int | None, ray: bool = False) -> tuple[Job, str] | None:
    """Lease the oldest queued job this worker can run: (job, lease token), or None.

    gpus: the worker's GPUs (0 = CPU only, which runs 1-GPU jobs); None = any (the Ray
    dispatcher, which hands placement to Ray). Jobs asking for custom Ray resources go to Ray.
    """
    for job in _queued(session, gpus):
        if job.spec.get("ray_resources") and not ray:
            continue
        now = now_utc()
        token = secrets.token_hex(16)
        job.status, job.phase, job.progress = "running", "loading", _progress("loading")
        job.attempts += 1
        job.lease_holder, job.lease_token, job.task_token = worker[:200], hash_token(token), None
        job.fenced_holders = None   # the old claim's tasks cannot attach: its token is gone
        job.heartbeat_at, job.lease_expires_at = now, now + timedelta(seconds=job.lease_seconds)
        job.started_at = job.started_at or now
        job.timings = {}
        return job, token
    return None


def _queued(session: Session, gpus: int | None) -> Iterator[Job]:
    """Queued jobs that fit in `gpus`, oldest first, row-locked, batch after batch until the
    queue ends: the Ray check is left to the caller (it reads the JSON spec), so a whole batch
    may hold nothing this worker can run while a job it can waits further back."""
    stmt = select(Job).where(Job.status == "queued", Job.cancel_requested.is_(False))
    if gpus is not None:
        stmt = stmt.where(Job.gpus <= max(gpus, 1))
    stmt = stmt.order_by(Job.created_at, Job.id).limit(CLAIM_BATCH).with_for_update(skip_locked=True)
    batch = list(session.scalars(stmt))
    while batch:
        yield from batch
        if len(batch) < CLAIM_BATCH:
            return
        at, last_id = batch[-1].created_at, batch[-1].id
        batch = list(session.scalars(stmt.where(
            (Job.created_at > at) | ((Job.created_at == at) & (Job.id > last_id)))))


def leased(session: Session, job_id: str, token: str) -> Job:
    """The job, row-locked, if `token` still holds its lease (the claim's, or the attached
    task's). Raises LeaseLost, JobNotFound."""
    job = get(session, job_id, lock=True)
    if job.status != "running" or not token or not (
            _holds(job.lease_token, token) or _holds(job.task_token, token)):
        why = job.status if job.status != "running" else "leased to another attempt"
        raise LeaseLost(f"job {job.id} is no longer yours ({why}); stop working on it")
    return job


def _reporting(session: Session, job_id: str, token: str) -> Job:
    """leased(), for the attempt's own reports (progress, result, completion): once a task has
    attached, only its token makes them; the dispatcher's claim token only keeps the lease."""
    job = leased(session, job_id, token)
    if job.task_token and not _holds(job.task_token, token):
        raise LeaseLost(f"job {job.id} is run by its attached task ({job.lease_holder}); only "
                        "the task reports progress or a result")
    return job


def _holds(stored: str | None, token: str) -> bool:
    """`token` is the one whose hash is stored. The row was found by the job's id, not by the
    token, so a constant-time comparison keeps a caller from learning the hash byte by byte.
    Ours are hex: a token that is not ASCII (a lone surrogate cannot even be hashed) holds none."""
    return stored is not None and token.isascii() and hmac.compare_digest(stored, hash_token(token))


def _task_token(job: Job, claim_token: str) -> str:
    """The attached task's token, stored as its hash. Derived, not random: a retried attach
    whose first request lands after it (a timeout, then both run) must not replace the token
    its task got with one no one received."""
    message = f"{job.id}:{job.attempts}:{job.lease_holder}".encode()
    token = hmac.new(claim_token.encode(), message, hashlib.sha256).hexdigest()[:32]
    job.task_token = hash_token(token)
    return token


def attach(session: Session, job_id: str, token: str, worker: str) -> tuple[Job, str | None]:
    """A process (a Ray task) takes over the lease its dispatcher claimed, presenting the
    claim's token: (job, the token of the task's own later calls; None when the job ended
    instead). A second attach is a Ray retry of a task whose process died: it counts as a new
    attempt, up to max_attempts; past that the job is failed. Its new token replaces the
    earlier task's, whose calls then answer LeaseLost (the process may live on behind a
    partition). A job with a cancel pending is cancelled instead, before any attempt starts
    (check the returned job's status: the caller must commit).

    Idempotent for one task: the same `worker` attaching again (its first reply was lost) gets
    the job as it is and the same token, without another attempt counted or its timings reset.
    A task that a later one replaced stays replaced: its attach, even one retried after a lost
    reply that raced the retry's, is refused (LeaseLost) rather than taking the lease back.
    """
    job = leased(session, job_id, token)
    if not _holds(job.lease_token, token):
        raise LeaseLost(f"job {job.id}: attach with the lease the dispatcher claimed, not a "
                        "task's")
    worker = worker[:200]
    if worker in (job.fenced_holders or []):
        raise LeaseLost(f"job {job.id}: this task process was replaced by a later one "
                        f"({job.lease_holder}); stop working on it")
    if _cancel_if_requested(job, now_utc()):
        return job, None
    if job.lease_holder != worker and not (job.lease_holder or "").startswith("dispatch:"):
        if job.attempts >= job.max_attempts:
            if _ended_with_result(session, job, now_utc(),
                                  f"the last attempt's process ({job.lease_holder}) died"):
                return job, None
            _finish(job, "failed", f"gave up after {job.attempts} attempts: the last one's "
                    f"process ({job.lease_holder}) died", now_utc())
            return job, None
        job.attempts += 1
        job.timings = {}
        job.fenced_holders = [*(job.fenced_holders or []), job.lease_holder]
    job.lease_holder = worker
    return job, _task_token(job, token)


def heartbeat(session: Session, job_id: str, token: str) -> Job:
    job = leased(session, job_id, token)
    now = now_utc()
    job.heartbeat_at, job.lease_expires_at = now, now + timedelta(seconds=job.lease_seconds)
    return job


def report_progress(session: Session, job_id: str, token: str, phase: str,
                    progress: dict | None = None, timings: dict | None = None) -> Job:
    if phase not in RUN_PHASES and phase != "queued":
        raise InvalidInput(f"phase {phase!r}: one of {', '.join(RUN_PHASES)}")
    job = _reporting(session, job_id, token)
    job.phase = phase
    job.progress = {**_progress(phase), **(progress or {}), "phase": phase}
    if timings is not None:
        job.timings = timings
    return job


def record_result(session: Session, job_id: str, token: str, prepared: Prepared,
                  status: str | None, actor: str | None) -> tuple[BundleVersion, bool]:
    """Record the job's bundle as a version (blobs already stored) and move the spec's aliases.

    One version per job: a retry gets the version recorded before, with created=False.
    `status` None: as the bundle's validation says (publish.default_status).
    """
    job = _reporting(session, job_id, token)
    existing = (session.get(BundleVersion, job.result_version_id) if job.result_version_id
                else session.scalar(select(BundleVersion).where(BundleVersion.source_job == job.id)))
    if existing is not None:
        job.result_version_id = existing.id
        return existing, False
    refuse_if_cancelled(job)
    model = model_for(session, prepared.manifest, job.model)
    pub = record_version(session, model, prepared, actor, job.id, status)
    job.result_version_id = pub.version.id
    if pub.version.status == "published":
        for alias in job.spec.get("aliases") or ():
            move_alias(session, model, alias, pub.version, actor, f"calibration job {job.id}")
    return pub.version, pub.created


def refuse_if_cancelled(job: Job) -> None:
    """A result that arrives after a cancel was asked is not recorded: nothing published, no
    alias moved. (request_cancel refuses once a result is recorded, so one of the two wins.)"""
    if job.cancel_requested:
        raise JobCancelled(f"job {job.id} was cancelled before its result was recorded; "
                           "nothing was published")


def complete(session: Session, job_id: str, token: str, timings: dict | None = None,
             progress: dict | None = None, error: str | None = None) -> Job:
    """The attempt ended with a result: succeeded, or failed for good with `error` (e.g. the
    bundle did not pass validation and was kept as a draft). Never retried."""
    job = _reporting(session, job_id, token)
    status = "failed" if error else "succeeded"
    if timings is not None:
        job.timings = timings
    job.progress = {**(job.progress or {}), **(progress or {}), "phase": status}
    _finish(job, status, error, now_utc())
    return job


def fail(session: Session, job_id: str, token: str, error: str, retryable: bool = True,
         cancelled: bool = False) -> Job:
    """The attempt ended without completing. Its result recorded -> the job ends with that
    result; cancelled, or a cancel pending -> cancelled (even when the attempt failed for
    another reason: the user asked for it); retryable and attempts left -> queued again; else
    failed."""
    job = leased(session, job_id, token)
    now = now_utc()
    if job.result_version_id is not None and _ended_with_result(
            session, job, now, f"attempt {job.attempts} ended: {error}"):
        pass        # recorded before anything else: never cancelled or failed beside its version
    elif cancelled:
        _finish(job, "cancelled", None, now)
    elif _cancel_if_requested(job, now):
        pass
    elif retryable and job.attempts < job.max_attempts:
        _requeue(job, f"attempt {job.attempts} failed and will be retried: {error}")
    else:
        tried = f" (after {job.attempts} attempts)" if job.attempts > 1 else ""
        _finish(job, "failed", f"{error}{tried}", now)
    return job


def release(session: Session, job_id: str, token: str) -> Job:
    """The worker is shutting down: requeue without spending an attempt (or, if a cancel is
    pending, cancel)."""
    job = leased(session, job_id, token)
    _requeue(job, None, refund=True)
    return job


def release_held_by(session: Session, holders: list[str]) -> list[tuple[str, str]]:
    """Requeue (without spending an attempt; cancel, if a cancel is pending) running jobs leased
    to these workers: the local executor calls this after its workers stopped. Returns (job id,
    new status) per job."""
    if not holders:
        return []
    rows = session.scalars(select(Job).where(Job.status == "running", Job.lease_holder.in_(holders))
                           .with_for_update(skip_locked=True))
    out = []
    for job in rows:
        _requeue(job, None, refund=True)
        out.append((job.id, job.status))
    return out


def sweep(session: Session, now: datetime | None = None) -> list[tuple[str, str]]:
    """Expired leases: requeue, or fail after max_attempts, or finish a cancel whose worker
    died. Returns (job id, new status) per job touched."""
    now = now or now_utc()
    rows = session.scalars(select(Job).where(Job.status == "running", Job.lease_expires_at < now)
                           .order_by(Job.lease_expires_at).limit(100)
                           .with_for_update(skip_locked=True))
    out = []
    for job in rows:
        lost = (f"attempt {job.attempts} lost: {job.lease_holder} stopped heartbeating "
                f"(lease expired {job.lease_expires_at.isoformat(timespec='seconds')})")
        if _cancel_if_requested(job, now):      # a cancel whose worker died
            pass
        elif job.attempts >= job.max_attempts:
            if not _ended_with_result(session, job, now, lost):
                _finish(job, "failed", f"{lost}; gave up after {job.attempts} attempts", now)
        else:
            _requeue(job, f"{lost}; requeued")
        out.append((job.id, job.status))
    return out


def _ended_with_result(session: Session, job: Job, now: datetime, lost: str) -> bool:
    """The last attempt, lost after it recorded the job's result (its version published, the
    aliases moved): the job ends as the worker would have ended it (succeeded, or failed when
    validation kept the bundle a draft), not failed for the lost attempt. (With attempts left
    the job is requeued: a worker that claims it sees the result and only completes it.)"""
    version = session.get(BundleVersion, job.result_version_id) if job.result_version_id else None
    if version is None:
        return False
    if version.status == "draft" and (job.spec or {}).get("publish", True):
        _finish(job, "failed", f"validation failed; the bundle is kept as draft version "
                f"{version.number} of {job.model} with its report ({lost} before it reported)", now)
    else:
        _finish(job, "succeeded", None, now)
    return True


def _requeue(job: Job, reason: str | None, refund: bool = False) -> None:
    """Back to queued (refund: without spending the attempt), or cancelled if that was asked."""
    # claim skips a job with a cancel pending: requeued, it would sit in the queue forever
    if _cancel_if_requested(job, now_utc()):
        return
    if refund:
        job.attempts = max(job.attempts - 1, 0)
    job.status, job.phase = "queued", "queued"
    job.progress = _progress("queued", **({"requeued": reason} if reason else {}))
    job.lease_holder = job.lease_token = job.task_token = job.lease_expires_at = None
    job.timings = {}
    if reason:
        job.error = reason


def _cancel_if_requested(job: Job, now: datetime) -> bool:
    """A job whose attempt ends (or has yet to start) while a cancel is pending ends cancelled:
    what the user asked for, never failed or queued again."""
    if not job.cancel_requested:
        return False
    _finish(job, "cancelled", None, now)
    return True


def _finish(job: Job, status: str, error: str | None, now: datetime) -> None:
    job.status, job.phase = status, status
    job.progress = {**(job.progress or {}), "phase": status}
    job.lease_holder = job.lease_token = job.task_token = job.lease_expires_at = None
    job.finished_at = now
    # only a failed job has an error: one that succeeded or was cancelled kept the reason an
    # earlier attempt was requeued for ("attempt 2 lost: ..."), which read as why it ended
    job.error = error if status == "failed" else None
