"""The RotationZoo import records (models/<name>/imports/<key>: the digest of the bundle converted
from a pair of .pt files) once their bundle is gone: prune removes them and says so, `cache rm`
leaves none naming what it removed, and a pull that finds one naming a bundle no longer cached
converts the files again instead of failing."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from oscar_zoo.zoo.cache import Cache, prune, verify_cache
from oscar_zoo.zoo.cli.main import cli
from oscar_zoo.zoo.pull import pull

from .conftest import GLM_FILES, GLM_FOLDER, HF_ZOO, flip_a_byte, oscar_pt

GLM = "glm-4.7-fp8"


def imports(cache: Cache) -> dict[Path, str]:
    """Each import record of GLM, with the text it holds."""
    folder = cache.model_dir(GLM) / "imports"
    return {p: p.read_text().strip() for p in sorted(folder.iterdir())} if folder.exists() else {}


def record_of(cache: Cache, digest: str) -> Path:
    (path,) = [p for p, d in imports(cache).items() if d == digest]
    return path


def recalibrated(hub) -> None:
    """The zoo's GLM files change upstream: a new import key, a new bundle, the ref moves."""
    hub.seed("hf", HF_ZOO, {f"{GLM_FOLDER}/{GLM_FILES[0]}":
                            oscar_pt("qqt_r_h_pbr", "layer", 1, 92, 128, None, 9)})


def test_prune_removes_and_reports_the_record_of_a_bundle_it_removes(hf_only, hub):
    old = pull(GLM)
    recalibrated(hub)
    new = pull(GLM)
    cache = Cache()
    stale, kept = record_of(cache, old.digest), record_of(cache, new.digest)
    result = CliRunner().invoke(cli, ["prune", "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    assert str(stale) in json.loads(result.stdout)["removed"] and stale.exists()
    removed = CliRunner().invoke(cli, ["prune", "--yes", "--json"])
    assert removed.exit_code == 0, removed.output
    assert json.loads(removed.stdout)["removed"] == json.loads(result.stdout)["removed"]
    assert not old.path.exists() and imports(cache) == {kept: new.digest}
    assert prune(cache) == [] and new.path.exists()


def test_prune_removes_records_whose_bundle_went_earlier(hf_only):
    """verify's repair deletes a snapshot and leaves its import record (and refs) behind: the
    record kept pointing pulls at a digest nothing holds, and no prune ever removed it."""
    first = pull(GLM)
    cache = Cache()
    record = record_of(cache, first.digest)
    flip_a_byte(cache.blob(cache.read_meta(GLM, first.digest)["files"]["rotations.safetensors"]))
    assert verify_cache(cache)[1] and not first.path.exists()
    torn = record.parent / "torn"
    torn.write_text("a1b2")                          # names no digest: read_import ignores it
    writing = record.parent / f".{record.name}.x1y2.tmp"    # a write in progress: not ours yet
    writing.write_text(first.digest + "\n")
    planned = {p for p, _ in prune(cache, dry_run=True)}
    assert {record, torn} <= planned and writing not in planned and record.exists()
    assert {record, torn} <= {p for p, _ in prune(cache)}
    assert not record.exists() and not torn.exists() and writing.exists()
    again = pull(GLM)                                # converted again from the .pt files
    assert again.digest == first.digest and again.path.exists()
    assert imports(cache)[record] == first.digest
    assert verify_cache(cache) == (3, [])


def test_a_pull_converts_again_when_its_record_names_a_bundle_not_cached(hf_only):
    first = pull(GLM)
    cache = Cache()
    record = record_of(cache, first.digest)
    record.write_text("f" * 64 + "\n")              # a bundle this cache never held
    again = pull(GLM)
    assert again.digest == first.digest and again.path.exists()
    assert imports(cache) == {record: first.digest}
    assert prune(cache) == []


def test_cache_rm_of_a_version_leaves_no_record_naming_it(hf_only, hub):
    old = pull(GLM)
    recalibrated(hub)
    new = pull(GLM)
    cache = Cache()
    stale, kept = record_of(cache, old.digest), record_of(cache, new.digest)
    result = CliRunner().invoke(cli, ["cache", "rm", f"{GLM}@{old.digest[:12]}", "--yes", "--json"])
    assert result.exit_code == 0, result.output
    assert str(stale) in json.loads(result.stdout)["removed"]
    assert imports(cache) == {kept: new.digest}
    assert prune(cache) == [] and new.path.exists()


def test_a_record_naming_a_layers_part_stays(registry, glm_bundles):
    """A bundle held only in part is still held: prune keeps what names it."""
    registry.publish_dir(glm_bundles[0].path)
    part = pull(GLM, layers="0-3")
    cache = Cache()
    cache.write_import(GLM, "k" * 64, part.digest)
    cache.write_import(GLM, "g" * 64, "e" * 64)
    gone = cache.model_dir(GLM) / "imports" / ("g" * 64)
    assert [p for p, _ in prune(cache)] == [gone]
    assert cache.read_import(GLM, "k" * 64) == part.digest and part.path.exists()
