"""An idempotency key is the submitting token's own (over real HTTP, SQLite and PostgreSQL): a
key was global, so token B sending the key token A had used got A's job back, and could not
submit a job of its own under a key it chose."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from oscar_zoo.registry_db.models import ApiToken, Job
from oscar_zoo.registry_db.tokens import hash_token
from oscar_zoo.zoo.errors import Conflict
from oscar_zoo.zoo.jobs_client import JobsClient

SPEC = {"model": "smollm2-135m", "tokens": 4096}


def _owner(server, job_id: str) -> int | None:
    with server.registry.db.read() as session:
        return session.get(Job, job_id).created_by_token_id


def _token_id(server, token: str) -> int:
    with server.registry.db.read() as session:
        return session.scalar(select(ApiToken.id).where(ApiToken.token_hash == hash_token(token)))


def test_another_token_with_the_same_key_gets_a_job_of_its_own(registry_server):
    server = registry_server
    a, b, c = (server.token("jobs:submit", name=n) for n in "abc")
    with JobsClient(server.url, a) as first, JobsClient(server.url, b) as second, \
            JobsClient(server.url, c) as third:
        mine, created = first.submit(SPEC, idempotency_key="nightly")
        assert created
        theirs, created = second.submit(SPEC, idempotency_key="nightly")
        assert created and theirs["id"] != mine["id"], theirs
        assert (_owner(server, mine["id"]), _owner(server, theirs["id"])) == (
            _token_id(server, a), _token_id(server, b))
        # each token's retry finds its own job
        for client, job in ((first, mine), (second, theirs)):
            again, created = client.submit(SPEC, idempotency_key="nightly")
            assert not created and again["id"] == job["id"]
        # a spec of a third token's own under the key is its to send: no conflict with A's job
        other, created = third.submit({**SPEC, "tokens": 8192}, idempotency_key="nightly")
        assert created and other["id"] not in (mine["id"], theirs["id"])
        # within one token a key still means one spec, and the conflict names that token's job
        with pytest.raises(Conflict) as refused:
            second.submit({**SPEC, "tokens": 8192}, idempotency_key="nightly")
        assert theirs["id"] in str(refused.value) and mine["id"] not in str(refused.value)
