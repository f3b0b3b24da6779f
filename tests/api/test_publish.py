"""Publishing over HTTP: new versions, idempotent re-publish, drafts, yank, aliases, auth."""

from __future__ import annotations

import errno
import os

import pytest

from oscar_zoo.zoo.bundle import read
from tests.utils.bundles import make_bundle
from tests.utils.full_disk import full_disk
from tests.utils.registry_server import upload_bundle


def test_publish_creates_version_then_same_content_returns_it(publisher, tmp_path, snapshot):
    server, http = publisher
    bundle = make_bundle(tmp_path / "b", seed=1)
    r = upload_bundle(http, tmp_path / "b")
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["version"] == 1 and body["status"] == "published"
    assert body["digest"] == bundle.digest
    assert body["created_by"] == "token:pub"
    assert body["created_at"].endswith("Z")
    assert r.headers["location"] == "/v1/models/smollm2-135m/versions/1"
    assert {f["name"] for f in body["files"]} == {"bundle.json", "rotations.safetensors", "README.md"}
    assert body["aliases"] == ["latest"]

    before = snapshot(server)
    again = upload_bundle(http, tmp_path / "b")
    assert again.status_code == 200
    assert again.json()["version"] == 1
    assert snapshot(server) == before  # no row, no blob, nothing staged

    make_bundle(tmp_path / "c", seed=2)
    second = upload_bundle(http, tmp_path / "c")
    assert second.status_code == 201 and second.json()["version"] == 2
    assert http.get("/v1/models/smollm2/versions/latest").json()["version"] == 2


def test_served_bundle_json_is_canonical_and_hashes_to_digest(publisher, tmp_path):
    server, http = publisher
    bundle = make_bundle(tmp_path / "b")
    digest = upload_bundle(http, tmp_path / "b").json()["digest"]
    raw = http.get("/v1/models/smollm2-135m/versions/1/files/bundle.json").content
    import hashlib

    assert hashlib.sha256(raw).hexdigest() == digest == bundle.digest


def test_draft_is_not_latest_until_promoted(publisher, tmp_path):
    server, http = publisher
    make_bundle(tmp_path / "b")
    r = upload_bundle(http, tmp_path / "b", status="draft", source_job="job-123")
    assert r.status_code == 201
    assert r.json()["status"] == "draft" and r.json()["source_job"] == "job-123"
    assert http.get("/v1/models/smollm2-135m/versions/latest").status_code == 404
    listed = http.get("/v1/models", params={"q": "smollm2", "published": "true"}).json()
    assert listed["items"] == []
    promoted = http.post("/v1/models/smollm2-135m/versions/1/publish")
    assert promoted.status_code == 200 and promoted.json()["status"] == "published"
    assert http.get("/v1/models/smollm2-135m/versions/latest").json()["version"] == 1
    assert http.post("/v1/models/smollm2-135m/versions/1/publish").status_code == 409


def test_yank_moves_latest_back_and_keeps_the_version(publisher, tmp_path):
    server, http = publisher
    for seed in (1, 2):
        make_bundle(tmp_path / str(seed), seed=seed)
        assert upload_bundle(http, tmp_path / str(seed)).status_code == 201
    r = http.post("/v1/models/smollm2-135m/versions/2/yank", json={"reason": "bad clip search"})
    assert r.status_code == 200
    assert r.json()["status"] == "yanked" and r.json()["yank_reason"] == "bad clip search"
    assert http.get("/v1/models/smollm2-135m/versions/latest").json()["version"] == 1
    # Still there by number, for reproducibility; never deleted.
    assert http.get("/v1/models/smollm2-135m/versions/2").json()["status"] == "yanked"
    assert http.get("/v1/models/smollm2-135m/versions/2/files/README.md").status_code == 200
    assert http.post("/v1/models/smollm2-135m/versions/2/yank",
                     json={"reason": "again"}).status_code == 409
    assert http.post("/v1/models/smollm2-135m/versions/1/yank", json={"reason": ""}).status_code == 422
    # Publishing the yanked content again is refused, not resurrected.
    again = upload_bundle(http, tmp_path / "2")
    assert again.status_code == 409 and "yanked" in again.json()["detail"]
    history = http.get("/v1/models/smollm2-135m/aliases/latest").json()["history"]
    assert [(h["from_version"], h["to_version"]) for h in history] == [(2, 1), (1, 2), (None, 1)]


