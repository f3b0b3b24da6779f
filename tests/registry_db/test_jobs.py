"""Job state changes in the database (registry_db/jobs.py), on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from oscar_zoo.registry_db import jobs
from oscar_zoo.registry_db.tokens import hash_token
from oscar_zoo.zoo.errors import Conflict, LeaseLost


def submit(registry, gpus: int = 1, **spec) -> str:
    with registry.db.write() as s:
        job, _ = jobs.submit(s, {"model": "smollm2-135m", **spec}, model="smollm2-135m",
                             gpus=gpus, max_attempts=3, lease_seconds=60)
        return job.id


def claim(registry, worker: str = "w1", gpus: int | None = 1) -> tuple[str, str] | None:
    with registry.db.write() as s:
        got = jobs.claim(s, worker, gpus)
        return (got[0].id, got[1]) if got else None


def status(registry, job_id: str) -> tuple[str, bool]:
    with registry.db.read() as s:
        job = jobs.get(s, job_id)
        return job.status, job.cancel_requested


# --- submit: a retry with the idempotency key -------------------------------------------------

# A completed spec, as the API stores it: every default filled in.
COMPLETED = {"model": "smollm2-135m", "tokens": 4096, "seed": 0, "clip_search": True,
             "lease_seconds": 60.0, "validation": {"windows": 6, "context_len": 2048}}


def submit_with_key(registry, given: dict | None, **spec) -> tuple[str, bool]:
    with registry.db.write() as s:
        job, created = jobs.submit(s, {**COMPLETED, **spec}, model="smollm2-135m", gpus=1,
                                   max_attempts=3, lease_seconds=60, idempotency_key="nightly",
                                   given=given)
        return job.id, created


def test_a_retry_is_compared_on_the_fields_either_request_set(registry):
    """Only the retry's fields were compared: a retry that left out the first request's seed
    and validation windows got the job made for them."""
    first, created = submit_with_key(registry, {"model": True, "seed": True, "clip_search": True,
                                                "validation": {"windows": True}},
                                     seed=7, validation={"windows": 3, "context_len": 2048})
    assert created
    with pytest.raises(Conflict, match=r"differs in seed, validation\.windows\)"):
        submit_with_key(registry, {"model": True})
    with pytest.raises(Conflict, match=r"differs in seed\)"):
        submit_with_key(registry, {"model": True, "validation": True},
                        validation={"windows": 3, "context_len": 2048})
    # the same values, whoever set them: the same job (clip_search was set to its default)
    assert submit_with_key(registry, {"model": True, "seed": True,
                                      "validation": {"context_len": True}},
                           seed=7, validation={"windows": 3, "context_len": 2048}) == (first, False)
    # a field neither request set is a default, which an operator may have changed since
    assert submit_with_key(registry, {"model": True, "seed": True, "validation": {"windows": True}},
                           seed=7, validation={"windows": 3, "context_len": 2048},
                           lease_seconds=120.0) == (first, False)


def test_a_job_stored_before_its_given_fields_were_is_compared_on_the_retrys(registry):
    first, _ = submit_with_key(registry, {"model": True, "seed": True}, seed=7)
    with registry.db.write() as s:
        jobs.get(s, first).given_fields = None          # as migration 0004 leaves older jobs
    assert submit_with_key(registry, {"model": True}) == (first, False)
    with pytest.raises(Conflict, match=r"differs in seed\)"):
        submit_with_key(registry, {"model": True, "seed": True}, seed=8)


def test_a_retry_without_given_fields_is_compared_on_the_whole_spec(registry):
    first, _ = submit_with_key(registry, {"model": True, "seed": True}, seed=7)
    assert submit_with_key(registry, None, seed=7) == (first, False)
    with pytest.raises(Conflict, match=r"differs in lease_seconds, tokens\)"):
        submit_with_key(registry, None, seed=7, tokens=8192, lease_seconds=120.0)


# --- a cancel pending when the attempt ends ----------------------------------------------------

def _fail_retryable(s, job_id, token):
    jobs.fail(s, job_id, token, "child died", retryable=True)


def _release(s, job_id, token):
    jobs.release(s, job_id, token)


def _release_held_by(s, job_id, token):
    [(released, status)] = jobs.release_held_by(s, ["w1"])
    assert released == job_id and status == jobs.get(s, job_id).status


def _fail_for_good(s, job_id, token):
    jobs.fail(s, job_id, token, "no node can place the task", retryable=False)


def _fail_last_attempt(s, job_id, token):
    jobs.get(s, job_id).attempts = 3        # max_attempts: no retry left
    jobs.fail(s, job_id, token, "child died", retryable=True)


@pytest.mark.parametrize("end", [_fail_retryable, _fail_for_good, _fail_last_attempt, _release,
                                 _release_held_by],
                         ids=["fail-retryable", "fail-for-good", "fail-last-attempt", "release",
                              "release-held-by"])
def test_a_cancel_pending_when_the_attempt_ends_cancels_the_job(registry, end):
    """The worker had not heard of the cancel yet when its attempt ended: the job went back to
    queued with cancel_requested set, which claim skips: queued forever."""
    job_id = submit(registry)
    _, token = claim(registry)
    with registry.db.write() as s:
        jobs.request_cancel(s, job_id, "token:ops", token_id=0, admin=True)
    assert status(registry, job_id) == ("running", True)
    with registry.db.write() as s:
        end(s, job_id, token)
    assert status(registry, job_id)[0] == "cancelled"
    with registry.db.read() as s:
        job = jobs.get(s, job_id)
        assert job.finished_at is not None and job.lease_token is None


def _expire_lease(registry, job_id: str) -> list[tuple[str, str]]:
    """The attempt's worker stops heartbeating; the sweep finds it."""
    from datetime import timedelta

    with registry.db.write() as s:
        jobs.get(s, job_id).lease_expires_at = jobs.now_utc() - timedelta(seconds=1)
        return jobs.sweep(s)


