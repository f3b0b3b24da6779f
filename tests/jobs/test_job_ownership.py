"""Who may cancel a job: the token that submitted it, or an admin token (over real HTTP, on
SQLite and PostgreSQL). A revoked token's name can be given to a new one, so the job records
the submitting token's id, not its name."""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import select

from oscar_zoo.registry_db.models import ApiToken, Job
from oscar_zoo.registry_db.tokens import hash_token, revoke_token
from oscar_zoo.zoo.errors import Forbidden, InvalidInput
from oscar_zoo.zoo.jobs_client import JobsClient


def _token_id(api, token: str) -> int:
    with api.server.registry.db.read() as session:
        return session.scalar(select(ApiToken.id).where(ApiToken.token_hash == hash_token(token)))


def _job_row(api, job_id: str) -> tuple[int | None, str | None]:
    with api.server.registry.db.read() as session:
        job = session.get(Job, job_id)
        return job.created_by_token_id, job.created_by


def test_another_token_may_not_cancel_the_job_its_submitter_and_an_admin_may(jobs_api):
    api = jobs_api
    owner_id = _token_id(api, api.submitter.registry.token)
    mine, theirs = api.submit(), api.submit()
    assert _job_row(api, mine["id"]) == (owner_id, "token:owner")
    with pytest.raises(InvalidInput, match="a live token is already named 'owner'"):
        api.server.token("jobs:submit", name="owner")
    namesake = api.server.token("jobs:submit", name="not-owner")
    with JobsClient(api.server.url, namesake) as other:
        for ref in (mine["id"], mine["id"][:8]):
            with pytest.raises(Forbidden) as refused:
                other.cancel(ref)
            assert (f"job {mine['id']} was submitted by token:owner (id {owner_id}); cancel it "
                    "with that token or an admin token") in str(refused.value)
    r = httpx.post(f"{api.server.url}/v1/jobs/{mine['id']}/cancel",
                   headers={"Authorization": f"Bearer {namesake}"})
    assert r.status_code == 403 and r.headers["content-type"] == "application/problem+json"
    assert api.submitter.get(mine["id"])["status"] == "queued"      # the refusal changed nothing

    assert api.submitter.cancel(mine["id"])["status"] == "cancelled"
    with JobsClient(api.server.url, api.server.token("admin", name="ops")) as admin:
        assert admin.cancel(theirs["id"])["status"] == "cancelled"


def test_a_running_job_is_refused_to_another_token_too(jobs_api):
    api = jobs_api
    job = api.submit(lease_seconds=30)
    lease = api.worker.claim("w", 0)["lease"]["token"]
    with JobsClient(api.server.url, api.server.token("jobs:submit", name="other")) as other, \
            pytest.raises(Forbidden, match="cancel it with that token or an admin token"):
        other.cancel(job["id"])
    assert api.worker.heartbeat(job["id"], lease)["cancel_requested"] is False
    assert api.submitter.cancel(job["id"])["cancel_requested"] is True


def test_the_same_key_from_another_token_is_another_job_and_does_not_take_the_first_over(jobs_api):
    """Keys are each token's own: another token's `nightly` was answered with the owner's job."""
    api = jobs_api
    spec = {"model": "smollm2-135m", "tokens": 4096}
    job, created = api.submitter.submit(spec, idempotency_key="nightly")
    assert created
    with JobsClient(api.server.url, api.server.token("jobs:submit", name="other")) as other:
        again, created = other.submit(spec, idempotency_key="nightly")
        assert created and again["id"] != job["id"]
        assert other.submit(spec, idempotency_key="nightly")[0]["id"] == again["id"]
        assert _job_row(api, job["id"]) == (_token_id(api, api.submitter.registry.token),
                                             "token:owner")
        with pytest.raises(Forbidden, match="submitted by token:owner"):
            other.cancel(job["id"])
    assert api.submitter.cancel(job["id"])["status"] == "cancelled"


