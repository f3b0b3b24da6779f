"""Downloads: ETag = sha256, HEAD, Range, If-None-Match; blobs verified on read."""

from __future__ import annotations

import hashlib

import pytest

from tests.utils.bundles import make_bundle

URL = "/v1/models/smollm2-135m/versions/1/files/rotations.safetensors"


@pytest.fixture
def served(registry_server, tmp_path):
    make_bundle(tmp_path / "b", per_head=True)
    registry_server.publish_dir(tmp_path / "b")
    data = (tmp_path / "b" / "rotations.safetensors").read_bytes()
    with registry_server.client() as http:
        yield registry_server, http, data


def test_get_head_etag_and_conditional(served):
    server, http, data = served
    sha = hashlib.sha256(data).hexdigest()
    r = http.get(URL)
    assert r.status_code == 200 and r.content == data
    assert r.headers["etag"] == f'"{sha}"'
    assert r.headers["content-length"] == str(len(data))
    assert r.headers["accept-ranges"] == "bytes"
    assert "immutable" in r.headers["cache-control"]
    h = http.head(URL)
    assert h.status_code == 200 and h.content == b""
    assert h.headers["content-length"] == str(len(data)) and h.headers["etag"] == f'"{sha}"'
    assert http.get(URL, headers={"If-None-Match": f'"{sha}"'}).status_code == 304
    assert http.get(URL, headers={"If-None-Match": '"other", *'}).status_code == 304
    assert http.get(URL, headers={"If-None-Match": '"other"'}).status_code == 200
    # Through an alias the bytes may change later: clients must revalidate.
    alias = http.get(URL.replace("/1/", "/latest/"))
    assert alias.content == data and alias.headers["cache-control"] == "no-cache"
    # v1 is version 1 (no alias may be named so): as immutable as 1
    assert "immutable" in http.get(URL.replace("/1/", "/v1/")).headers["cache-control"]


RANGES = [("bytes=0-99", 0, 100), ("bytes=100-", 100, None), ("bytes=-50", -50, None),
          ("bytes=10-10", 10, 11), ("bytes=5-999999999", 5, None)]


def test_ranges(served):
    server, http, data = served
    for header, lo, hi in RANGES:
        r = http.get(URL, headers={"Range": header})
        assert r.status_code == 206, header
        want = data[lo:hi]
        assert r.content == want
        start = lo if lo >= 0 else len(data) + lo
        assert r.headers["content-range"] == f"bytes {start}-{start + len(want) - 1}/{len(data)}"


def test_unsatisfiable_malformed_and_if_range(served):
    server, http, data = served
    r = http.get(URL, headers={"Range": f"bytes={len(data)}-"})
    assert r.status_code == 416
    assert r.headers["content-range"] == f"bytes */{len(data)}"
    assert r.headers["content-type"] == "application/problem+json"
    # Malformed or multi-range requests get the whole file (RFC 9110 lets a server ignore Range).
    # ... and so do numbers no file reaches: int() of over 4,300 digits raises (was a 500)
    huge = "9" * 5000
    for header in ("bytes=a-b", "items=0-1", "bytes=0-1,5-6", "bytes=9-3", f"bytes={huge}-",
                   f"bytes=-{huge}", f"bytes=0-{huge}"):
        r = http.get(URL, headers={"Range": header})
        assert r.status_code == 200 and r.content == data, header
    stale = http.get(URL, headers={"Range": "bytes=0-9", "If-Range": '"stale"'})
    assert stale.status_code == 200 and len(stale.content) == len(data)
    # a stale If-Range drops the Range before it is judged (RFC 9110 13.1.5): 200, not 416
    stale = http.get(URL, headers={"Range": f"bytes={len(data)}-", "If-Range": '"stale"'})
    assert stale.status_code == 200 and stale.content == data


def test_unknown_file_and_path_tricks(served):
    server, http, data = served
    for ref in ("9" * 5000, "9" * 11):   # no version, whatever its size (5000 digits was a 500)
        r = http.get(f"/v1/models/smollm2-135m/versions/{ref}/files/bundle.json")
        assert r.status_code == 404, r.text
    r = http.get("/v1/models/smollm2-135m/versions/1/files/model.bin")
    assert r.status_code == 404 and "rotations.safetensors" in r.json()["detail"]
    for bad in ("..%2F..%2Fregistry.sqlite", "%2E%2E", "bundle.json%00"):
        r = http.get(f"/v1/models/smollm2-135m/versions/1/files/{bad}")
        assert r.status_code == 404, bad


def test_corrupt_blob_is_refused_not_served(served):
    server, http, data = served
    sha = hashlib.sha256(data).hexdigest()
    blob = server.registry.blobs.path(sha)
    corrupted = bytearray(blob.read_bytes())
    corrupted[-1] ^= 0xFF
    blob.write_bytes(bytes(corrupted))  # a new mtime: the next read hashes again
    r = http.get(URL)
    assert r.status_code == 500
    assert r.json()["title"] == "Stored file failed verification"
    assert "Traceback" not in r.text