def _end_by_sweep(registry, job_id, token):
    _expire_lease(registry, job_id)


def _end_by_fail(registry, job_id, token):
    with registry.db.write() as s:
        _fail_retryable(s, job_id, token)


def _end_cancelled(registry, job_id, token):
    with registry.db.write() as s:
        jobs.fail(s, job_id, token, "cancelled during pass1", cancelled=True)


@pytest.mark.parametrize("end", [None, _end_by_sweep, _end_by_fail, _end_cancelled],
                         ids=["while-queued", "sweep", "fail", "fail-cancelled"])
def test_a_cancelled_job_keeps_no_error_of_an_earlier_lost_attempt(registry, end):
    """A job requeued after a lost attempt, then cancelled, still said "attempt 1 lost: ...;
    requeued" as its error, while a job that succeeded after one had it cleared."""
    job_id = submit(registry)
    claim(registry)
    assert _expire_lease(registry, job_id) == [(job_id, "queued")]
    with registry.db.read() as s:
        assert jobs.get(s, job_id).error.startswith("attempt 1 lost: w1 stopped heartbeating")
    token = claim(registry, "w2")[1] if end else None
    with registry.db.write() as s:
        jobs.request_cancel(s, job_id, "token:ops", token_id=0, admin=True)
    if end:                 # a running job: its attempt ends with the cancel pending
        end(registry, job_id, token)
    with registry.db.read() as s:
        job = jobs.get(s, job_id)
        assert (job.status, job.error) == ("cancelled", None)


@pytest.mark.parametrize("end, attempts", [(_fail_retryable, 1), (_release, 0),
                                            (_release_held_by, 0)],
                         ids=["fail-retryable", "release", "release-held-by"])
def test_without_a_cancel_the_job_is_queued_again(registry, end, attempts):
    job_id = submit(registry)
    _, token = claim(registry)
    with registry.db.write() as s:
        end(s, job_id, token)
    assert status(registry, job_id) == ("queued", False)
    with registry.db.read() as s:
        assert jobs.get(s, job_id).attempts == attempts     # a release spends no attempt
    assert claim(registry, "w2")[0] == job_id


# --- claim: the oldest job this worker can run, however far back ----------------------------

