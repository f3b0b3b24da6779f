"""Bad uploads and requests: each a 4xx problem+json with a clear message, and the database,
blob store and staging dir exactly as before."""

from __future__ import annotations

import json
import shutil
import struct

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from oscar_zoo.zoo.files import sha256_file
from tests.utils.bundles import make_bundle

FILES = ("bundle.json", "rotations.safetensors", "README.md")


def _files(d, **override):
    out = []
    for n in FILES:
        out.append((n, (n, override.get(n, (d / n).read_bytes()))))
    return out


def _retensor(d, mutate):
    """Rewrite rotations.safetensors through `mutate(tensors)` and fix the manifest's sha256,
    so only the tensor check can catch the problem."""
    tensors = load_file(str(d / "rotations.safetensors"))
    mutate(tensors)
    save_file(tensors, str(d / "rotations.safetensors"))
    _rehash(d, "rotations.safetensors")


def _rehash(d, name):
    manifest = json.loads((d / "bundle.json").read_text())
    for f in manifest["files"]:
        if f["name"] == name:
            f["sha256"], f["size"] = sha256_file(d / name), (d / name).stat().st_size
    (d / "bundle.json").write_text(json.dumps(manifest))


def _nan(t):
    t["k.3.rotation"][0, 0] = np.nan


def _not_orthogonal(t):
    t["v.5.rotation"][:] = t["v.5.rotation"] * 1.01


def _wrong_shape(t):
    t["k.2.rotation"] = np.eye(32, dtype=np.float32)


def _missing_layer(t):
    del t["v.7.rotation"]


def _clip_out_of_range(t):
    t["k.0.clip"][:] = 1.5


@pytest.mark.parametrize("mutate, says", [
    (_nan, "NaN"), (_not_orthogonal, "not orthogonal"), (_wrong_shape, "shape"),
    (_missing_layer, "missing tensors"), (_clip_out_of_range, "clip"),
])
def test_bad_tensors_rejected(publisher, tmp_path, snapshot, mutate, says):
    server, http = publisher
    make_bundle(tmp_path / "b")
    _retensor(tmp_path / "b", mutate)
    before = snapshot(server)
    r = http.post("/v1/models/smollm2-135m/versions", files=_files(tmp_path / "b"))
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert says in r.json()["detail"]
    assert "Traceback" not in r.text
    assert snapshot(server) == before


def test_malformed_safetensors_and_manifest(publisher, tmp_path, snapshot):
    server, http = publisher
    make_bundle(tmp_path / "b")
    d = tmp_path / "b"
    before = snapshot(server)
    garbage = struct.pack("<Q", 1 << 40) + b"{not json"
    (d / "rotations.safetensors").write_bytes(garbage)
    _rehash(d, "rotations.safetensors")
    r = http.post("/v1/models/smollm2-135m/versions", files=_files(d))
    assert r.status_code == 422 and "safetensors" in r.json()["detail"]
    r = http.post("/v1/models/smollm2-135m/versions", files=_files(d, **{"bundle.json": b"{]"}))
    assert r.status_code == 422 and "manifest" in r.json()["detail"]
    r = http.post("/v1/models/smollm2-135m/versions",
                  files=_files(d, **{"bundle.json": b'{"format": "oscar-zoo.bundle", "surprise": 1}'}))
    assert r.status_code == 422
    assert snapshot(server) == before


def test_an_error_names_the_uploaded_file_not_the_servers_staging_path(publisher, tmp_path):
    server, http = publisher
    d = make_bundle(tmp_path / "b").path
    r = http.post("/v1/models/smollm2-135m/versions", files=_files(d, **{"bundle.json": b"{]"}))
    detail = r.json()["detail"]
    assert r.status_code == 422 and detail.startswith("bundle.json ")
    assert "staging" not in detail and str(server.registry.data_dir) not in detail


@pytest.mark.parametrize("edit, says", [
    (lambda m: m["geometry"].update(num_layers=10**30), "num_layers"),
    (lambda m: m["geometry"].update(num_layers=2_000_000), "num_layers"),
    (lambda m: m["geometry"].update(head_dim=1 << 20), "head_dim"),
    (lambda m: m["geometry"].update(kv_heads_by_layer={"9" * 40: 2}), "layer ids"),
])
def test_a_geometry_too_large_for_any_model_is_refused_before_it_is_expanded(
        publisher, tmp_path, snapshot, edit, says):
    """Checks expand the geometry (a list of layers, a [d, d] per layer): a 2 KB manifest
    naming 2 million layers kept one for a minute and 1.8 GB, 10^30 overflowed into a 500."""
    server, http = publisher
    d = make_bundle(tmp_path / "b").path
    manifest = json.loads((d / "bundle.json").read_text())
    edit(manifest)
    before = snapshot(server)
    r = http.post("/v1/models/smollm2-135m/versions",
                  files=_files(d, **{"bundle.json": json.dumps(manifest).encode()}))
    assert r.status_code == 422 and says in r.json()["detail"], r.text
    assert snapshot(server) == before


