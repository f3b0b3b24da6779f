"""Run the real registry (uvicorn, loopback, a free port) in a thread, for tests.

    with run_registry(database_url, data_dir) as server:
        server.url                      # http://127.0.0.1:PORT
        token = server.token("bundles:publish")
        with server.client(token) as http:   # httpx.Client with base_url and auth set
            http.get("/v1/models")
        server.publish_dir(path)        # Python-level publish, bypassing HTTP
        upload_bundle(http, bundle_dir)  # publish over HTTP (multipart)

Pytest fixtures built on it: tests/utils/registry_fixtures.py (registry_db_url, registry_server).
"""

from __future__ import annotations

import socket
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import httpx


@dataclass
class RegistryServer:
    url: str
    app: Any
    registry: Any                       # oscar_zoo.registry_db.registry.Registry
    database_url: str
    data_dir: Path

    def client(self, token: str | None = None, **kwargs) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60, **kwargs)

    def token(self, *scopes: str, name: str | None = None) -> str:
        """A fresh token with these scopes (default admin), made directly in the database.
        name: unique among live tokens; default test, test-2, test-3, ... in turn."""
        from oscar_zoo.registry_db.tokens import create_token

        if name is None:
            self._made = getattr(self, "_made", 0) + 1
            name = "test" if self._made == 1 else f"test-{self._made}"
        with self.registry.db.write() as session:
            return create_token(session, list(scopes or ("admin",)), name=name)[1]

    def publish_dir(self, bundle_dir: str | Path, **kwargs):
        return self.registry.publish(bundle_dir, **kwargs)


BUNDLE_FILES = ("bundle.json", "rotations.safetensors", "README.md")


def upload_bundle(client: httpx.Client, bundle_dir: str | Path, model: str | None = None,
                  **fields: str) -> httpx.Response:
    """POST a bundle directory's files to /v1/models/{model}/versions (model: from bundle.json)."""
    import json

    bundle_dir = Path(bundle_dir)
    model = model or json.loads((bundle_dir / "bundle.json").read_text())["model"]["name"]
    files = [(n, (n, (bundle_dir / n).read_bytes())) for n in BUNDLE_FILES
             if (bundle_dir / n).exists()]
    return client.post(f"/v1/models/{model}/versions", files=files, data=fields or None)


def free_socket(host: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    return sock


@contextmanager
def serve_app(app: Any, timeout: float = 10.0) -> Iterator[str]:
    """Serve any ASGI app on a free loopback port in a thread; yields its base URL."""
    import uvicorn

    sock = free_socket()
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True,
                              name=f"registry-{port}")
    thread.start()
    deadline = time.monotonic() + timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the registry server did not start; see the log above")
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout)
        sock.close()


@contextmanager
def run_registry(database_url: str | None = None, data_dir: str | Path | None = None,
                 app_factory: Any = None) -> Iterator[RegistryServer]:
    """Open (migrate, seed) a registry and serve it over real HTTP until the block ends.

    `app_factory(registry) -> ASGI app` lets other areas mount more routers (default: the
    registry API, `oscar_zoo.api.app.create_app`).
    """
    from oscar_zoo.api.app import create_app
    from oscar_zoo.registry_db.registry import open_registry

    registry = open_registry(database_url, data_dir)
    try:
        app = (app_factory or (lambda r: create_app(registry=r)))(registry)
        with serve_app(app) as url:
            yield RegistryServer(url, app, registry, registry.db.url, registry.data_dir)
    finally:
        registry.close()