def test_a_job_behind_a_full_batch_of_bigger_ones_is_claimed(registry):
    """claim read the oldest CLAIM_BATCH queued jobs and filtered by GPUs after the LIMIT: a
    1-GPU worker got nothing while a 1-GPU job waited behind 32 8-GPU ones."""
    for seed in range(jobs.CLAIM_BATCH):
        submit(registry, gpus=8, seed=seed)
    small = submit(registry, gpus=1)
    assert claim(registry, gpus=1)[0] == small
    assert claim(registry, gpus=1) is None
    assert claim(registry, gpus=8) is not None       # the big ones are still there for others


@pytest.mark.parametrize("ray_jobs", [jobs.CLAIM_BATCH, jobs.CLAIM_BATCH + 1])
def test_a_job_behind_a_full_batch_of_ray_jobs_is_claimed(registry, ray_jobs):
    for seed in range(ray_jobs):
        submit(registry, seed=seed, ray_resources={"tpu": 1.0})
    plain = submit(registry)
    assert claim(registry, gpus=None)[0] == plain
    assert claim(registry, gpus=None) is None        # the queue holds only Ray jobs now
    with registry.db.write() as s:
        job, _ = jobs.claim(s, "ray-dispatcher", None, ray=True)
        assert job.spec["seed"] == 0                  # Ray's oldest first


# --- attach: a Ray task takes over its dispatcher's lease --------------------------------------

def attach(registry, job_id: str, token: str, worker: str) -> tuple[str, int, str | None]:
    with registry.db.write() as s:
        job, _ = jobs.attach(s, job_id, token, worker)
        return job.status, job.attempts, job.error


def attached_token(registry, job_id: str, token: str, worker: str) -> str | None:
    """The token attach gives the task for its later calls."""
    with registry.db.write() as s:
        return jobs.attach(s, job_id, token, worker)[1]


def dispatched(registry, max_attempts: int = 3) -> tuple[str, str]:
    """A job the Ray dispatcher claimed (one attempt counted), its task yet to attach."""
    job_id = submit(registry)
    with registry.db.write() as s:
        jobs.get(s, job_id).max_attempts = max_attempts
        got = jobs.claim(s, "dispatch:host:1:abc", None, ray=True)
        return got[0].id, got[1]


FIRST_TASK, RETRY = "ray-task:host:42:0123456789ab:f00", "ray-task:host:43:0123456789ab:b0a"


def test_an_attach_whose_reply_was_lost_is_not_a_second_attempt(registry):
    """The task retries its attach through registry blips: when the first one landed and only
    its reply was lost, the retry (the same task, the same name) is the same attempt."""
    job_id, token = dispatched(registry)
    task = FIRST_TASK
    assert attach(registry, job_id, token, task) == ("running", 1, None)
    with registry.db.write() as s:
        jobs.get(s, job_id).timings = {"loading": 1.5}      # the attempt has begun reporting
    assert attach(registry, job_id, token, task) == ("running", 1, None)
    with registry.db.read() as s:
        job = jobs.get(s, job_id)
        assert job.timings == {"loading": 1.5} and job.lease_holder == task
    # Ray's retry of a task whose process died is another process: a new attempt
    assert attach(registry, job_id, token, RETRY)[:2] == ("running", 2)