def test_a_missing_blob_is_a_clear_500_on_every_route_and_the_connection_lives(served):
    """The layer routes and the version page met FileNotFoundError as an unexpected error; after
    it, uvicorn reset the keep-alive connection under the client's next request."""
    server, http, data = served
    server.registry.blobs.path(hashlib.sha256(data).hexdigest()).unlink()
    for url in (URL, "/v1/models/smollm2-135m/versions/1/layers/0",
                "/v1/models/smollm2-135m/versions/1/layers.safetensors?layers=0-1"):
        r = http.get(url)
        assert r.status_code == 500 and "missing from the registry's store" in r.json()["detail"], url
    page = http.get("/models/smollm2-135m/versions/1")
    assert page.status_code == 500 and "text/html" in page.headers["content-type"]
    assert http.get("/v1/health").status_code == 200     # the same connection


def test_a_missing_blob_names_the_file_and_version_and_how_to_restore_it(served, tmp_path,
                                                                         caplog):
    """The answer named the blob by a piece of its hash and said "restore it from a mirror": the
    operator could not tell which version's file was lost, nor that publishing the bundle again
    puts it back. Logged once per request, at error level."""
    import logging

    server, http, data = served
    server.registry.blobs.path(hashlib.sha256(data).hexdigest()).unlink()
    with caplog.at_level(logging.ERROR, logger="oscar_zoo.api"):
        r = http.get(URL)
    assert r.status_code == 500 and r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert (body["model"], body["version"], body["file"]) == ("smollm2-135m", 1,
                                                             "rotations.safetensors"), body
    detail = body["detail"]
    assert detail.startswith("the registry's blob of file 'rotations.safetensors' of "
                             "smollm2-135m version 1 (sha256:"), detail
    assert "missing from the registry's store" in detail
    assert "publish the bundle it belongs to again" in detail and "restore the blob store" in detail
    assert str(server.data_dir) not in r.text and "Traceback" not in r.text
    logged = [rec for rec in caplog.records
              if rec.levelno == logging.ERROR and URL in rec.getMessage()]
    assert len(logged) == 1 and "rotations.safetensors" in logged[0].getMessage(), logged
    # the advice holds: the same bundle published again puts the blob back, as version 1
    server.publish_dir(tmp_path / "b")      # the bundle `served` published
    again = http.get(URL)
    assert again.status_code == 200 and again.content == data


def test_an_unexpected_error_is_a_500_problem_and_the_connection_lives(served, monkeypatch):
    from oscar_zoo.registry_db import queries

    server, http, data = served
    monkeypatch.setattr(queries, "resolve_model", lambda *a, **k: 1 / 0)
    r = http.get("/v1/models/smollm2-135m")
    assert r.status_code == 500 and r.json()["title"] == "Internal error" and "Traceback" not in r.text
    assert http.get("/v1/health").status_code == 200     # the same connection, not reset


def test_files_beyond_the_bundle_kinds_download_as_opaque_attachments(registry_server, tmp_path):
    """A publisher may add any file: one named .html or .svg was served inline as text/html or
    image/svg+xml from the registry's origin, a stored XSS for whoever clicked its link."""
    import json

    b = tmp_path / "b"
    make_bundle(b)
    extra = {"notes.html": b"<script>alert(1)</script>", "plot.SVG": b"<svg onload='alert(1)'/>",
             "empty.md": b""}
    manifest = json.loads((b / "bundle.json").read_text())
    for name, body in extra.items():
        (b / name).write_bytes(body)
        manifest["files"].append({"name": name, "sha256": hashlib.sha256(body).hexdigest(),
                                  "size": len(body)})
    (b / "bundle.json").write_text(json.dumps(manifest))
    registry_server.publish_dir(b)
    with registry_server.client() as http:
        base = "/v1/models/smollm2-135m/versions/1/files/"
        for name, body in extra.items():
            r = http.get(base + name)
            assert r.status_code == 200 and r.content == body, name
            assert r.headers["x-content-type-options"] == "nosniff"
            assert r.headers["content-security-policy"] == "sandbox"
            if name != "empty.md":
                assert r.headers["content-type"] == "application/octet-stream", name
                assert r.headers["content-disposition"] == f'attachment; filename="{name}"'
        assert http.get(base + "bundle.json").headers["content-type"] == "application/json"
        assert "content-disposition" not in http.get(base + "README.md").headers
        # a suffix range of an empty file: the whole (empty) file, not "bytes 0--1/0"
        r = http.get(base + "empty.md", headers={"Range": "bytes=-5"})
        assert r.status_code == 200 and r.content == b"" and "content-range" not in r.headers
