"""The body limit (api/limits.py) is a route's: a request that no route takes gets routing's
404 or 405, whatever its body's size."""

from __future__ import annotations

import http.client
import json
from urllib.parse import urlsplit

import pytest

BIG = b"x" * ((1 << 20) + 1)    # one byte over the limit of a body that is not an upload

pytestmark = pytest.mark.parametrize("registry_backend", ["sqlite"], indirect=True)


def _raw(server, method: str, path: str, body: bytes) -> tuple[int, dict]:
    """The request as written: httpx would resolve the path's `..` segments before sending."""
    url = urlsplit(server.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        r = conn.getresponse()
        return r.status, json.loads(r.read())
    finally:
        conn.close()


def test_a_large_body_to_no_route_gets_routings_answer_not_413(registry_server):
    with registry_server.client() as http:
        r = http.put("/v1/nothing-here", content=BIG)
        assert r.status_code == 404, r.text
        assert "no endpoint at /v1/nothing-here" in r.json()["detail"]
        r = http.post("/v1/health", content=BIG)       # the path is a route; POST is not
        assert r.status_code == 405, r.text
        assert http.get("/v1/health").status_code == 200   # the connection is fine after
    status, body = _raw(registry_server, "PUT", "/v1/models/../../etc/passwd", BIG)
    assert status == 405 and "limited to" not in body["detail"], body


def test_a_large_body_to_a_route_is_still_413(registry_server):
    token = registry_server.token("bundles:publish")
    with registry_server.client(token) as http:
        for r in (http.put("/v1/models/smollm2-135m/aliases/prod", content=BIG),
                  http.post("/v1/jobs", content=BIG)):
            assert r.status_code == 413, r.text
            assert "request bodies are limited to 1,048,576 bytes" in r.json()["detail"]
    with registry_server.client() as anon:    # the limit comes before the token check
        assert anon.post("/v1/jobs", content=BIG).status_code == 413


def test_a_body_over_the_limit_gets_one_title_declared_or_chunked(registry_server):
    """A declared Content-Length was "Payload too large", a chunked body (no length, cut off
    while streaming) "Request Entity Too Large": Starlette's phrase for its HTTPException."""
    def chunked():
        for _ in range(2 * 16):
            yield b"x" * 65536

    with registry_server.client(registry_server.token("jobs:submit")) as http:
        declared = http.post("/v1/jobs", content=BIG, headers={"Content-Type": "application/json"})
        streamed = http.post("/v1/jobs", content=chunked(),
                             headers={"Content-Type": "application/json"})
    assert "content-length" not in streamed.request.headers
    for r in (declared, streamed):
        assert r.status_code == 413, r.text
        assert r.headers["content-type"] == "application/problem+json"
        assert r.json()["title"] == "Payload too large", r.json()
        assert r.json()["detail"] == "request bodies are limited to 1,048,576 bytes"