def test_an_attach_fences_the_task_before_it_but_not_the_dispatcher(registry):
    """Ray retried a task whose node it took for dead while the first process lived on (a
    partition): both had attached with the dispatcher's token and reported with it, so both
    could beat, report progress and complete."""
    job_id, claimed = dispatched(registry)
    first = attached_token(registry, job_id, claimed, FIRST_TASK)
    assert first and first != claimed
    # its reply was lost: attached again, it gets the same token, though only its hash is kept
    # (a retry racing the first request: whichever lands last, the task's token holds)
    assert attached_token(registry, job_id, claimed, FIRST_TASK) == first
    with registry.db.write() as s:
        jobs.heartbeat(s, job_id, first)
    retry = attached_token(registry, job_id, claimed, RETRY)
    assert retry and retry not in (first, claimed)
    for call in (lambda s: jobs.heartbeat(s, job_id, first),
                 lambda s: jobs.report_progress(s, job_id, first, "pass1"),
                 lambda s: jobs.complete(s, job_id, first),
                 lambda s: jobs.fail(s, job_id, first, "broke"),
                 lambda s: jobs.release(s, job_id, first),
                 lambda s: jobs.attach(s, job_id, first, FIRST_TASK)):
        with pytest.raises(LeaseLost), registry.db.write() as s:
            call(s)
    with pytest.raises(LeaseLost, match="the dispatcher claimed"), registry.db.write() as s:
        jobs.attach(s, job_id, retry, "ray-task:host:44:0123456789ab:c0c")  # a task's token
    for call in (lambda s: jobs.report_progress(s, job_id, claimed, "pass1"),
                 lambda s: jobs.complete(s, job_id, claimed)):   # the task's alone, now
        with pytest.raises(LeaseLost, match="attached task"), registry.db.write() as s:
            call(s)
    with registry.db.write() as s:
        jobs.heartbeat(s, job_id, claimed)                # the dispatcher beats while it waits
        jobs.report_progress(s, job_id, retry, "pass1")
        job = jobs.complete(s, job_id, retry)
        assert (job.status, job.attempts, job.lease_token, job.task_token) == ("succeeded", 2,
                                                                               None, None)


def test_a_replaced_task_cannot_take_the_lease_back_by_attaching_again(registry):
    """The first task's attach landed but its reply was lost, and Ray's retry attached before
    the first task retried its own: that late attach used to count a third attempt and fence
    the retry, leaving the process Ray had given up on to run the job."""
    job_id, claimed = dispatched(registry)
    attached_token(registry, job_id, claimed, FIRST_TASK)
    retry = attached_token(registry, job_id, claimed, RETRY)
    with pytest.raises(LeaseLost, match="replaced by a later one"), registry.db.write() as s:
        jobs.attach(s, job_id, claimed, FIRST_TASK)
    assert attached_token(registry, job_id, claimed, RETRY) == retry   # its own lost reply
    with registry.db.write() as s:
        job = jobs.report_progress(s, job_id, retry, "pass1")
        assert (job.attempts, job.lease_holder, job.task_token) == (2, RETRY, hash_token(retry))


def test_a_requeued_job_keeps_no_task_token(registry):
    job_id, claimed = dispatched(registry, max_attempts=4)
    attached_token(registry, job_id, claimed, FIRST_TASK)
    task = attached_token(registry, job_id, claimed, RETRY)
    with registry.db.write() as s:
        jobs.fail(s, job_id, claimed, "the Ray task failed: WorkerCrashedError")   # dispatcher
        job = jobs.get(s, job_id)
        assert job.task_token is None and job.fenced_holders == [FIRST_TASK]
    again, reclaimed = claim(registry, "dispatch:host:2:def", None)
    assert again == job_id and reclaimed not in (claimed, task)
    with registry.db.read() as s:   # the old claim's tasks hold its token, which is gone
        assert jobs.get(s, job_id).fenced_holders is None
    with pytest.raises(LeaseLost), registry.db.write() as s:
        jobs.heartbeat(s, job_id, task)


@pytest.mark.parametrize("attached_before", [False, True], ids=["first-attach", "ray-retry"])
@pytest.mark.parametrize("max_attempts", [1, 3])
def test_an_attach_to_a_job_with_a_cancel_pending_cancels_it(registry, attached_before,
                                                               max_attempts):
    """Not `failed` ("gave up after N attempts") when the attempts are spent, and no new
    attempt when they are not: the user asked for a cancel."""
    job_id, token = dispatched(registry, max_attempts)
    if attached_before:
        attach(registry, job_id, token, FIRST_TASK)
    with registry.db.write() as s:
        jobs.request_cancel(s, job_id, "token:ops", token_id=0, admin=True)
    status, attempts, error = attach(registry, job_id, token, RETRY)
    assert (status, attempts, error) == ("cancelled", 1, None)
    with registry.db.read() as s:
        assert jobs.get(s, job_id).lease_token is None


