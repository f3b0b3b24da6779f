"""Publishing from Python (the job runner's path): index rows, new models, rejections."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import func, select

from oscar_zoo.registry_db.models import BundleVersion, LayerIndex, Model
from oscar_zoo.registry_db.publish import publish_bundle
from oscar_zoo.registry_db.registry import open_registry
from oscar_zoo.zoo.bundle import Bundle, read, write
from oscar_zoo.zoo.errors import BundleFormatError, Conflict, IntegrityError, InvalidInput
from oscar_zoo.zoo.geometry import ModelGeometry
from oscar_zoo.zoo.manifest import Geometry, ModelRef
from tests.utils.bundles import make_bundle, make_manifest, make_tensors


def test_index_rows_point_at_the_right_bytes(registry, tmp_path):
    make_bundle(tmp_path / "b", model="qwen3.5-4b", per_head=True, centered=True)
    bundle = read(tmp_path / "b")
    with registry.db.write() as s:
        pub = publish_bundle(s, registry.blobs, tmp_path / "b", created_by="runner")
    assert pub.created and pub.version.number == 1
    with registry.db.read() as s:
        rows = list(s.scalars(select(LayerIndex).where(LayerIndex.version_id == pub.version.id)))
    geo = bundle.manifest.geometry
    assert len(rows) == len(geo.attention_layers) * geo.num_kv_heads * 2   # hybrid: 8 layers
    assert {r.layer for r in rows} == set(range(3, 32, 4))
    tensors_sha = next(f.sha256 for f in bundle.manifest.files if f.name == "rotations.safetensors")
    for r in rows[::5]:
        raw = registry.blobs.read_range(tensors_sha, r.byte_start, r.byte_end)
        want = bundle.side(r.side)[r.layer]
        np.testing.assert_array_equal(np.frombuffer(raw, "<f4").reshape(256, 256),
                                      want.rotation[r.kv_head])
        assert r.clip == pytest.approx(float(want.clip[r.kv_head]))
        assert r.eig_max == pytest.approx(float(want.eigenvalues[r.kv_head].max()))


def test_new_model_from_upload_then_geometry_is_enforced(registry, tmp_path):
    manifest = make_manifest("smollm2-135m").model_copy(update={
        "model": ModelRef(name="tiny-llama", hub_id="someone/Tiny-Llama", architecture="Llama"),
        "geometry": Geometry.of(ModelGeometry(4, 4, 2, 32))})
    write(Bundle(manifest, *make_tensors(manifest)), tmp_path / "a")
    pub = registry.publish(tmp_path / "a", model_name="someone--tiny-llama")
    assert pub.created and pub.version.model.source == "upload"

    other = manifest.model_copy(update={"geometry": Geometry.of(ModelGeometry(4, 4, 2, 16))})
    write(Bundle(other, *make_tensors(other)), tmp_path / "b")
    blobs_before = sorted(registry.blobs.all())
    with pytest.raises(BundleFormatError, match="head_dim 16 \\(model has 32\\)"):
        registry.publish(tmp_path / "b")
    assert sorted(registry.blobs.all()) == blobs_before

    wrong_hub = manifest.model_copy(update={"model": ModelRef(name="tiny-llama", hub_id="a/b")})
    write(Bundle(wrong_hub, *make_tensors(wrong_hub)), tmp_path / "d")
    with pytest.raises(InvalidInput, match="knows tiny-llama as someone/Tiny-Llama"):
        registry.publish(tmp_path / "d")

    bad = manifest.model_copy(update={"model": ModelRef(name="../evil", hub_id="x")})
    write(Bundle(bad, *make_tensors(bad)), tmp_path / "c")
    with pytest.raises(InvalidInput, match="plain name"):
        registry.publish(tmp_path / "c")
    with registry.db.read() as s:
        assert s.scalar(select(func.count()).select_from(BundleVersion)) == 1
        assert s.scalar(select(Model).where(Model.name == "tiny-llama")).hub_id == "someone/Tiny-Llama"


def test_rejected_bundle_leaves_no_blob_and_no_row(registry, tmp_path):
    make_bundle(tmp_path / "b")
    card = tmp_path / "b" / "README.md"
    card.write_bytes(card.read_bytes().replace(b"OSCAR", b"OSCAr", 1))  # same size, other bytes
    with pytest.raises(IntegrityError, match="sha256"):
        registry.publish(tmp_path / "b")
    assert list(registry.blobs.all()) == []
    with registry.db.read() as s:
        assert s.scalar(select(func.count()).select_from(BundleVersion)) == 0


def test_garbage_collection_keeps_every_published_file(registry, tmp_path):
    import os
    import time

    make_bundle(tmp_path / "b")
    registry.publish(tmp_path / "b")
    orphan = registry.blobs.put_bytes(b"left by a publish that crashed before its commit")
    past = time.time() - 7200
    for sha in registry.blobs.all():
        os.utime(registry.blobs.path(sha), (past, past))
    assert registry.collect_garbage() == [orphan]
    assert len(list(registry.blobs.all())) == 3  # bundle.json, rotations, README


def test_garbage_collection_removes_staging_dirs_of_dead_uploads_only(registry, tmp_path):
    """A server killed mid-upload left its staging dir (a whole bundle's files) for ever:
    nothing removed <data_dir>/staging/upload-*, not even `oscar-zoo db gc`."""
    import os
    import time

    past = time.time() - 7200
    dead = registry.data_dir / "staging" / "upload-dead"
    dead.mkdir(parents=True)
    (dead / "rotations.safetensors").write_bytes(b"x" * 1000)
    young = registry.data_dir / "staging" / "upload-young"
    young.mkdir()
    os.utime(dead, (past, past))
    with registry.staging("upload-") as live:
        (live / "bundle.json").write_bytes(b"{}")
        os.utime(live, (past, past))       # a slow upload: old, but its server is alive
        registry.collect_garbage()
        assert live.is_dir() and (live / "bundle.json").exists()
    assert not live.exists()
    assert sorted(p.name for p in (registry.data_dir / "staging").iterdir()) == ["upload-young"]


def test_a_layers_part_is_not_published(registry, tmp_path):
    """partial.json made the verify check rotations.safetensors against its own hash, not the
    manifest's: the version listed a blob no check had seen (tests/api/test_publish.py)."""
    import json

    make_bundle(tmp_path / "b")
    (tmp_path / "b" / "partial.json").write_text(json.dumps(
        {"layers": [0], "rotations.safetensors": "0" * 64}))
    with pytest.raises(BundleFormatError, match="--layers part"):
        registry.publish(tmp_path / "b")
    assert list(registry.blobs.all()) == []


def test_status_change_sees_a_concurrent_one(registry, tmp_path):
    """Two replicas (or threads) change one version's status at once: the second must see the
    first's committed status. Without a row lock, a promote that read `draft` before a yank
    committed wrote `published` over it: a yanked version was live again (PostgreSQL)."""
    from oscar_zoo.registry_db.publish import promote_draft, yank_version
    from oscar_zoo.registry_db.queries import resolve_model, resolve_version

    if registry.db.is_sqlite:
        pytest.skip("SQLite has one writer: the two transactions cannot overlap")
    make_bundle(tmp_path / "b")
    registry.publish(tmp_path / "b", status="draft")
    with registry.db.write() as first:
        slow = resolve_version(first, resolve_model(first, "smollm2-135m"), 1)
        assert slow.status == "draft"
        with registry.db.write() as second:
            v = resolve_version(second, resolve_model(second, "smollm2-135m"), 1)
            yank_version(second, v, "broken", "ops")
        with pytest.raises(Conflict, match="yanked"):
            promote_draft(first, slow, "owner")
    with registry.db.read() as s:
        v = resolve_version(s, resolve_model(s, "smollm2-135m"), 1)
        assert (v.status, v.yank_reason) == ("yanked", "broken")


def test_latest_survives_a_yank_racing_a_publish(registry, tmp_path):
    """A yank of an old version that computed `latest` before a concurrent publish committed
    moved `latest` from the new version back to 2 (PostgreSQL; SQLite has one writer)."""
    import threading
    import time

    from oscar_zoo.registry_db.publish import (model_for, prepare_bundle, record_version,
                                               store_blobs, yank_version)
    from oscar_zoo.registry_db.queries import alias_map, resolve_model, resolve_version

    if registry.db.is_sqlite:
        pytest.skip("SQLite has one writer: the two transactions cannot overlap")
    for seed in (1, 2, 3):
        make_bundle(tmp_path / str(seed), seed=seed)
    registry.publish(tmp_path / "1")
    registry.publish(tmp_path / "2")
    third = prepare_bundle(tmp_path / "3")
    store_blobs(registry.blobs, third)
    inserted, go = threading.Event(), threading.Event()

    def publish_third():
        with registry.db.write() as s:
            record_version(s, model_for(s, third.manifest), third, "pub")
            inserted.set()
            go.wait(10)

    def yank_first():
        with registry.db.write() as s:
            yank_version(s, resolve_version(s, resolve_model(s, "smollm2-135m"), 1), "bad", "ops")

    publisher = threading.Thread(target=publish_third)
    publisher.start()
    assert inserted.wait(10)
    yanker = threading.Thread(target=yank_first)
    yanker.start()
    time.sleep(0.5)  # the yank is now waiting on a lock the publish holds
    go.set()
    publisher.join(10)
    yanker.join(10)
    with registry.db.read() as s:
        assert alias_map(s, resolve_model(s, "smollm2-135m"))["latest"] == 3


def test_an_upload_cannot_claim_to_be_a_jobs_result(registry, tmp_path):
    from oscar_zoo.registry_db import jobs

    with registry.db.write() as s:
        job, _ = jobs.submit(s, {"model": "smollm2-135m"}, model="smollm2-135m", gpus=0,
                             max_attempts=1, lease_seconds=30)
        job_id = job.id
    make_bundle(tmp_path / "a", seed=1)
    with pytest.raises(Conflict, match="leave source_job out"):
        registry.publish(tmp_path / "a", "someone", source_job=job_id)
    with registry.db.read() as s:       # nothing the job's worker would take for its result
        assert s.scalar(select(func.count()).select_from(BundleVersion)) == 0
    # provenance from elsewhere (an id this registry never issued) is still recorded
    pub = registry.publish(tmp_path / "a", "someone", source_job="ci-run-812")
    assert pub.created and pub.version.source_job == "ci-run-812"


def _upload_bundle(tmp_path, dirname: str, name: str, hub_id: str, head_dim: int = 32):
    from oscar_zoo.registry_db.publish import prepare_bundle

    manifest = make_manifest("smollm2-135m").model_copy(update={
        "model": ModelRef(name=name, hub_id=hub_id, architecture="Llama"),
        "geometry": Geometry.of(ModelGeometry(4, 4, 2, head_dim))})
    write(Bundle(manifest, *make_tensors(manifest)), tmp_path / dirname)
    return prepare_bundle(tmp_path / dirname)


@pytest.mark.parametrize("winner, ours, outcome", [
    (("foo", "me/foo", 32), ("foo", "you/foo", 32), "knows foo as me/foo"),
    (("foo", "me/foo", 32), ("foo", "me/foo", 16), "head_dim 16 \\(model has 32\\)"),
    (("bar", "me/baz", 32), ("qux", "me/baz", 32), None),      # only the hub id collides
], ids=["other-hub-id", "other-geometry", "hub-id-only"])
def test_a_model_created_concurrently_is_checked_like_an_existing_one(
        registry, tmp_path, monkeypatch, winner, ours, outcome):
    """Two first uploads of one new model: the loser's INSERT fails on the unique index once the
    winner commits. It took the winner's row unchecked, so a bundle of another hub id or another
    geometry joined the model (a hub-id-only clash even answered ModelNotFound) (PostgreSQL)."""
    from oscar_zoo.registry_db import publish
    from oscar_zoo.registry_db.publish import model_for, record_version, store_blobs

    if registry.db.is_sqlite:
        pytest.skip("SQLite has one writer: the two transactions cannot overlap")
    first = _upload_bundle(tmp_path, "winner", *winner)
    second = _upload_bundle(tmp_path, "ours", *ours)
    for p in (first, second):
        store_blobs(registry.blobs, p)
    check_new_model = publish._check_new_model

    def winner_commits_first(manifest):
        # ours found no model and is about to insert one: the other upload commits it now
        monkeypatch.setattr(publish, "_check_new_model", check_new_model)
        check_new_model(manifest)
        with registry.db.write() as other:
            record_version(other, model_for(other, first.manifest), first, "token:alice")

    monkeypatch.setattr(publish, "_check_new_model", winner_commits_first)
    with registry.db.write() as s:
        if outcome is None:
            model = model_for(s, second.manifest, created_by="token:bob")
            assert model.name == "bar"
            record_version(s, model, second, "token:bob")
        else:
            with pytest.raises((InvalidInput, BundleFormatError), match=outcome):
                model_for(s, second.manifest, created_by="token:bob")
    with registry.db.read() as s:
        models = list(s.scalars(select(Model).where(Model.source == "upload")))
        assert [(m.name, m.hub_id, m.geometry["head_dim"]) for m in models] == [
            (winner[0], winner[1], 32)]
        assert s.scalar(select(func.count()).select_from(BundleVersion)) == (
            2 if outcome is None else 1)


@pytest.mark.parametrize("architecture", ["X" * 201, "Qwen3\x00ForCausalLM"], ids=["long", "nul"])
def test_a_new_models_architecture_is_checked_before_anything_is_stored(
        registry, tmp_path, architecture):
    """models.architecture is String(200): PostgreSQL refused a longer one, or a NUL, only at
    the insert (a 500, after the blobs were written); SQLite stored it as given."""
    _upload_bundle(tmp_path, "b", "my-model", "me/my-model")
    manifest = read(tmp_path / "b").manifest
    odd = manifest.model_copy(update={"model": manifest.model.model_copy(
        update={"architecture": architecture})})
    write(Bundle(odd, *make_tensors(odd)), tmp_path / "odd")
    with pytest.raises(InvalidInput, match="model.architecture must be at most 200 characters"):
        registry.publish(tmp_path / "odd", "token:pub")
    assert list(registry.blobs.all()) == []
    with registry.db.read() as s:
        assert s.scalar(select(Model).where(Model.name == "my-model")) is None
    ok = manifest.model_copy(update={"model": manifest.model.model_copy(
        update={"architecture": "X" * 200})})
    write(Bundle(ok, *make_tensors(ok)), tmp_path / "ok")
    assert registry.publish(tmp_path / "ok", "token:pub").version.model.architecture == "X" * 200


def test_a_name_resolves_to_the_same_model_in_every_process(registry_db_url, tmp_path):
    """`acme--llm` is both a (legacy) model's name and another model's hub id acme/llm: the
    lookup tried the two readings in a set's order, which string hashing changes per process,
    so replicas answered with different models (and immutable downloads got cached wrong)."""
    import os
    import subprocess
    import sys

    reg = open_registry(registry_db_url, tmp_path / "d")
    with reg.db.write() as s:
        geo = ModelGeometry(4, 4, 2, 32).to_dict()
        s.add(Model(name="acme--llm", hub_id="other/thing", hub_id_lower="other/thing",
                    architecture="Llama", geometry=geo, source="upload"))
        s.add(Model(name="llm2", hub_id="acme/llm", hub_id_lower="acme/llm",
                    architecture="Llama", geometry=geo, source="upload"))
    reg.close()
    script = ("import sys; from oscar_zoo.registry_db.registry import open_registry; "
              "from oscar_zoo.registry_db.queries import resolve_model; "
              "r = open_registry(sys.argv[1], sys.argv[2]); "
              "s = r.db.read().__enter__(); print(resolve_model(s, 'acme--llm').name)")
    seen = {subprocess.run([sys.executable, "-P", "-c", script, registry_db_url, str(tmp_path / "d")],
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}, capture_output=True,
                           text=True, check=True).stdout.strip() for seed in range(4)}
    assert seen == {"acme--llm"}                     # the name as typed, before its hub id reading