def test_aliases_move_with_history(publisher, tmp_path):
    server, http = publisher
    for seed in (1, 2):
        make_bundle(tmp_path / str(seed), seed=seed)
        upload_bundle(http, tmp_path / str(seed))
    assert http.put("/v1/models/smollm2-135m/aliases/recommended", json={"version": 1}).status_code == 200
    r = http.put("/v1/models/smollm2-135m/aliases/recommended",
                 json={"version": 2, "reason": "better loss"})
    assert r.status_code == 200
    assert http.get("/v1/models/smollm2/versions/recommended").json()["version"] == 2
    body = http.get("/v1/models/smollm2-135m/aliases").json()
    assert {a["alias"]: a["version"] for a in body["items"]} == {"latest": 2, "recommended": 2}
    moves = [(h["alias"], h["from_version"], h["to_version"], h["reason"]) for h in body["history"]]
    assert moves[:2] == [("recommended", 1, 2, "better loss"), ("recommended", None, 1, None)]
    model = http.get("/v1/models/smollm2-135m").json()
    assert model["recommended_version"] == 2 and model["version_aliases"]["recommended"] == 2
    # latest is the registry's; unknown versions and bad names are 4xx.
    assert http.put("/v1/models/smollm2-135m/aliases/latest", json={"version": 1}).status_code == 422
    assert http.put("/v1/models/smollm2-135m/aliases/prod", json={"version": 9}).status_code == 404
    assert http.put("/v1/models/smollm2-135m/aliases/9lives", json={"version": 1}).status_code == 422
    assert http.put("/v1/models/smollm2-135m/aliases/Prod!", json={"version": 1}).status_code == 422
    http.post("/v1/models/smollm2-135m/versions/1/yank", json={"reason": "x"})
    assert http.put("/v1/models/smollm2-135m/aliases/prod", json={"version": 1}).status_code == 409


@pytest.mark.parametrize("alias", ["v3", "v10", "rotationzoo", "rotationzoo-hf"])
def test_an_alias_named_like_a_version_or_a_cache_ref_is_refused_and_v_n_is_version_n(
        publisher, tmp_path, alias):
    """An alias `v3` on version 4 was accepted: the API answered .../versions/v3 with version 4,
    pull NAME@v3 (which reads v3 as version 3) and its cache ref then disagreed, and an offline
    pull NAME@3 served version 4. `rotationzoo` is the ref the cache keeps for the RotationZoo."""
    server, http = publisher
    for seed in (1, 2):
        make_bundle(tmp_path / str(seed), seed=seed)
        upload_bundle(http, tmp_path / str(seed))
    r = http.put(f"/v1/models/smollm2-135m/aliases/{alias}", json={"version": 2})
    assert r.status_code == 422, r.text
    assert "other than v<N> (a version number) and rotationzoo*" in r.json()["detail"]
    assert http.get("/v1/models/smollm2-135m/versions/v1").json()["version"] == 1
    assert http.get("/v1/models/smollm2-135m/versions/V2").json()["version"] == 2
    assert http.get("/v1/models/smollm2-135m/versions/v9").status_code == 404


def test_an_alias_stored_before_the_v_n_rule_can_be_read_yanked_past_and_removed(publisher, tmp_path):
    """A registry may hold an alias `v2` from before such names were refused: checking the name
    on removal too made every yank of its version fail (yank removes its aliases) and left no
    way to remove it."""
    from datetime import datetime, timezone

    from oscar_zoo.registry_db.models import Alias, AliasEvent
    from oscar_zoo.registry_db.queries import resolve_model, resolve_version

    server, http = publisher
    for seed in (1, 2):
        make_bundle(tmp_path / str(seed), seed=seed)
        upload_bundle(http, tmp_path / str(seed))
    with server.registry.db.write() as s:
        m = resolve_model(s, "smollm2-135m")
        for name, number in (("v2", 1), ("rotationzoo", 2)):
            vid, now = resolve_version(s, m, number).id, datetime.now(timezone.utc)
            s.add(Alias(model_id=m.id, name=name, version_id=vid, updated_at=now, updated_by="old"))
            s.add(AliasEvent(model_id=m.id, alias=name, to_version_id=vid, at=now, by="old"))
    got = http.get("/v1/models/smollm2-135m/aliases/rotationzoo")
    assert got.status_code == 200 and got.json()["items"][0]["version"] == 2, got.text
    r = http.post("/v1/models/smollm2-135m/versions/1/yank", json={"reason": "x"})
    assert r.status_code == 200, r.text
    assert http.delete("/v1/models/smollm2-135m/aliases/rotationzoo").status_code == 200
    aliases = {a["alias"] for a in http.get("/v1/models/smollm2-135m/aliases").json()["items"]}
    assert aliases == {"latest"}
    assert http.put("/v1/models/smollm2-135m/aliases/rotationzoo", json={"version": 2}).status_code == 422