def test_a_job_of_a_revoked_token_is_cancelled_by_an_admin_token_only(jobs_api):
    api = jobs_api
    token = api.server.token("jobs:submit", name="ci")
    with JobsClient(api.server.url, token) as ci:
        job, _ = ci.submit({"model": "smollm2-135m"})
    with api.server.registry.db.write() as session:
        revoke_token(session, token)
    with pytest.raises(Forbidden, match="revoked since; only an admin token can cancel it"):
        api.submitter.cancel(job["id"])
    with JobsClient(api.server.url, api.server.token("jobs:submit", name="ci")) as namesake, \
            pytest.raises(Forbidden, match="revoked since"):     # the name is free again: not the job
        namesake.cancel(job["id"])
    with JobsClient(api.server.url, api.server.token("admin")) as admin:
        assert admin.cancel(job["id"])["status"] == "cancelled"


def test_a_job_submitted_before_the_submitter_was_recorded_is_an_admin_tokens_to_cancel(jobs_api):
    api = jobs_api
    job = api.submit()
    with api.server.registry.db.write() as session:
        session.get(Job, job["id"]).created_by_token_id = None     # as migration 0008 leaves it
    with pytest.raises(Forbidden, match="only an admin token can cancel it") as refused:
        api.submitter.cancel(job["id"])
    assert "by token:owner" in str(refused.value)
    with JobsClient(api.server.url, api.server.token("admin")) as admin:
        assert admin.cancel(job["id"])["status"] == "cancelled"


def test_migration_0008_leaves_older_jobs_without_a_submitting_token(registry_db_url):
    from oscar_zoo.registry_db import jobs, migrate
    from oscar_zoo.registry_db.session import Database

    db = Database(registry_db_url)
    migrate.upgrade(db, "0007")
    with db.write() as session:    # Core: today's model has the column 0008 adds
        session.execute(Job.__table__.insert(), [dict(
            id="0123abcd-0000-4000-8000-000000000000", spec={}, status="queued",
            phase="queued", progress={}, created_by="token:owner")])
    migrate.upgrade(db)
    with db.write() as session:
        assert session.scalar(select(Job.created_by_token_id)) is None
        with pytest.raises(Forbidden, match="only an admin token"):
            jobs.request_cancel(session, "0123abcd", "token:owner", token_id=1)
    with db.write() as session:
        job = jobs.request_cancel(session, "0123abcd", "token:ops", token_id=2, admin=True)
        assert job.status == "cancelled"
    db.dispose()


def test_a_worker_token_revoked_during_a_long_poll_claims_nothing(jobs_api):
    """The token was checked once, when the claim began: revoked while the claim waited for a
    job, it still leased the next one, which then sat unrun until its lease ran out."""
    import threading
    import time

    from oscar_zoo.zoo.errors import Unauthorized

    outcome = {}

    def claim():
        try:
            outcome["got"] = jobs_api.worker.claim("w1", 1, wait=10)
        except Exception as e:  # noqa: BLE001 - asserted below
            outcome["error"] = e

    thread = threading.Thread(target=claim)
    thread.start()
    time.sleep(1.0)                                 # the claim is waiting now
    with jobs_api.server.registry.db.write() as session:
        revoke_token(session, "gpu-worker")
    job = jobs_api.submit()
    thread.join(20)
    assert isinstance(outcome.get("error"), Unauthorized), outcome
    assert "revoked while this request was in progress" in str(outcome["error"])
    assert jobs_api.submitter.get(job["id"])["status"] == "queued"


def test_a_worker_token_revoked_during_a_result_upload_records_nothing(jobs_api, tmp_path,
                                                                     monkeypatch):
    """The token was checked when the upload began only: revoked while its bytes were stored
    (a large bundle takes a while), the result was still recorded and published."""
    from oscar_zoo.api.routes import workers
    from oscar_zoo.zoo.errors import Unauthorized
    from tests.utils.bundles import make_bundle

    job = jobs_api.submit(lease_seconds=60)     # held while the bundle is written
    lease = jobs_api.worker.claim("w1", 0)["lease"]["token"]
    real = workers.store_blobs

    def revoked_meanwhile(blobs, prepared):
        with jobs_api.server.registry.db.write() as session:
            revoke_token(session, "gpu-worker")
        return real(blobs, prepared)

    monkeypatch.setattr(workers, "store_blobs", revoked_meanwhile)
    make_bundle(tmp_path / "a", seed=1)
    with pytest.raises(Unauthorized, match="revoked while this request was in progress"):
        jobs_api.worker.upload_result(job["id"], lease, tmp_path / "a", "published")
    got = jobs_api.submitter.get(job["id"])
    assert got["result_version"] is None and got["status"] == "running"
