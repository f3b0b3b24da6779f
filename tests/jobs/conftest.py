"""Jobs test fixtures.

- `jobs_api`: the real registry over HTTP (SQLite and PostgreSQL) with a short lease setting,
  and two JobsClients: `submitter` (scopes jobs:submit and bundles:publish: its specs may move
  aliases) and `worker` (scope jobs:work). Tests
  drive the worker protocol through the real client; no model is loaded.
- `four_layers`: the test model cut to its first 4 blocks (a GGUF path), for the fault tests.
- tests/jobs/serve.py runs `oscar-zoo serve` as a process, with its local workers (the tests
  that run the real test model).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from oscar_zoo.zoo.jobs_client import JobsClient

LEASE_S = 3          # sweeper interval: 0.5 s


@pytest.fixture(scope="session")
def four_layers() -> str:
    """Path of the test model's first 4 blocks as a GGUF (made once, kept in .cache)."""
    from .serve import trimmed_gguf

    return str(trimmed_gguf(4))


@dataclass
class JobsApi:
    server: object
    submitter: JobsClient
    worker: JobsClient

    def submit(self, **spec) -> dict:
        job, created = self.submitter.submit({"model": "smollm2-135m", **spec})
        assert created
        return job


@pytest.fixture
def jobs_api(monkeypatch, registry_db_url, tmp_path):
    monkeypatch.setenv("OSCAR_ZOO_JOB_LEASE_SECONDS", str(LEASE_S))
    from tests.utils.registry_server import run_registry

    with run_registry(registry_db_url, tmp_path / "registry-data") as server:
        with JobsClient(server.url, server.token("jobs:submit", "bundles:publish", name="owner")) as submitter, \
                JobsClient(server.url, server.token("jobs:work", name="gpu-worker")) as worker:
            yield JobsApi(server, submitter, worker)