def test_a_yank_takes_every_alias_off_the_version(publisher, tmp_path):
    """`recommended` stayed on a yanked version: a bare pull and the model page still offered it."""
    server, http = publisher
    for seed in (1, 2):
        make_bundle(tmp_path / str(seed), seed=seed)
        upload_bundle(http, tmp_path / str(seed))
    for alias in ("recommended", "prod"):
        assert http.put(f"/v1/models/smollm2-135m/aliases/{alias}", json={"version": 1}).status_code == 200
    assert http.put("/v1/models/smollm2-135m/aliases/canary", json={"version": 2}).status_code == 200
    assert http.post("/v1/models/smollm2-135m/versions/1/yank", json={"reason": "bad clips"}).status_code == 200
    body = http.get("/v1/models/smollm2-135m/aliases").json()
    assert {a["alias"]: a["version"] for a in body["items"]} == {"canary": 2, "latest": 2}
    gone = {(h["alias"], h["from_version"], h["to_version"], h["reason"]) for h in body["history"][:2]}
    assert gone == {(a, 1, None, "version 1 yanked: bad clips") for a in ("prod", "recommended")}
    assert http.get("/v1/models/smollm2-135m").json()["recommended_version"] is None
    page = http.get("/models/smollm2-135m").text
    assert "Use version 2" in page


def test_an_alias_is_removed_with_its_history_kept(publisher, tmp_path):
    server, http = publisher
    make_bundle(tmp_path / "1")
    upload_bundle(http, tmp_path / "1")
    assert http.put("/v1/models/smollm2-135m/aliases/canary", json={"version": 1}).status_code == 200
    r = http.delete("/v1/models/smollm2-135m/aliases/canary", params={"reason": "rollout done"})
    assert r.status_code == 200, r.text
    assert r.json()["items"] == []
    assert [(h["from_version"], h["to_version"], h["reason"]) for h in r.json()["history"]][0] == (1, None, "rollout done")
    assert http.get("/v1/models/smollm2-135m/versions/canary").status_code == 404
    assert "canary" not in http.get("/v1/models/smollm2-135m").json()["version_aliases"]
    # gone already, never set, the registry's own, a bad name: 4xx and nothing changes
    gone = http.delete("/v1/models/smollm2-135m/aliases/canary")
    assert gone.status_code == 404 and "its aliases: latest" in gone.json()["detail"]
    assert http.delete("/v1/models/smollm2-135m/aliases/prod").status_code == 404
    assert http.delete("/v1/models/smollm2-135m/aliases/latest").status_code == 422
    assert http.delete("/v1/models/smollm2-135m/aliases/Prod!").status_code == 422
    assert http.delete("/v1/models/smollm2-135m/aliases/canary", params={"reason": "a\x00b"}).status_code == 422
    history = http.get("/v1/models/smollm2-135m/aliases/canary").json()["history"]
    assert len(history) == 2 and http.get("/v1/models/smollm2-135m/versions/latest").json()["version"] == 1


def test_auth_missing_bad_revoked_and_wrong_scope(registry_server, tmp_path, snapshot):
    make_bundle(tmp_path / "b")
    before = snapshot(registry_server)
    with registry_server.client() as anon:
        r = upload_bundle(anon, tmp_path / "b")
        assert r.status_code == 401
        assert r.headers["content-type"] == "application/problem+json"
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert "oscar-zoo tokens create" in r.json()["detail"]
        assert anon.post("/v1/models/smollm2-135m/versions/1/yank",
                         json={"reason": "x"}).status_code == 401
        assert anon.delete("/v1/models/smollm2-135m/aliases/recommended").status_code == 401
    with registry_server.client("ozk_" + "x" * 43) as bad:
        assert upload_bundle(bad, tmp_path / "b").status_code == 401
    with registry_server.client("not-a-token") as bad:
        assert "malformed" in upload_bundle(bad, tmp_path / "b").json()["detail"]
    jobs_token = registry_server.token("jobs:submit", name="jobs-only")
    with registry_server.client(jobs_token) as jobs:
        r = upload_bundle(jobs, tmp_path / "b")
        assert r.status_code == 403 and "bundles:publish" in r.json()["detail"]
        assert jobs.delete("/v1/models/smollm2-135m/aliases/recommended").status_code == 403
    after = snapshot(registry_server)
    assert after["blobs"] == before["blobs"] and after["staging"] == []
    assert after["rows"]["bundle_versions"] == 0

    from oscar_zoo.registry_db.tokens import revoke_token

    token = registry_server.token("admin", name="soon-revoked")
    with registry_server.registry.db.write() as session:
        revoke_token(session, "soon-revoked")
    with registry_server.client(token) as revoked:
        assert upload_bundle(revoked, tmp_path / "b").status_code == 401