@pytest.mark.parametrize("name, says", [("newm\n", "plain name"), ("acme--llm", "'--' is reserved")])
def test_a_new_model_name_with_a_newline_or_a_double_dash_is_refused(registry, tmp_path, name, says):
    manifest = make_manifest("smollm2-135m").model_copy(update={
        "model": ModelRef(name=name, hub_id="someone/Tiny-Llama", architecture="Llama"),
        "geometry": Geometry.of(ModelGeometry(4, 4, 2, 32))})
    write(Bundle(manifest, *make_tensors(manifest)), tmp_path / "a")
    with pytest.raises(InvalidInput, match=says):
        registry.publish(tmp_path / "a")
    with registry.db.read() as s:
        assert s.scalar(select(func.count()).select_from(Model).where(Model.source == "upload")) == 0


def test_a_new_catalog_entry_meets_uploaded_models_without_breaking_start(registry_db_url,
                                                                          tmp_path, monkeypatch):
    """A release whose catalog adds a model users had uploaded under another name made every
    start fail (unique hub id); one whose entry shares an uploaded model's name rewrote that
    row's hub id and geometry under its published versions."""
    from oscar_zoo.registry_db import seed
    from oscar_zoo.registry_db.queries import resolve_model
    from oscar_zoo.zoo.catalog import CatalogEntry

    reg = open_registry(registry_db_url, tmp_path / "data")
    manifest = make_manifest("smollm2-135m").model_copy(update={
        "model": ModelRef(name="tiny-llama", hub_id="someone/Tiny-Llama", architecture="Llama"),
        "geometry": Geometry.of(ModelGeometry(4, 4, 2, 32))})
    write(Bundle(manifest, *make_tensors(manifest)), tmp_path / "a")
    reg.publish(tmp_path / "a")
    reg.close()
    geo = ModelGeometry(22, 32, 4, 64)
    monkeypatch.setattr(seed, "CATALOG", seed.CATALOG + (
        CatalogEntry("tinyllama-1.1b", "someone/Tiny-Llama", "LlamaForCausalLM", geo),
        CatalogEntry("tiny-llama", "other/TinyLlama", "LlamaForCausalLM", geo)))
    reg = open_registry(registry_db_url, tmp_path / "data")        # starts
    try:
        with reg.db.read() as s:
            uploaded = resolve_model(s, "tiny-llama")
            assert (uploaded.hub_id, uploaded.source) == ("someone/Tiny-Llama", "upload")
            assert uploaded.geometry == ModelGeometry(4, 4, 2, 32).to_dict()
            assert resolve_model(s, "tinyllama-1.1b").id == uploaded.id   # the catalog's name
    finally:
        reg.close()