def test_a_layer_id_in_other_digits_is_an_unexpected_tensor_not_a_500(publisher, tmp_path,
                                                                       snapshot):
    server, http = publisher
    make_bundle(tmp_path / "b")
    _retensor(tmp_path / "b", lambda t: t.update({"k.\u00b2.eigenvalues": t["k.0.eigenvalues"]}))
    before = snapshot(server)
    r = http.post("/v1/models/smollm2-135m/versions", files=_files(tmp_path / "b"))
    assert r.status_code == 422 and "unexpected tensor" in r.json()["detail"], r.text
    assert snapshot(server) == before


def test_sha_mismatch_and_unlisted_or_missing_files(publisher, tmp_path, snapshot):
    server, http = publisher
    make_bundle(tmp_path / "b")
    d = tmp_path / "b"
    before = snapshot(server)
    r = http.post("/v1/models/smollm2-135m/versions", files=_files(d, **{"README.md": b"edited"}))
    assert r.status_code == 422 and "README.md" in r.json()["detail"]
    extra = _files(d) + [("notes.txt", ("notes.txt", b"hello"))]
    r = http.post("/v1/models/smollm2-135m/versions", files=extra)
    assert r.status_code == 422 and "unlisted" in r.json()["detail"]
    r = http.post("/v1/models/smollm2-135m/versions", files=_files(d)[1:])
    assert r.status_code == 422 and "bundle.json" in r.json()["detail"]
    r = http.post("/v1/models/smollm2-135m/versions", files=[_files(d)[0]])
    assert r.status_code == 422 and "missing" in r.json()["detail"]
    assert snapshot(server) == before


@pytest.mark.parametrize("name", ["../bundle.json", "/etc/passwd", "a/b.json", "..", ".hidden",
                                  "x\\y", "sp ace"])
def test_path_like_file_names(publisher, tmp_path, snapshot, name):
    server, http = publisher
    make_bundle(tmp_path / "b")
    before = snapshot(server)
    files = _files(tmp_path / "b") + [("files", (name, b"x"))]
    r = http.post("/v1/models/smollm2-135m/versions", files=files)
    assert r.status_code == 400, r.text
    assert r.json()["title"] == "Unsafe path"
    assert snapshot(server) == before


def test_geometry_and_model_mismatch(publisher, tmp_path, snapshot):
    server, http = publisher
    make_bundle(tmp_path / "b")
    d = tmp_path / "b"
    before = snapshot(server)
    # A bundle for smollm2 sent to another model's URL.
    r = http.post("/v1/models/qwen3-8b/versions", files=_files(d))
    assert r.status_code == 422 and "not 'qwen3-8b'" in r.json()["detail"]
    assert r.json()["bundle_model"] == "smollm2-135m"       # the fix, for a client to act on
    # A self-consistent bundle whose geometry contradicts the catalog's (verified) one.
    manifest = json.loads((d / "bundle.json").read_text())
    manifest["model"] = {"name": "qwen3-8b", "hub_id": "Qwen/Qwen3-8B", "revision": None,
                         "architecture": "Qwen3ForCausalLM"}
    shutil.rmtree(d)
    from tests.utils.bundles import make_tensors
    from oscar_zoo.zoo.bundle import Bundle, write
    from oscar_zoo.zoo.manifest import Manifest

    m = Manifest.model_validate({k: v for k, v in manifest.items() if k != "files"})
    write(Bundle(m, *make_tensors(m)), d)
    r = http.post("/v1/models/qwen3-8b/versions", files=_files(d))
    assert r.status_code == 422 and "geometry does not match qwen3-8b" in r.json()["detail"]
    assert snapshot(server) == before


