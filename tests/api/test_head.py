"""HEAD on every GET endpoint and page (RFC 9110 9.3.2), over real HTTP: same status and headers
as GET, no body; the file download's own HEAD keeps answering without reading the file; a HEAD
on a live job event stream returns at once; the OpenAPI schema gains no operations."""

from __future__ import annotations

import time

import pytest

from tests.api.ui.conftest import add_job
from tests.utils.bundles import make_bundle

VERSION = "/v1/models/smollm2-135m/versions/1"
GETS = ["/", "/?q=smol", "/models/smollm2-135m", "/models/smollm2-135m/versions/1", "/jobs",
        "/v1/health", "/v1/models", "/v1/models/smollm2-135m", VERSION, f"{VERSION}/layers",
        f"{VERSION}/layers/3", f"{VERSION}/layers.safetensors?layers=0-3",
        f"{VERSION}/files/README.md", f"{VERSION}/files/rotations.safetensors",
        "/static/app.js", "/v1/models/no-such-model", "/models/no-such-model", "/openapi.json"]
SAME = ("content-type", "content-length", "etag", "cache-control", "content-disposition")


@pytest.fixture
def server(registry_server, tmp_path):
    make_bundle(tmp_path / "b", seed=1)
    registry_server.publish_dir(tmp_path / "b")
    return registry_server


def test_head_answers_as_get_without_a_body(server):
    with server.client() as http:
        for url in GETS:
            got, head = http.get(url), http.head(url)
            assert head.status_code == got.status_code, (url, head.status_code, head.text)
            assert head.content == b"", url
            for name in SAME:
                assert head.headers.get(name) == got.headers.get(name), (url, name)
            if "content-length" in got.headers:
                assert int(head.headers["content-length"]) == len(got.content), url


def test_file_head_keeps_ranges_and_etags(server):
    url = f"{VERSION}/files/rotations.safetensors"
    with server.client() as http:
        whole = http.get(url)
        part = http.head(url, headers={"Range": "bytes=0-9"})
        assert part.status_code == 206 and part.headers["content-length"] == "10"
        assert part.headers["content-range"] == f"bytes 0-9/{len(whole.content)}"
        cached = http.head(url, headers={"If-None-Match": whole.headers["etag"]})
        assert cached.status_code == 304 and cached.content == b""


def test_head_of_a_live_event_stream_returns_at_once(server):
    job = add_job(server)  # running, so GET would stream until the job ends
    with server.client() as http:
        start = time.monotonic()
        head = http.head(f"/v1/jobs/{job}/events", timeout=10)
        assert head.status_code == 200 and head.content == b""
        assert head.headers["content-type"].startswith("text/event-stream")
        assert time.monotonic() - start < 5
        assert http.get("/v1/health").status_code == 200  # the connection is still good


def test_head_stays_out_of_the_schema(server):
    with server.client() as http:
        paths = http.get("/openapi.json").json()["paths"]
    heads = [op["operationId"] for ops in paths.values() for m, op in ops.items() if m == "head"]
    assert heads == ["head_file"]
    ids = [op["operationId"] for ops in paths.values() for op in ops.values()]
    assert len(ids) == len(set(ids))


def test_other_methods_are_still_refused(server):
    with server.client() as http:
        r = http.post("/v1/health")
        assert r.status_code == 405 and "GET" in r.headers["allow"]


def test_head_of_an_unknown_page_matches_its_html_404(server):
    browser = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}
    with server.client() as http:
        got, head = http.get("/nope", headers=browser), http.head("/nope", headers=browser)
    assert got.status_code == head.status_code == 404
    assert got.headers["content-type"].startswith("text/html") and head.content == b""
    for name in SAME:
        assert head.headers.get(name) == got.headers.get(name), name