def test_a_renamed_catalog_entry_keeps_its_row_and_old_name(registry_db_url, tmp_path, monkeypatch):
    import dataclasses

    from oscar_zoo.registry_db import seed
    from oscar_zoo.registry_db.queries import resolve_model

    open_registry(registry_db_url, tmp_path / "data").close()
    renamed = tuple(dataclasses.replace(e, name="smollm2-135m-it") if e.name == "smollm2-135m"
                    else e for e in seed.CATALOG)
    monkeypatch.setattr(seed, "CATALOG", renamed)
    reg = open_registry(registry_db_url, tmp_path / "data")
    try:
        with reg.db.read() as s:
            row = resolve_model(s, "smollm2-135m")
            assert row.name == "smollm2-135m-it" and "smollm2-135m" in row.aliases
    finally:
        reg.close()


def test_publishing_the_bytes_of_a_draft_names_the_promote_command(registry, tmp_path):
    """It answered 'already this version' with the draft: nothing published, `latest` unset."""
    make_bundle(tmp_path / "b")
    assert registry.publish(tmp_path / "b", status="draft").version.status == "draft"
    with pytest.raises(Conflict, match="oscar-zoo promote smollm2-135m@1"):
        registry.publish(tmp_path / "b")
    assert not registry.publish(tmp_path / "b", status="draft").created     # same draft: fine