def _cancel_events(registry, job_id) -> int:
    from sqlalchemy import func, select

    from oscar_zoo.registry_db.models import AuditEvent
    with registry.db.read() as s:
        return s.scalar(select(func.count()).select_from(AuditEvent).where(
            AuditEvent.action == "job.cancel", AuditEvent.target == f"job:{job_id}"))


@pytest.mark.parametrize("running", [False, True], ids=["queued", "running"])
def test_a_repeated_cancel_changes_nothing_and_records_one_event(registry, running):
    """A client retrying its cancel (a timeout, a second click) got 202 and a second audit row."""
    job_id = submit(registry)
    if running:
        claim(registry)
    for _ in range(2):
        with registry.db.write() as s:
            jobs.request_cancel(s, job_id, "token:ops", token_id=0, admin=True)
    assert status(registry, job_id) == (("running", True) if running else ("cancelled", False))
    assert _cancel_events(registry, job_id) == 1


# --- fencing tokens are stored as their hash ---------------------------------------------------

def test_the_lease_tokens_are_stored_as_their_hash_only(registry):
    """The claim's and the attached task's tokens were stored as given: anyone reading the
    database (a dump, a backup, a read-only replica) could heartbeat, fail or publish for any
    running job. Only what the registry handed out holds the lease, never what it stored."""
    job_id, claimed = dispatched(registry)
    task = attached_token(registry, job_id, claimed, FIRST_TASK)
    with registry.db.read() as s:
        job = jobs.get(s, job_id)
        stored = (job.lease_token, job.task_token)
    assert stored == (hash_token(claimed), hash_token(task))
    assert claimed not in stored and task not in stored
    for leaked in stored:
        with pytest.raises(LeaseLost), registry.db.write() as s:
            jobs.heartbeat(s, job_id, leaked)
        with pytest.raises(LeaseLost), registry.db.write() as s:
            jobs.attach(s, job_id, leaked, "ray-task:thief")
    with registry.db.write() as s:
        jobs.heartbeat(s, job_id, claimed)
        jobs.report_progress(s, job_id, task, "pass1")


def test_a_token_that_is_not_ascii_holds_no_lease(registry):
    """Hashing a lone surrogate (JSON may carry one) raised UnicodeEncodeError: a 500, not 409."""
    submit(registry)
    job_id, token = claim(registry)
    for odd in ("\udcff", token[:-1] + "\u00e9"):
        with pytest.raises(LeaseLost), registry.db.write() as s:
            jobs.heartbeat(s, job_id, odd)


def test_a_job_whose_submitter_expired_is_an_admin_tokens_to_cancel(registry):
    """The refusal said to cancel with the submitting token, which its expiry made useless."""
    from datetime import datetime, timedelta, timezone

    from oscar_zoo.registry_db.tokens import create_token
    from oscar_zoo.zoo.errors import Forbidden

    with registry.db.write() as s:
        owner, _ = create_token(s, ["jobs:submit"], "ci", expires_in=timedelta(hours=1))
        other, _ = create_token(s, ["jobs:submit"], "other")
        job, _ = jobs.submit(s, {"model": "smollm2-135m"}, model="smollm2-135m", gpus=1,
                             max_attempts=3, lease_seconds=60, created_by_token_id=owner.id)
        ids = (job.id, owner.id, other.id)
    with registry.db.write() as s:
        with pytest.raises(Forbidden, match="cancel it with that token or an admin token"):
            jobs.request_cancel(s, ids[0], "token:other", token_id=ids[2])
        s.get(jobs.ApiToken, ids[1]).expires_at = datetime.now(timezone.utc) - timedelta(seconds=1)
    with registry.db.write() as s:
        with pytest.raises(Forbidden, match=r"\(id \d+\), which has expired; only an admin token"):
            jobs.request_cancel(s, ids[0], "token:other", token_id=ids[2])
        assert jobs.request_cancel(s, ids[0], "token:admin", token_id=ids[2],
                                   admin=True).status == "cancelled"