def test_oversized_bodies(publisher, tmp_path, snapshot, monkeypatch):
    server, http = publisher
    make_bundle(tmp_path / "b")
    monkeypatch.setenv("OSCAR_ZOO_MAX_UPLOAD_BYTES", "10000")
    before = snapshot(server)
    r = http.post("/v1/models/smollm2-135m/versions", files=_files(tmp_path / "b"))
    assert r.status_code == 413 and "10,000 bytes" in r.json()["detail"]

    def chunks():  # no Content-Length: cut off while streaming
        yield b"--x\r\nContent-Disposition: form-data; name=\"bundle.json\"; filename=\"bundle.json\"\r\n\r\n"
        for _ in range(20):
            yield b"0" * 1000
    r = http.post("/v1/models/smollm2-135m/versions", content=chunks(),
                  headers={"Content-Type": "multipart/form-data; boundary=x"})
    assert r.status_code == 413
    r = http.put("/v1/models/smollm2-135m/aliases/prod", content=b"{" + b" " * (2 << 20) + b"}",
                 headers={"Content-Type": "application/json"})
    assert r.status_code == 413

    def json_chunks():  # no Content-Length: FastAPI turned the cut-off into 400 "error parsing"
        yield b'{"version": 1, "reason": "'
        for _ in range(40):
            yield b"x" * 65536
        yield b'"}'
    r = http.put("/v1/models/smollm2-135m/aliases/prod", content=json_chunks(),
                 headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "1,048,576 bytes" in r.json()["detail"]
    # the upload limit belongs to the upload routes, not to whatever claims to be multipart
    monkeypatch.setenv("OSCAR_ZOO_MAX_UPLOAD_BYTES", str(64 << 20))
    r = http.post("/v1/models/smollm2-135m/versions/1/yank", content=b"x" * (2 << 20),
                  headers={"Content-Type": "multipart/form-data; boundary=x"})
    assert r.status_code == 413 and "1,048,576 bytes" in r.json()["detail"]
    assert snapshot(server) == before


def test_wrong_content_type_and_fields(publisher, tmp_path, snapshot):
    server, http = publisher
    make_bundle(tmp_path / "b")
    before = snapshot(server)
    r = http.post("/v1/models/smollm2-135m/versions", json={"bundle": "json"})
    assert r.status_code == 415
    r = http.post("/v1/models/smollm2-135m/versions", files=_files(tmp_path / "b"),
                  data={"status": "yanked"})
    assert r.status_code == 422 and "status" in r.json()["detail"]
    r = http.post("/v1/models/smollm2-135m/versions", files=_files(tmp_path / "b"),
                  data={"colour": "blue"})
    assert r.status_code == 422 and "colour" in r.json()["detail"]
    r = http.post("/v1/models/smollm2-135m/versions/1/yank", content=b"{oops",
                  headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
    assert snapshot(server) == before


VALIDATION = {"passed": True, "criterion": "x", "tolerance": 0.1, "dataset": "d",
              "context_len": 2048, "eval_windows": 2, "eval_tokens": 4096, "sink_tokens": 64,
              "recent_tokens": 256, "group_size": 64, "scale_dtype": "float32", "bf16_nll": 1.0,
              "bits_int2_tier": 2.5, "bits_at_context": 2.6, "created_at": "2026-01-01T00:00:00Z",
              "code_version": "0.1.0",
              "variants": [{"name": "bundle", "delta_nll": 0.01, "kl": 0.01, "attn_rel_error": 0.1}]}


def _with_validation(m):
    m["validation"] = json.loads(json.dumps(VALIDATION))
    return m["validation"]


@pytest.mark.parametrize("edit, says", [
    (lambda m: _with_validation(m)["variants"][0].update(delta_nll=float("inf")), "finite number"),
    (lambda m: _with_validation(m).update(bf16_nll=float("nan")), "finite number"),
    (lambda m: m["calibration"].update(spec={"k_clip": float("nan")}), "spec.k_clip is nan"),
], ids=["inf-delta-nll", "nan-bf16-nll", "nan-in-spec"])
def test_nan_or_infinity_in_the_manifest_is_refused(publisher, tmp_path, snapshot, edit, says):
    """Python's json writes NaN and Infinity, which are not JSON: such a version was committed,
    then every answer naming it was a 500, and the served bundle.json unreadable to strict
    parsers."""
    server, http = publisher
    make_bundle(tmp_path / "b")
    manifest = json.loads((tmp_path / "b" / "bundle.json").read_text())
    edit(manifest)
    (tmp_path / "b" / "bundle.json").write_text(json.dumps(manifest))
    before = snapshot(server)
    r = http.post("/v1/models/smollm2-135m/versions", files=_files(tmp_path / "b"))
    assert r.status_code == 422, r.text
    assert says in r.json()["detail"]
    assert snapshot(server) == before


def test_a_value_the_database_refuses_is_a_422_not_a_500(publisher, tmp_path, monkeypatch):
    """The safety net behind the checks: were one missing (here: the new-model check is
    switched off), PostgreSQL's refusal of a too-long value is the request's fault, a 422."""
    from oscar_zoo.registry_db import publish

    server, http = publisher
    if server.registry.db.is_sqlite:
        pytest.skip("SQLite stores any length in a VARCHAR(200): nothing to refuse")
    monkeypatch.setattr(publish, "_check_new_model", lambda manifest: None)
    make_bundle(tmp_path / "b")
    manifest = json.loads((tmp_path / "b" / "bundle.json").read_text())
    manifest["model"] = {"name": "my-model", "hub_id": "me/my-model", "revision": None,
                         "architecture": "X" * 201}
    (tmp_path / "b" / "bundle.json").write_text(json.dumps(manifest))
    r = http.post("/v1/models/my-model/versions", files=_files(tmp_path / "b"))
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert "cannot be stored" in r.json()["detail"] and "Traceback" not in r.text