def test_a_token_revoked_during_the_upload_publishes_nothing(registry, tmp_path):
    """The uploading request's token was checked before its upload, which may take minutes:
    revoked meanwhile, it still created a version under its name."""
    from oscar_zoo.registry_db.tokens import create_token, revoke_token
    from oscar_zoo.zoo.errors import Unauthorized

    make_bundle(tmp_path / "b")
    with registry.db.write() as s:
        row, _ = create_token(s, ["bundles:publish"], "uploader")
        token_id = row.id
        revoke_token(s, "uploader")
    with pytest.raises(Unauthorized, match="revoked while this request was in progress"):
        registry.publish(tmp_path / "b", "token:uploader", token_id=token_id)
    with registry.db.read() as s:
        assert s.scalar(select(func.count()).select_from(BundleVersion)) == 0


def test_a_version_keeps_its_extra_loss_beside_its_report(registry, tmp_path):
    """The lists sort by a copy of the report's number (migration 0012): publish writes it, as
    the pages read it from the report; no report, or no finite number in it, is none."""
    from oscar_zoo.registry_db.models import extra_loss

    from tests.api.ui.seeding import make_validated_bundle

    make_validated_bundle(tmp_path / "v", seed=3)
    make_bundle(tmp_path / "u", seed=4)                 # no validation report
    validated, plain = registry.publish(tmp_path / "v"), registry.publish(tmp_path / "u")
    with registry.db.read() as s:
        got = dict(s.execute(select(BundleVersion.id, BundleVersion.extra_loss)).all())
        report = s.get(BundleVersion, validated.version.id).validation
    bundle = next(r["delta_nll"] for r in report["variants"] if r["name"] == "bundle")
    assert got == {validated.version.id: bundle, plain.version.id: None} and bundle > 0
    assert extra_loss(report, "naive") > bundle
    row = lambda value: {"variants": [{"name": "bundle", "delta_nll": value}]}
    for value in (float("nan"), float("inf"), -float("inf"), True, "0.1", None, [0.1]):
        assert extra_loss(row(value)) is None, value
    assert extra_loss(row(2)) == 2.0 and isinstance(extra_loss(row(2)), float)
    assert extra_loss(None) is extra_loss({}) is extra_loss({"variants": "x"}) is None


