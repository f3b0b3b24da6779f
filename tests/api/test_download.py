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
    for header in ("bytes=a-b", "items=0-1", "bytes=0-1,5-6", "bytes=9-3"):
        r = http.get(URL, headers={"Range": header})
        assert r.status_code == 200 and r.content == data, header
    stale = http.get(URL, headers={"Range": "bytes=0-9", "If-Range": '"stale"'})
    assert stale.status_code == 200 and len(stale.content) == len(data)


def test_unknown_file_and_path_tricks(served):
    server, http, data = served
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
