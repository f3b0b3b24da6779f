"""Pytest fixtures for anything that needs a registry (imported by tests/conftest.py).

- `registry_backend`: "sqlite" or "postgresql" (every test using the fixtures below runs on both;
  PostgreSQL is skipped, with the reason, only when the server is unreachable).
- `registry_db_url`: an empty database of that backend, dropped after the test.
- `registry_server`: the real registry over HTTP on loopback (tests/utils/registry_server.py:
  RegistryServer with .url, .client(token), .token(*scopes), .registry, .publish_dir(path)).

Heavy imports happen inside the fixtures, so collecting unrelated tests stays fast.
"""

from __future__ import annotations

import pytest

from .databases import BACKENDS


@pytest.fixture(params=BACKENDS)
def registry_backend(request) -> str:
    if request.param == "postgresql":
        from .databases import postgres_unavailable

        reason = postgres_unavailable()
        if reason:
            pytest.skip(reason)
    return request.param


@pytest.fixture
def registry_db_url(registry_backend, tmp_path):
    from .databases import fresh_database

    with fresh_database(registry_backend, tmp_path) as url:
        yield url


@pytest.fixture
def registry_server(registry_db_url, tmp_path):
    from .registry_server import run_registry

    with run_registry(registry_db_url, tmp_path / "registry-data") as server:
        yield server