# --- the validation verdict: re-derived, and a failed one kept as a draft ---------------------

def _validated(tmp_path, name: str, passed: bool = True, seed: int = 0, **edit) -> Bundle:
    """A bundle with a validation report, `edit` applied to the report (its numbers or verdict
    changed after the fact, as a hand-edited manifest would be)."""
    from tests.api.ui.seeding import validation

    m = make_manifest(seed=seed)
    report = validation(30, seed, passed)
    if "bundle_loss" in edit:
        loss = edit.pop("bundle_loss")
        edit["variants"] = [r.model_copy(update={"delta_nll": loss})
                            if r.name.startswith("bundle") else r for r in report.variants]
    m = m.model_copy(update={"validation": report.model_copy(update=edit)})
    return write(Bundle(m, *make_tensors(m, seed)), tmp_path / name)


def _latest(registry) -> int | None:
    from oscar_zoo.registry_db.queries import aliases_of

    with registry.db.read() as s:
        rows = list(s.scalars(select(BundleVersion)))
        aliases = aliases_of(s, [v.id for v in rows])
        return next((v.number for v in rows if "latest" in aliases[v.id]), None)


@pytest.mark.parametrize("passed, bundle_loss, says", [
    (True, 5.0, "says passed: true, but bundle's extra loss +5.0000 and bundle-served's extra "
                "loss +5.0000 are above the bound"),
    (False, 0.001, "says passed: false, but bundle's extra loss +0.0010 and bundle-served's "
                   "extra loss +0.0010 are within the bound"),
])
def test_a_report_whose_verdict_contradicts_its_numbers_is_refused(registry, tmp_path, passed,
                                                                   bundle_loss, says):
    """The registry stored `passed` as given: a failed report published, and a bundle far worse
    than naive INT2 showed as `validation passed`."""
    b = _validated(tmp_path, "b", passed=passed, bundle_loss=bundle_loss)
    with pytest.raises(BundleFormatError) as e:
        registry.publish(b.path, status="published")
    message = str(e.value)
    assert "validation report contradicts itself" in message and says in message
    assert "(hadamard +0.0088 + tolerance 0.01; 0.5 x naive +0.0360)" in message
    assert "oscar-zoo validate" in message
    with registry.db.read() as s:
        assert s.scalar(select(func.count()).select_from(BundleVersion)) == 0