def test_python_publish_api_matches_http(registry_server, tmp_path):
    """registry.publish (the job runner's entry) records the same version the API would."""
    bundle = make_bundle(tmp_path / "b", per_head=True, centered=True)
    pub = registry_server.publish_dir(tmp_path / "b", created_by="job-runner", source_job="j1")
    assert pub.created and pub.version.number == 1
    with registry_server.client() as http:
        body = http.get("/v1/models/smollm2-135m/versions/1").json()
    assert body["digest"] == bundle.digest and body["source_job"] == "j1"
    assert body["manifest"] == read(tmp_path / "b").manifest.model_dump(mode="json")


def test_a_token_named_before_names_were_limited_can_still_publish(registry_server, tmp_path):
    """A 200-character token name (allowed once) made created_by `token:<name>` too long for
    its column: every publish with that token was a 500 on PostgreSQL."""
    from sqlalchemy import update

    from oscar_zoo.registry_db.models import ApiToken

    token = registry_server.token("bundles:publish", name="ci")
    with registry_server.registry.db.write() as session:
        session.execute(update(ApiToken).values(name="ci-" + "x" * 197))
    make_bundle(tmp_path / "b")
    with registry_server.client(token) as http:
        r = upload_bundle(http, tmp_path / "b")
    assert r.status_code == 201, r.text
    assert r.json()["created_by"] == ("token:ci-" + "x" * 197)[:200]


def test_an_alias_refused_for_a_draft_or_a_yanked_version_says_what_to_do(publisher, tmp_path):
    """The 409 said only that aliases point at published versions: not that a draft is
    published with `oscar-zoo promote`, nor that a yanked version is never aliased again."""
    server, http = publisher
    make_bundle(tmp_path / "b")
    make_bundle(tmp_path / "c", seed=1)
    assert upload_bundle(http, tmp_path / "b", status="draft").status_code == 201
    assert upload_bundle(http, tmp_path / "c").status_code == 201
    r = http.put("/v1/models/smollm2-135m/aliases/prod", json={"version": 1})
    assert r.status_code == 409 and "oscar-zoo promote smollm2-135m@1" in r.json()["detail"]
    http.post("/v1/models/smollm2-135m/versions/2/yank", json={"reason": "bad clips"})
    r = http.put("/v1/models/smollm2-135m/aliases/prod", json={"version": 2})
    assert r.status_code == 409, r.text
    assert "yanked (bad clips)" in r.json()["detail"] and "another version" in r.json()["detail"]


def test_a_layers_part_is_refused_not_published_with_unchecked_bytes(publisher, tmp_path, snapshot):
    """An upload with a partial.json was verified as a `--layers` part: its rotations against
    partial.json's hash, not the manifest's. A manifest naming any stored blob (here version
    1's README) as its rotations.safetensors became a version serving that blob unchecked."""
    import hashlib
    import json

    from safetensors.numpy import load_file, save

    server, http = publisher
    first = make_bundle(tmp_path / "a", seed=1)
    assert upload_bundle(http, tmp_path / "a").status_code == 201
    readme = next(f for f in first.manifest.files if f.name == "README.md")
    d = tmp_path / "b"
    make_bundle(d, seed=2)
    manifest = json.loads((d / "bundle.json").read_text())
    for f in manifest["files"]:
        if f["name"] == "rotations.safetensors":
            f["sha256"], f["size"] = readme.sha256, readme.size
    layer0 = {k: v for k, v in load_file(str(d / "rotations.safetensors")).items()
              if k.split(".")[1] == "0"}
    tensors = save(layer0, metadata={"format": "oscar-zoo.bundle"})
    partial = {"layers": [0], "rotations.safetensors": hashlib.sha256(tensors).hexdigest()}
    files = [("bundle.json", ("bundle.json", json.dumps(manifest).encode())),
             ("rotations.safetensors", ("rotations.safetensors", tensors)),
             ("README.md", ("README.md", (d / "README.md").read_bytes())),
             ("partial.json", ("partial.json", json.dumps(partial).encode()))]
    before = snapshot(server)
    r = http.post("/v1/models/smollm2-135m/versions", files=files)
    assert r.status_code == 422, r.text
    assert "partial.json" in r.json()["detail"] and "whole bundle" in r.json()["detail"]
    assert snapshot(server) == before
    assert http.get("/v1/models/smollm2-135m/versions/2").status_code == 404


