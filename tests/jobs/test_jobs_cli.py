"""`oscar-zoo jobs` against the real registry (SQLite and PostgreSQL): short ids in the list,
a job named by a prefix of its id, a cancel refused to a token that did not submit the job."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from oscar_zoo.registry_db.models import Job
from oscar_zoo.zoo.cli.main import cli


@pytest.fixture
def jobs_cli(jobs_api, monkeypatch):
    """jobs_cli(*args, token=the submitter's): `oscar-zoo jobs ARGS` on the jobs_api registry."""
    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", jobs_api.server.url)

    def run(*args: str, token: str | None = None):
        monkeypatch.setenv("OSCAR_ZOO_TOKEN", token or jobs_api.submitter.registry.token)
        return CliRunner().invoke(cli, ["jobs", *args])

    return run


def test_list_shows_short_ids_and_json_whole_ones(jobs_api, jobs_cli):
    ids = [jobs_api.submit()["id"] for _ in range(2)]
    shown = jobs_cli("list")
    assert shown.exit_code == 0, shown.output
    rows = shown.stdout.splitlines()
    assert rows[0].split()[:2] == ["id", "status"]
    assert [r.split()[0] for r in rows[1:]] == [i[:8] for i in ids[::-1]]
    assert not any(i in shown.stdout for i in ids)
    whole = jobs_cli("list", "--json")
    assert [j["id"] for j in json.loads(whole.stdout)] == ids[::-1]


def test_status_cancel_and_watch_take_a_prefix(jobs_api, jobs_cli):
    job = jobs_api.submit()["id"]
    shown = jobs_cli("status", job[:8])
    assert shown.exit_code == 0 and f"job         {job}" in shown.stdout, shown.output
    cancelled = jobs_cli("cancel", job[:10])
    assert cancelled.exit_code == 0 and f"job {job}: cancelled" in cancelled.stderr, cancelled.output
    watched = jobs_cli("watch", job[:8], "--json")
    assert watched.exit_code == 1 and json.loads(watched.stdout)["id"] == job, watched.output


def test_a_prefix_of_several_jobs_is_refused_naming_them(jobs_api, jobs_cli):
    ids = ["cafef00d-0000-4000-8000-000000000001", "cafef00d-0000-4000-8000-000000000002"]
    for new_id in ids:
        old = jobs_api.submit()["id"]
        with jobs_api.server.registry.db.write() as session:
            session.get(Job, old).id = new_id
    for cmd in ("status", "cancel", "watch"):
        result = jobs_cli(cmd, "cafef00d")
        assert result.exit_code == 1, (cmd, result.output)
        assert "ambiguous" in result.stderr and all(i in result.stderr for i in ids), result.stderr
    assert jobs_cli("status", "cafef00d-0000-4000-8000-000000000002").exit_code == 0


def test_cancel_by_a_token_that_did_not_submit_the_job_says_who_may(jobs_api, jobs_cli):
    job = jobs_api.submit()["id"]
    other = jobs_api.server.token("jobs:submit", name="intern")
    refused = jobs_cli("cancel", job[:8], token=other)
    assert refused.exit_code == 1, refused.output
    assert "submitted by token:owner" in refused.stderr
    assert "cancel it with that token or an admin token" in refused.stderr
    assert jobs_api.submitter.get(job)["status"] == "queued"