def test_a_bundle_that_failed_validation_is_a_draft_unless_published_on_purpose(registry,
                                                                               tmp_path):
    ok = registry.publish(_validated(tmp_path, "ok", seed=1).path)
    failed = registry.publish(_validated(tmp_path, "failed", passed=False, seed=2).path)
    assert (ok.version.status, failed.version.status) == ("published", "draft")
    assert failed.version.validation_passed is False and _latest(registry) == 1
    asked = registry.publish(_validated(tmp_path, "asked", passed=False, seed=3).path,
                             status="published")
    assert asked.version.status == "published" and _latest(registry) == 3
    with registry.db.write() as s:   # the job runner's path takes the same default
        pub = publish_bundle(s, registry.blobs, _validated(tmp_path, "job", passed=False,
                                                           seed=4).path)
        assert pub.version.status == "draft"


def test_bundles_without_a_report_are_published_as_before(registry, tmp_path):
    """Nothing says they failed: RotationZoo imports, and calibrations run without validation."""
    from oscar_zoo.zoo.manifest import Method

    plain = registry.publish(make_bundle(tmp_path / "plain").path)
    m = make_manifest(seed=5)
    m = m.model_copy(update={
        "method": Method(k_objective="imported", v_objective="imported", composition="none"),
        "calibration": m.calibration.model_copy(update={
            "source": "imported", "dataset": None, "imported_from": "hf:oscar/rotations"})})
    imported = registry.publish(write(Bundle(m, *make_tensors(m, 5)), tmp_path / "imported").path)
    assert (plain.version.status, imported.version.status) == ("published", "published")
    assert imported.version.validation_passed is None and _latest(registry) == 2