def test_a_client_gone_mid_upload_stores_nothing_and_logs_no_error(publisher, tmp_path, snapshot,
                                                                   caplog):
    """A connection closed mid-body was an unhandled error: logged with a traceback and
    answered 500, for a client that merely went away."""
    import logging
    import socket
    import time

    server, http = publisher
    make_bundle(tmp_path / "b")
    before = snapshot(server)
    token = http.headers["authorization"]
    head, tail = b"--XX\r\nContent-Disposition: form-data; name=\"", b"\"\r\n\r\n"
    body = (head + b"bundle.json\"; filename=\"bundle.json" + tail
            + (tmp_path / "b" / "bundle.json").read_bytes() + b"\r\n"
            + head + b"rotations.safetensors\"; filename=\"rotations.safetensors" + tail
            + (tmp_path / "b" / "rotations.safetensors").read_bytes()[:4000])
    host, port = server.url.removeprefix("http://").split(":")
    with caplog.at_level(logging.WARNING), socket.create_connection((host, int(port))) as s:
        s.sendall(f"POST /v1/models/smollm2-135m/versions HTTP/1.1\r\nHost: {host}\r\n"
                  f"Authorization: {token}\r\nContent-Type: multipart/form-data; boundary=XX\r\n"
                  f"Content-Length: {len(body) * 10}\r\n\r\n".encode() + body)
        time.sleep(0.3)
        s.shutdown(socket.SHUT_RDWR)
    # the server's loop has seen the close once it answers another request (plus a margin)
    assert http.get("/v1/health").status_code == 200
    time.sleep(0.5)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert snapshot(server) == before


@pytest.mark.parametrize("fills, code, where, doing", [
    ("staging", errno.ENOSPC, "the registry's data dir", "staging the bundle upload"),
    ("blobs", errno.ENOSPC, "the registry's blob store", "storing a bundle file (sha256:"),
    ("blobs", errno.EDQUOT, "the registry's blob store", "storing a bundle file (sha256:")])
def test_a_full_disk_is_a_507_that_stores_nothing_and_says_how_to_make_room(
        publisher, tmp_path, snapshot, monkeypatch, caplog, fills, code, where, doing):
    """A full disk (or quota) under the upload's staging dir or the blob store was a bare 500
    "unexpected error" with a traceback in the log. Now: 507 naming what was being written and
    how to make room, no server path in it, and nothing kept: no row, no blob, no temp file,
    nothing staged. The disk is simulated (tests/utils/full_disk.py says why): its writes fail
    with ENOSPC partway through the first file."""
    server, http = publisher
    make_bundle(tmp_path / "b", seed=1)
    before = snapshot(server)
    root = server.data_dir / "staging" if fills == "staging" else server.registry.blobs.root
    with full_disk(monkeypatch, root, free=500, code=code) as disk:
        r = upload_bundle(http, tmp_path / "b")
    assert disk.refused == 1
    assert r.status_code == 507, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["title"] == "Insufficient storage" and body["status"] == 507
    detail = body["detail"]
    assert detail.startswith(f"out of disk space in {where} ({os.strerror(code)}) while {doing}")
    assert "no version was recorded" in detail and "OSCAR_ZOO_DATA_DIR" in detail
    assert "`oscar-zoo db gc`" in detail and str(server.data_dir) not in detail
    assert "\n" not in detail
    assert snapshot(server) == before
    # the operator's log says which directory, with no traceback
    logged = [rec for rec in caplog.records if "StorageFull" in rec.getMessage()]
    assert logged and f"[{root if fills == 'blobs' else server.data_dir}]" in logged[0].getMessage()
    assert not any(rec.exc_info for rec in caplog.records)
    # room made: the same upload goes through
    assert upload_bundle(http, tmp_path / "b").status_code == 201


