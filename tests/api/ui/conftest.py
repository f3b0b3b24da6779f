"""Fixtures for the web UI tests: a registry with a few validated versions, and job rows."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from tests.api.ui.seeding import make_validated_bundle


@dataclass
class Seeded:
    server: object
    bundles: dict[tuple[str, int], Path]    # (model, version number) -> bundle directory


PLAN = [("smollm2-135m", dict(seed=0, passed=False)), ("smollm2-135m", dict(seed=1)),
        ("smollm2-135m", dict(seed=2, per_head=True, centered=True)),
        ("qwen3.5-4b", dict(seed=3, per_head=True))]


@pytest.fixture(scope="session")
def seed_bundles(tmp_path_factory) -> list[tuple[str, Path]]:
    """smollm2-135m: failed validation; per layer; per KV head with centered keys. qwen3.5-4b:
    hybrid attention, per KV head. Made once per session (random QR is the slow part)."""
    root = tmp_path_factory.mktemp("ui-bundles")
    out = []
    for i, (model, kw) in enumerate(PLAN):
        make_validated_bundle(root / f"b{i}", model=model, **kw)
        out.append((model, root / f"b{i}"))
    return out


def seed(server, bundles: list[tuple[str, Path]]) -> Seeded:
    """Publish the bundles (smollm2-135m becomes v1..v3, qwen3.5-4b v1) and point smollm2's
    `recommended` at v2."""
    published = {}
    for model, path in bundles:
        # published even where validation failed (v1): asked, as the pages show such versions
        number = server.publish_dir(path, created_by="seed", status="published").version.number
        published[(model, number)] = path
    with server.client(server.token("bundles:publish")) as http:
        r = http.put("/v1/models/smollm2-135m/aliases/recommended",
                     json={"version": 2, "reason": "best of the three"})
        assert r.status_code == 200, r.text
    return Seeded(server, published)


@pytest.fixture
def seeded(registry_server, seed_bundles) -> Seeded:
    return seed(registry_server, seed_bundles)


def add_job(server, model: str = "smollm2-135m", status: str = "running", **fields) -> str:
    """A job row as the jobs API would write it; returns its id."""
    from oscar_zoo.registry_db.models import Job

    now = datetime.now(timezone.utc)
    values = dict(spec={"model": model, "tokens": 8192}, model=model, status=status,
                  phase="pass1", progress={"phase": "pass1", "done": 0, "total": 30, "layer": 0},
                  attempts=1, created_at=now, updated_at=now, heartbeat_at=now, started_at=now)
    if status == "running":  # a live lease, so the server's sweeper leaves the row alone
        values.update(lease_holder="test-worker", lease_expires_at=now + timedelta(hours=1))
    values.update(fields)
    with server.registry.db.write() as session:
        job = Job(**values)
        session.add(job)
        session.flush()
        return job.id


def update_job(server, job_id: str, **fields) -> None:
    from oscar_zoo.registry_db.models import Job

    with server.registry.db.write() as session:
        job = session.get(Job, job_id)
        for key, value in fields.items():
            setattr(job, key, value)
        job.updated_at = datetime.now(timezone.utc)
