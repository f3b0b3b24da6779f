"""32 clients publishing (some the same content) while others read: nothing lost, nothing
duplicated, version numbers dense and unique, every file downloadable and intact."""

from __future__ import annotations

import hashlib
import threading
from concurrent.futures import ThreadPoolExecutor

from tests.utils.bundles import make_bundle
from tests.utils.registry_server import upload_bundle

DISTINCT = 24
DUPLICATES = 8      # re-uploads of contents 0..7, racing their originals
READERS = 8


def test_concurrent_publish_and_read(registry_server, tmp_path):
    server = registry_server
    digests = [make_bundle(tmp_path / f"b{i}", seed=100 + i).digest for i in range(DISTINCT)]
    jobs = list(range(DISTINCT)) + list(range(DUPLICATES))
    token = server.token("bundles:publish", name="racer")
    start, stop = threading.Barrier(len(jobs) + READERS), threading.Event()

    def publish(i: int):
        with server.client(token) as http:
            start.wait()
            r = upload_bundle(http, tmp_path / f"b{i}")
            return i, r.status_code, r.json()

    def read():
        bad = []
        with server.client() as http:
            start.wait()
            while not stop.is_set():
                for path in ("/v1/models?published=true", "/v1/models/smollm2-135m",
                             "/v1/models/smollm2-135m/versions?limit=100"):
                    r = http.get(path)
                    if r.status_code != 200:
                        bad.append((path, r.status_code))
        return bad

    with ThreadPoolExecutor(len(jobs) + READERS) as pool:
        readers = [pool.submit(read) for _ in range(READERS)]
        results = list(pool.map(publish, jobs))
        stop.set()
        assert all(not r.result() for r in readers)

    assert all(status in (200, 201) for _, status, _ in results), results
    by_content: dict[int, set[int]] = {}
    for i, status, body in results:
        assert body["digest"] == digests[i]
        by_content.setdefault(i, set()).add(body["version"])
    assert all(len(v) == 1 for v in by_content.values())   # same content, same version
    assert sum(status == 201 for _, status, _ in results) == DISTINCT
    numbers = sorted(n for v in by_content.values() for n in v)
    assert numbers == list(range(1, DISTINCT + 1))          # dense, unique

    with server.client() as http:
        listed = http.get("/v1/models/smollm2-135m/versions", params={"limit": 100}).json()["items"]
        assert sorted(v["version"] for v in listed) == numbers
        assert http.get("/v1/models/smollm2-135m").json()["latest_version"] == DISTINCT
        moves = http.get("/v1/models/smollm2-135m/aliases/latest",
                         params={"limit": 100}).json()["history"]
        assert len(moves) == DISTINCT                       # one move per new version, in order
        assert [m["to_version"] for m in moves] == list(range(DISTINCT, 0, -1))
        for v in listed:
            detail = http.get(f"/v1/models/smollm2-135m/versions/{v['version']}").json()
            for f in detail["files"]:
                data = http.get(f["url"]).content
                assert hashlib.sha256(data).hexdigest() == f["sha256"]