def test_a_database_that_cannot_grow_is_a_507_and_records_nothing(publisher, tmp_path, snapshot):
    """SQLite's "database or disk is full" (SQLITE_FULL) at the commit was a bare 500. Made real
    here with PRAGMA max_page_count, which SQLite enforces as it would a full disk; PostgreSQL's
    disk_full cannot be caused on demand, so that backend is skipped."""
    from sqlalchemy import event

    server, http = publisher
    if not server.registry.db.is_sqlite:
        pytest.skip("PostgreSQL's disk_full (53100) cannot be caused on demand")
    make_bundle(tmp_path / "b", seed=1)
    engine = server.registry.db.engine

    def cannot_grow(dbapi_conn, _record):
        dbapi_conn.execute("PRAGMA max_page_count = 1")     # SQLite keeps the size it has

    before = snapshot(server)
    engine.dispose()            # pooled connections come back with the limit
    event.listen(engine, "connect", cannot_grow)
    try:
        r = upload_bundle(http, tmp_path / "b")
    finally:
        event.remove(engine, "connect", cannot_grow)
        engine.dispose()
    assert r.status_code == 507, r.text
    detail = r.json()["detail"]
    assert detail.startswith("out of disk space in the registry's database (database or disk "
                             "is full); the change was rolled back"), detail
    assert "`oscar-zoo db gc`" in detail
    after = snapshot(server)
    assert after["rows"] == before["rows"] and after["staging"] == []
    # its blobs were written before the transaction: unreferenced, `db gc` takes them
    assert server.registry.collect_garbage(min_age_s=-1) and snapshot(server) == before
    assert upload_bundle(http, tmp_path / "b").status_code == 201


def test_no_room_for_the_uploads_staging_dir_is_a_507_too(publisher, tmp_path, snapshot,
                                                          monkeypatch):
    """A full disk can refuse the staging dir itself (a directory takes a block). Simulated at
    os.mkdir, which tempfile.mkdtemp calls (why not a real full disk: tests/utils/full_disk.py)."""
    server, http = publisher
    make_bundle(tmp_path / "b", seed=1)
    before = snapshot(server)
    real_mkdir, staging = os.mkdir, str(server.data_dir / "staging")

    def full_mkdir(path, *args, **kwargs):
        if os.fspath(path).startswith(staging + os.sep):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", full_mkdir)
    r = upload_bundle(http, tmp_path / "b")
    assert r.status_code == 507, r.text
    assert r.json()["detail"].startswith(
        "out of disk space in the registry's data dir (No space left on device) while making a "
        "staging dir for an upload;")
    assert snapshot(server) == before


def test_an_upload_that_failed_validation_is_kept_as_a_draft_unless_status_says_published(
        publisher, tmp_path):
    """`oscar-zoo publish` sends no status: a failed bundle became `latest`, while a job keeps
    the same bundle as a draft."""
    from tests.api.ui.seeding import make_validated_bundle

    server, http = publisher
    make_validated_bundle(tmp_path / "failed", seed=1, passed=False)
    r = upload_bundle(http, tmp_path / "failed")
    assert r.status_code == 201, r.text
    assert r.json()["status"] == "draft" and r.json()["aliases"] == []
    assert http.get("/v1/models/smollm2-135m/versions/latest").status_code == 404
    make_validated_bundle(tmp_path / "asked", seed=2, passed=False)
    r = upload_bundle(http, tmp_path / "asked", status="published")
    assert r.status_code == 201 and r.json()["status"] == "published"
    make_validated_bundle(tmp_path / "passed", seed=3)
    r = upload_bundle(http, tmp_path / "passed")
    assert r.status_code == 201 and r.json()["status"] == "published"
    assert http.get("/v1/models/smollm2-135m/versions/latest").json()["version"] == 3


def test_a_report_whose_passed_contradicts_its_numbers_is_a_422_that_stores_nothing(
        publisher, tmp_path, snapshot):
    import json

    from tests.api.ui.seeding import make_validated_bundle

    server, http = publisher
    make_validated_bundle(tmp_path / "b", passed=True)
    manifest = json.loads((tmp_path / "b" / "bundle.json").read_text())
    for row in manifest["validation"]["variants"]:
        if row["name"] == "bundle":
            row["delta_nll"] = 5.0          # far worse than hadamard and naive, still "passed"
    (tmp_path / "b" / "bundle.json").write_text(json.dumps(manifest))
    before = snapshot(server)
    r = upload_bundle(http, tmp_path / "b")
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
    detail = r.json()["detail"]
    assert "validation report contradicts itself: it says passed: true, but bundle's extra " \
           "loss +5.0000 is above the bound +0.0180 nats/token" in detail
    assert snapshot(server) == before
