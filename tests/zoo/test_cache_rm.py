"""`oscar-zoo cache rm NAME[@REF]`: a model, or one version of it, leaves the cache with the
blobs nothing else uses; shared blobs, other models and their exports stay; a bad argument
removes nothing; the removal takes the lock prune takes and never leaves half a snapshot.

The cache is filled by pull's own code (materialize: blobs, snapshot links, meta, refs), from
bundles whose files are put in the blob store first, so no request is made:

    smollm2-135m       v1 (refs v1, recommended)   A: bundle.json, README.md, rotations R0
                       v2 (refs v2, latest)        B: another bundle.json and README.md, R0 too
    org/SmolLM2-Fork   v1 (refs v1, latest)        C: files of its own (rotations R1)

A and C have sglang exports.

`cache rm --rescued [NAME]...` removes bundles `oscar-zoo calibrate` saved under rescued/ when its
--out was full (saved here by calibrate's own code), which `cache ls` lists after the models.
"""

from __future__ import annotations

import calendar
import hashlib
import json
import os
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from oscar_zoo.zoo import cache as cache_mod
from oscar_zoo.zoo import bundle as bundle_mod
from oscar_zoo.zoo.bundle import Bundle, write
from oscar_zoo.zoo.cache import Cache, prune, verify_cache
from oscar_zoo.zoo.cache_remove import remove, resolve_removal, resolve_rescued
from oscar_zoo.zoo.cli import calibrate_cmds
from oscar_zoo.zoo.cli.main import cli
from oscar_zoo.zoo.errors import (AliasNotFound, BundleNotFound, InvalidInput, LockTimeout,
                                  ModelNotFound, UnsafePathError, VersionNotFound)
from oscar_zoo.zoo.export import export
from oscar_zoo.zoo.pull import materialize
from oscar_zoo.zoo.sources.base import Plan
from oscar_zoo.zoo.sources.download import RemoteFile
from tests.utils.bundles import make_manifest, make_tensors

from .conftest import paused_export_build

SMOL, FORK, FORK_DIR = "smollm2-135m", "org/SmolLM2-Fork", "org--smollm2-fork"
FILES = ("bundle.json", "README.md", "rotations.safetensors")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def bundles(tmp_path_factory) -> dict[str, Path]:
    """A and B: the same rotations (seed 0) under two manifests; C: seed 1."""
    root = tmp_path_factory.mktemp("rm-bundles")
    out = {}
    for key, seed, dataset in (("A", 0, "synthetic"), ("B", 0, "synthetic-2"), ("C", 1, "synthetic")):
        base = make_manifest(seed=seed)
        manifest = base.model_copy(update={"calibration": base.calibration.model_copy(
            update={"dataset": dataset})})
        k, v = make_tensors(manifest, seed)
        out[key] = write(Bundle(manifest, k, v), root / key).path
    return out


def _put(cache: Cache, bundle: Path, model: str, version: int, refs: list[str]) -> str:
    """Cache a bundle as a pull from a registry would: its files are in the blob store already."""
    cache.ensure()
    for f in bundle.iterdir():
        cache.add_bytes(f.read_bytes(), sha(f.read_bytes()))
    raw = (bundle / "bundle.json").read_bytes()
    plan = Plan(source="registry", model=model, origin=f"test:{model}@{version}", kind="bundle",
                digest=sha(raw), version=version, refs=refs, manifest=raw,
                locate=lambda n, s, z: RemoteFile(n, url="http://127.0.0.1:9/closed", sha256=s, size=z))
    result = materialize(plan, cache, progress=False)
    assert result.digest == sha(raw)
    return result.digest


@pytest.fixture
def filled(bundles) -> dict[str, str]:
    """The cache of the module docstring; returns the digests by letter."""
    cache = Cache()
    digests = {"A": _put(cache, bundles["A"], SMOL, 1, ["v1", "recommended"]),
               "B": _put(cache, bundles["B"], SMOL, 2, ["v2", "latest"]),
               "C": _put(cache, bundles["C"], FORK, 1, ["v1", "latest"])}
    for key, model in (("A", SMOL), ("C", FORK)):
        export(cache, digests[key], cache.snapshot_dir(model, digests[key]), "sglang")
    return digests


def blob_of(bundles, key: str, name: str) -> Path:
    return Cache().blob(sha((bundles[key] / name).read_bytes()))


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under the cache with its contents (None for a directory), locks aside."""
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes())
            for p in sorted(root.rglob("*")) if ".locks" not in p.parts}


def blob_bytes(bundles, key: str, *names: str) -> int:
    return sum((bundles[key] / n).stat().st_size for n in names)


# --- what goes and what stays ------------------------------------------------------------------

def test_a_whole_model_goes_and_the_other_model_is_untouched(bundles, filled):
    cache = Cache()
    fork_before = tree(cache.model_dir(FORK))
    fork_export = cache.root / "exports" / filled["C"]
    assert fork_export.is_dir() and (cache.root / "exports" / filled["A"]).is_dir()
    targets = resolve_removal(cache, [SMOL])
    assert [(t.model, t.digests, t.whole) for t in targets] == [
        (SMOL, {filled["A"], filled["B"]}, True)]
    done = remove(cache, targets)
    assert done.failed == []
    assert not cache.model_dir(SMOL).exists()
    assert not (cache.root / "exports" / filled["A"]).exists()
    for key in ("A", "B"):
        assert not any(blob_of(bundles, key, f).exists() for f in FILES)
    # the other model: snapshot, refs, meta, export and blobs as they were
    assert tree(cache.model_dir(FORK)) == fork_before
    assert fork_export.is_dir() and all(blob_of(bundles, "C", f).exists() for f in FILES)
    assert [(h.model, h.digest) for h in cache.held()] == [(FORK_DIR, filled["C"])]
    assert verify_cache(cache) == (len(FILES) + 2, [])   # C's files and its sglang K and V
    assert sorted(f"{m}/{r}" for m, r, _ in done.refs) == [
        f"{SMOL}/latest", f"{SMOL}/recommended", f"{SMOL}/v1", f"{SMOL}/v2"]
    assert len(list((cache.root / "tmp").iterdir())) == 0   # nothing left aside
    assert prune(cache) == []                                # and nothing left for prune


@pytest.fixture(params=["links", "copies"])
def filled_any_fs(request, bundles, monkeypatch):
    """`filled` on a filesystem with hard links, and on one without (snapshots hold copies)."""
    if request.param == "copies":
        def no_links(src, dst, *args, **kwargs):
            raise OSError(1, "Operation not permitted")
        monkeypatch.setattr(os, "link", no_links)
    return request.param, request.getfixturevalue("filled")


@pytest.mark.parametrize("ref", ["1", "v1", "recommended", "DIGEST12", "sha256:DIGEST"])
def test_one_version_goes_and_the_blob_it_shares_stays(bundles, filled_any_fs, ref):
    cache = Cache()
    fs, filled = filled_any_fs
    a, b = filled["A"], filled["B"]
    ref = ref.replace("DIGEST12", a[:12]).replace("DIGEST", a)
    shared = blob_of(bundles, "A", "rotations.safetensors")
    assert shared == blob_of(bundles, "B", "rotations.safetensors")     # the fixture's premise
    # what A alone holds: two blobs, its meta, its export (not the shared rotations, and not a
    # blob twice for its hard link in the snapshot)
    snapshot = cache.snapshot_dir(SMOL, a)
    copies = not os.path.samefile(shared, snapshot / "rotations.safetensors")
    assert copies == (fs == "copies")
    own = [blob_of(bundles, "A", "bundle.json"), blob_of(bundles, "A", "README.md"),
           cache.model_dir(SMOL) / "meta" / f"{a}.json",
           *(f for f in (cache.root / "exports" / a).rglob("*") if f.is_file()),
           *(snapshot.iterdir() if copies else [])]
    want = sum(f.stat().st_size for f in own)
    plan = remove(cache, resolve_removal(cache, [f"{SMOL}@{ref}"]))
    assert plan.bytes == want and plan.failed == []
    assert not cache.snapshot_dir(SMOL, a).exists()
    assert cache.refs(SMOL) == {"latest": b, "v2": b}
    assert not (cache.model_dir(SMOL) / "meta" / f"{a}.json").exists()
    assert not (cache.root / "exports" / a).exists()
    assert not blob_of(bundles, "A", "bundle.json").exists()
    assert not blob_of(bundles, "A", "README.md").exists()
    assert shared.exists()
    assert (cache.snapshot_dir(SMOL, b) / "rotations.safetensors").read_bytes() == shared.read_bytes()
    assert [h.digest for h in cache.held(SMOL)] == [b]
    assert verify_cache(cache) == (2 * len(FILES) + 2, [])    # B, and C with its export


def test_freed_bytes_count_each_file_once(bundles, filled):
    """A hard link and its blob are one file: removing C frees its three blobs (once each), its
    export, and its refs and meta."""
    cache = Cache()
    export_dir = cache.root / "exports" / filled["C"]
    mdir, c = cache.model_dir(FORK), filled["C"]
    want = sum(p.stat().st_size for p in [*mdir.rglob("*"), *export_dir.rglob("*")]
               if p.is_file() and "snapshots" not in p.parts)
    want += blob_bytes(bundles, "C", *FILES)
    plan = remove(cache, resolve_removal(cache, [FORK]), dry_run=True)
    assert plan.bytes == want
    assert [p for p, _ in plan.paths] == [mdir / "snapshots" / c, mdir / "meta" / f"{c}.json", mdir,
                                          export_dir, *sorted(blob_of(bundles, "C", f) for f in FILES)]


def test_a_blob_a_snapshot_links_stays_though_its_meta_is_lost(bundles, filled):
    """The meta names a bundle's blobs; where it is gone (deleted by hand, say) the snapshot's
    hard link still shows the blob is in use."""
    cache = Cache()
    (cache.model_dir(SMOL) / "meta" / f"{filled['B']}.json").unlink()
    remove(cache, resolve_removal(cache, [f"{SMOL}@1"]))
    shared = blob_of(bundles, "A", "rotations.safetensors")
    assert shared.exists() and not blob_of(bundles, "A", "README.md").exists()
    kept = cache.snapshot_dir(SMOL, filled["B"]) / "rotations.safetensors"
    assert kept.read_bytes() == shared.read_bytes()


def test_a_bundle_two_models_hold_keeps_its_blobs_and_export(bundles, filled):
    """The same bundle pulled under a second name (a registry's copy of the fork): removing the
    fork leaves the other name's snapshot whole, with the blobs and the export it shares."""
    cache = Cache()
    c = filled["C"]
    assert _put(cache, bundles["C"], "mirror/fork-copy", 1, ["latest"]) == c
    remove(cache, resolve_removal(cache, [FORK]))
    assert not cache.model_dir(FORK).exists()
    assert (cache.root / "exports" / c).is_dir() and all(blob_of(bundles, "C", f).exists() for f in FILES)
    assert [(h.model, h.digest) for h in cache.held("mirror/fork-copy")] == [("mirror--fork-copy", c)]
    assert verify_cache(cache)[1] == []


def test_two_arguments_of_one_model_and_a_repeated_one(bundles, filled):
    cache = Cache()
    remove(cache, resolve_removal(cache, [f"{SMOL}@1", f"{SMOL}@latest", f"{SMOL}@v1"]))
    assert not cache.model_dir(SMOL).exists()      # nothing of it left: the directory goes too
    assert not blob_of(bundles, "A", "rotations.safetensors").exists()
    assert [h.digest for h in cache.held()] == [filled["C"]]


def test_names_as_pull_takes_them(filled):
    """A hub id or alias of a catalog model, a registry name, the directory cache ls shows."""
    cache = Cache()
    for spec, model in (("HuggingFaceTB/SmolLM2-135M-Instruct", SMOL), ("smollm2@2", SMOL),
                        (FORK, FORK_DIR), (FORK_DIR, FORK_DIR), ("ORG/smollm2-fork@latest", FORK_DIR)):
        (target,) = resolve_removal(cache, [spec])
        assert target.model == model, spec


# --- dry run, errors ---------------------------------------------------------------------------

def test_dry_run_removes_nothing(filled):
    cache = Cache()
    before = tree(cache.root)
    plan = remove(cache, resolve_removal(cache, [SMOL, f"{FORK}@1"]), dry_run=True)
    assert cache.model_dir(SMOL) in {p for p, _ in plan.paths} and plan.bytes > 0
    result = CliRunner().invoke(cli, ["cache", "rm", SMOL, f"{FORK}@1", "--dry-run", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["dry_run"] is True and data["removed"] == [str(p) for p, _ in plan.paths]
    assert data["bytes"] == plan.bytes
    text = CliRunner().invoke(cli, ["cache", "rm", SMOL, "--dry-run"])
    assert text.exit_code == 0 and "would free" in text.stdout and filled["A"][:12] in text.stdout
    assert tree(cache.root) == before


@pytest.mark.parametrize("specs, error, says", [
    ([f"{SMOL}@1", "nosuch-model"], ModelNotFound, f"cached models: {FORK_DIR}, {SMOL}"),
    ([FORK, f"{SMOL}@9"], VersionNotFound, "v1 (refs recommended, v1)"),
    ([f"{SMOL}@stable", FORK], AliasNotFound, "v2 (refs latest, v2)"),
    ([f"{SMOL}@sha256:{'0' * 64}"], BundleNotFound, f"cached for {SMOL}"),
    ([f"{SMOL}@"], InvalidInput, "names no bundle after '@'"),
    (["../models", SMOL], UnsafePathError, "cannot be used as a cache directory"),
])
def test_a_bad_argument_removes_nothing(filled, specs, error, says):
    cache = Cache()
    before = tree(cache.root)
    with pytest.raises(error) as e:
        resolve_removal(cache, specs)
    assert says in str(e.value)
    result = CliRunner().invoke(cli, ["cache", "rm", *specs, "--yes"])
    assert result.exit_code == 1 and says in result.stderr
    if error is not InvalidInput and error is not UnsafePathError:
        assert "oscar-zoo cache ls" in result.stderr
    assert tree(cache.root) == before


def test_every_bad_argument_is_named(filled):
    result = CliRunner().invoke(cli, ["cache", "rm", "nosuch-model", f"{SMOL}@7", FORK, "--yes"])
    assert result.exit_code == 1
    assert "2 arguments" in result.stderr and "nosuch-model" in result.stderr and "@7" in result.stderr
    assert Cache().snapshot(FORK, filled["C"]) is not None


def test_a_model_dir_that_is_a_link_is_not_followed(filled, tmp_path):
    outside = tmp_path / "outside"
    (outside / "snapshots" / ("a" * 64)).mkdir(parents=True)
    (outside / "keep.txt").write_text("not the cache's")
    cache = Cache()
    (cache.root / "models" / "evil").symlink_to(outside, target_is_directory=True)
    result = CliRunner().invoke(cli, ["cache", "rm", "evil", "--yes"])
    assert result.exit_code == 1 and "is a link" in result.stderr
    assert (outside / "keep.txt").exists() and (outside / "snapshots" / ("a" * 64)).is_dir()


# --- the CLI -----------------------------------------------------------------------------------

def test_cli_json_removes_and_reports(bundles, filled):
    cache = Cache()
    result = CliRunner().invoke(cli, ["cache", "rm", f"{SMOL}@recommended", "--yes", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)      # stdout is the JSON alone
    a = filled["A"]
    assert [(b["model"], b["digest"], b["version"], b["layers"], sorted(b["refs"]))
            for b in data["bundles"]] == [(SMOL, a, 1, None, ["recommended", "v1"])]
    assert sorted(data["refs"]) == [f"{SMOL}/recommended", f"{SMOL}/v1"]
    assert data["dry_run"] is False and data["failed"] == []
    removed = set(data["removed"])
    assert str(cache.snapshot_dir(SMOL, a)) in removed and str(cache.root / "exports" / a) in removed
    assert str(blob_of(bundles, "A", "README.md")) in removed
    assert str(blob_of(bundles, "A", "rotations.safetensors")) not in removed   # B uses it
    assert data["bytes"] > 0 and not any(Path(p).exists() for p in removed)
    listed = json.loads(CliRunner().invoke(cli, ["cache", "ls", "--json"]).stdout)["bundles"]
    assert {(r["model"], r["digest"]) for r in listed} == {(SMOL, filled["B"]), (FORK_DIR, filled["C"])}


def test_cli_asks_first(filled):
    cache = Cache()
    before = tree(cache.root)
    result = CliRunner().invoke(cli, ["cache", "rm", FORK], input="n\n")
    assert result.exit_code == 1 and "Aborted" in result.stderr
    assert filled["C"][:12] in result.stderr and "freeing" in result.stderr
    assert tree(cache.root) == before
    result = CliRunner().invoke(cli, ["cache", "rm", FORK], input="y\n")
    assert result.exit_code == 0, result.output
    assert "freed" in result.stdout and not cache.model_dir(FORK).exists()


def test_cli_removes_no_more_than_was_confirmed(bundles, filled, monkeypatch):
    """What became unused while the user read the plan stays for the next prune; what was
    confirmed goes even so."""
    cache = Cache()

    def confirm_while_v2_goes(*args, **kwargs):   # another `cache rm` got in first
        remove(cache, resolve_removal(cache, [f"{SMOL}@2"]))
        return True

    monkeypatch.setattr(click, "confirm", confirm_while_v2_goes)
    result = CliRunner().invoke(cli, ["cache", "rm", f"{SMOL}@1", "--json"])
    assert result.exit_code == 0, result.output
    removed = set(json.loads(result.stdout)["removed"])
    assert str(cache.snapshot_dir(SMOL, filled["A"])) in removed
    assert list(cache.held(SMOL)) == []
    # the rotations v1 shared with v2 became v1's alone meanwhile: not in the plan confirmed
    rotations = blob_of(bundles, "A", "rotations.safetensors")
    assert str(rotations) not in removed and rotations.exists()
    assert rotations in {p for p, _ in prune(cache)}
    # the plan confirmed kept models/<name>/ (v2 was still there), yet nothing of the model is
    # left: it used to stay behind with empty refs/, snapshots/ and meta/ folders
    assert not cache.model_dir(SMOL).exists()
    assert cache.model_dir(FORK).is_dir()


def test_prune_removes_the_directory_of_a_model_it_took_the_last_bundle_of(bundles, filled):
    """A pull killed before it wrote its refs (or a `cache rm` killed after removing them)
    leaves a bundle no ref names; prune removed it and left models/<name>/ behind for good,
    holding empty refs/, snapshots/ and meta/ folders. Another model's stays whole."""
    cache = Cache()
    for ref in (cache.model_dir(FORK) / "refs").iterdir():
        ref.unlink()
    smol_before = tree(cache.model_dir(SMOL))
    removed = {p for p, _ in prune(cache)}
    assert cache.snapshot_dir(FORK, filled["C"]) in removed
    assert not cache.model_dir(FORK).exists()
    assert tree(cache.model_dir(SMOL)) == smol_before
    assert sorted(p.name for p in (cache.root / "models").iterdir()) == [SMOL]


def test_prune_keeps_a_model_directory_something_still_lives_in(bundles, filled):
    """rmdir, never rmtree: a file prune does not own (a ref naming a bundle not held, a staging
    dir of a pull) keeps its folder and the model's directory."""
    cache = Cache()
    for ref in (cache.model_dir(FORK) / "refs").iterdir():
        ref.unlink()
    cache.write_ref(FORK, "latest", "f" * 64)           # names nothing held: prune keeps refs
    staging = cache.model_dir(FORK) / "snapshots" / ".abc.123.partial"
    staging.mkdir()
    prune(cache)
    assert cache.refs(FORK) == {"latest": "f" * 64} and staging.is_dir()
    assert not (cache.model_dir(FORK) / "meta").exists()      # emptied by prune: gone


# --- the lock, crashes -------------------------------------------------------------------------

def test_waits_for_a_pull_in_progress(filled, monkeypatch):
    monkeypatch.setenv("OSCAR_ZOO_LOCK_TIMEOUT", "0.3")
    cache = Cache()
    before = tree(cache.root)
    with cache.gc_guard():      # what a pull holds from its first blob to its last ref
        with pytest.raises(LockTimeout, match="a pull is still running"):
            remove(cache, resolve_removal(cache, [SMOL]))
    assert tree(cache.root) == before


def test_killed_mid_removal_leaves_a_whole_snapshot_or_none(bundles, filled, monkeypatch):
    """Killed while deleting the renamed-aside snapshot: the snapshot is gone as a whole (never
    half its files), its refs are gone first, and prune finishes the job."""
    cache = Cache()
    a = filled["A"]
    real_rmtree = cache_mod.shutil.rmtree

    def killed(path, *args, **kwargs):
        assert cache.refs(SMOL) == {"latest": filled["B"], "v2": filled["B"]}   # refs went first
        assert not cache.snapshot_dir(SMOL, a).exists()       # renamed aside, in one step
        raise KeyboardInterrupt

    monkeypatch.setattr(cache_mod.shutil, "rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        remove(cache, resolve_removal(cache, [f"{SMOL}@1"]))
    monkeypatch.setattr(cache_mod.shutil, "rmtree", real_rmtree)
    assert [h.digest for h in cache.held(SMOL)] == [filled["B"]]
    assert verify_cache(cache)[1] == []
    aside = list((cache.root / "tmp").iterdir())
    assert aside and all(time.time() - p.stat().st_mtime < 60 for p in aside)
    for p in aside:                 # an hour later
        os.utime(p, (time.time() - 7200, time.time() - 7200))
    pruned = {p for p, _ in prune(cache)}
    assert set(aside) <= pruned and not list((cache.root / "tmp").iterdir())
    assert not blob_of(bundles, "A", "README.md").exists()
    assert blob_of(bundles, "A", "rotations.safetensors").exists()


def _removal_steps(monkeypatch) -> list[tuple[str, Path]]:
    """("fsync", dir) for each refs dir drop_refs fsyncs and ("delete", path) for each entry
    removed (cache._delete), in order, from now on; each done all the same."""
    from oscar_zoo.zoo import cache_remove

    steps: list[tuple[str, Path]] = []
    real_fsync, real_delete = cache_mod.fsync_dir, cache_mod._delete

    def fsync_dir(path):
        steps.append(("fsync", Path(path)))
        real_fsync(path)

    def delete(cache, path):
        steps.append(("delete", path))
        return real_delete(cache, path)

    monkeypatch.setattr(cache_mod, "fsync_dir", fsync_dir)
    for module in (cache_mod, cache_remove):
        monkeypatch.setattr(module, "_delete", delete)
    return steps


def test_drop_refs_unlinks_the_refs_named_and_fsyncs_their_dir_once(filled, monkeypatch):
    """The one way refs go (cache rm, verify's repair): the refs named, not the others, then one
    fsync of the refs dir for all of them; a ref gone already is no error; none named, no fsync."""
    cache = Cache()
    steps = _removal_steps(monkeypatch)
    cache_mod.drop_refs(cache, SMOL, ["v1", "recommended", "gone-already"])
    assert cache.refs(SMOL) == {"latest": filled["B"], "v2": filled["B"]}
    assert steps == [("fsync", cache.model_dir(SMOL) / "refs")]
    cache_mod.drop_refs(cache, SMOL, [])
    assert len(steps) == 1 and cache.refs(FORK) == {"latest": filled["C"], "v1": filled["C"]}


def test_cache_rm_drops_each_models_refs_with_one_fsync_before_anything_goes(filled, monkeypatch):
    """Two refs of one bundle and a whole model's: one fsync of each refs dir, both before the
    first rename aside, so a crash between leaves bundles no ref names (prune's to remove),
    never a ref to a bundle that is gone."""
    cache = Cache()
    steps = _removal_steps(monkeypatch)
    plan = remove(cache, resolve_removal(cache, [f"{SMOL}@1", FORK]))
    assert plan.failed == [] and cache.refs(SMOL) == {"latest": filled["B"], "v2": filled["B"]}
    assert steps[:2] == [("fsync", cache.root / "models" / FORK_DIR / "refs"),
                         ("fsync", cache.root / "models" / SMOL / "refs")]
    assert [what for what, _ in steps[2:]] == ["delete"] * len(plan.paths)
    assert not cache.model_dir(FORK).exists() and cache.snapshot(SMOL, filled["A"]) is None


def test_an_export_from_the_cache_holds_off_cache_rm_while_it_builds(filled, monkeypatch, tmp_path):
    """`oscar-zoo export NAME` reads a cached snapshot as `pull --format` does, and waits as it
    does: a `cache rm` meanwhile used to delete the snapshot under it (the export failed with
    "no bundle.json in it")."""
    import threading

    monkeypatch.setenv("OSCAR_ZOO_LOCK_TIMEOUT", "0.5")
    building, release = paused_export_build(monkeypatch)
    seen = {}
    out = tmp_path / "out"
    exporter = threading.Thread(target=lambda: seen.update(r=CliRunner().invoke(
        cli, ["export", f"{SMOL}@2", "--format", "sglang", "--out", str(out), "--json"])))
    exporter.start()
    cache = Cache()
    try:
        assert building.wait(20)
        with pytest.raises(LockTimeout, match="still running"):
            remove(cache, resolve_removal(cache, [f"{SMOL}@2"]))
    finally:
        release.set()
        exporter.join(30)
    assert seen["r"].exit_code == 0, seen["r"].output
    assert cache.snapshot(SMOL, filled["B"]) is not None and any(out.iterdir())
    # once it is done, the removal goes through
    assert remove(cache, resolve_removal(cache, [f"{SMOL}@2"])).failed == []
    assert cache.snapshot(SMOL, filled["B"]) is None


def test_a_digest_prefix_of_decimal_digits_names_the_bundle(filled):
    """`cache ls` shows 12 hex digits; about one digest in 300 starts with 12 decimal ones, which
    pull's syntax reads as a version number: the prefix still names the bundle."""
    cache = Cache()
    digits = "0123456789" + "ab" * 27
    cache.write_ref("digits-model", "v1", digits)
    cache.write_meta("digits-model", digits, {"model": "digits-model", "digest": digits, "version": 1})
    for spec in ("digits-model@0123456789", "digits-model@012345", f"digits-model@{digits}"):
        (target,) = resolve_removal(cache, [spec])
        assert target.digests == {digits}, spec
    with pytest.raises(VersionNotFound):   # a version that is no digest's prefix either
        resolve_removal(cache, ["digits-model@98765"])
    result = CliRunner().invoke(cli, ["cache", "rm", "digits-model@0123456789ab", "--yes", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["refs"] == ["digits-model/v1"]
    assert cache.refs("digits-model") == {}


def test_a_file_that_cannot_be_removed_is_reported_and_the_rest_goes(bundles, filled, monkeypatch):
    """A blob whose unlink fails (permissions, a read-only file where that stops it) is named
    in `failed`, with a warning and exit status 1, as a directory is; the removal went on past
    it, and the bytes it still holds are not counted as freed (it stopped the removal with a
    bare OSError, the rest of the plan not done)."""
    cache = Cache()
    stuck = blob_of(bundles, "A", "README.md")
    real_unlink = Path.unlink

    def unlink(self, missing_ok=False):
        if self == stuck:
            raise PermissionError(13, "Permission denied", str(self))
        return real_unlink(self, missing_ok=missing_ok)

    planned = remove(cache, resolve_removal(cache, [f"{SMOL}@1"]), dry_run=True)
    monkeypatch.setattr(Path, "unlink", unlink)
    result = CliRunner().invoke(cli, ["cache", "rm", f"{SMOL}@1", "--yes", "--json"])
    assert result.exit_code == 1, result.output
    assert f"could not remove all of {stuck}" in result.stderr
    data = json.loads(result.stdout)
    assert data["failed"] == [str(stuck)] and stuck.exists()
    assert data["bytes"] == planned.bytes - stuck.stat().st_size
    assert not any(Path(p).exists() for p in data["removed"] if p != str(stuck))
    assert not blob_of(bundles, "A", "bundle.json").exists()


@pytest.mark.parametrize("name", ["d:", "d:projects", "C:x"])
def test_a_name_with_a_drive_letter_is_no_cache_directory(filled, name):
    """On Windows models/ joined with `d:` is the current directory of drive D, not a folder of
    the cache: `cache rm d:` would have taken it for a model and deleted it. No model or ref
    name has a ':' (registry, hub ids, the catalog), so none is used as a cache path."""
    from pathlib import PureWindowsPath

    from oscar_zoo.zoo.cache import model_key

    assert not str(PureWindowsPath("C:/cache/models") / "d:").startswith("C:")   # the premise
    with pytest.raises(UnsafePathError):
        model_key(name)
    with pytest.raises(UnsafePathError):
        resolve_removal(Cache(), [name])
    with pytest.raises(UnsafePathError):     # an alias a registry sent, written as a ref
        Cache().write_ref(SMOL, name, filled["A"])
    result = CliRunner().invoke(cli, ["cache", "rm", name, "--yes"])
    assert result.exit_code == 1 and "cannot be used" in result.stderr


# --- refs made by hand ------------------------------------------------------------------------

def _hand_made_ref(name: str, digest: str) -> None:
    (Cache().model_dir(SMOL) / "refs" / name).write_text(digest + "\n")


def test_a_ref_made_by_hand_with_a_colon_goes_with_its_bundle(bundles, filled):
    """`v3:draft`, a name oscar-zoo never writes (no ':' in a cache path), is listed like any
    ref: cache rm of its bundle planned it, then refused it after the confirmation, with the
    other model's refs already dropped (they go first)."""
    cache = Cache()
    _hand_made_ref("v3:draft", filled["A"])
    result = CliRunner().invoke(cli, ["cache", "rm", FORK, f"{SMOL}@1", "--yes", "--json"])
    assert result.exit_code == 0, result.output
    assert f"{SMOL}/v3:draft" in json.loads(result.stdout)["refs"]
    assert cache.refs(SMOL) == {"latest": filled["B"], "v2": filled["B"]}
    assert cache.snapshot(SMOL, filled["A"]) is None and not cache.model_dir(FORK).exists()
    assert cache.snapshot(SMOL, filled["B"]) is not None and prune(cache) == []


def test_a_ref_made_by_hand_names_its_bundle_as_cache_ls_shows_it(bundles, filled):
    cache = Cache()
    _hand_made_ref("v3:draft", filled["A"])
    assert resolve_removal(cache, [f"{SMOL}@v3:draft"])[0].digests == {filled["A"]}
    result = CliRunner().invoke(cli, ["cache", "rm", f"{SMOL}@v3:draft", "--yes"])
    assert result.exit_code == 0, result.output
    assert cache.refs(SMOL) == {"latest": filled["B"], "v2": filled["B"]}
    assert cache.snapshot(SMOL, filled["A"]) is None and cache.snapshot(SMOL, filled["B"])


def test_a_ref_pull_cannot_parse_and_the_cache_lacks_removes_nothing(filled):
    cache = Cache()
    _hand_made_ref("v3:draft", filled["A"])
    before = tree(cache.root)
    with pytest.raises(AliasNotFound, match="v3:draft"):     # what is cached, refs and all
        resolve_removal(cache, [f"{SMOL}@v4:draft"])
    result = CliRunner().invoke(cli, ["cache", "rm", f"{SMOL}@v4:draft", "--yes"])
    assert result.exit_code == 1 and result.exception.__class__ is SystemExit
    assert "'smollm2-135m@v4:draft' is not in the cache" in result.stderr
    assert "oscar-zoo cache ls" in result.stderr and tree(cache.root) == before


def test_a_listed_ref_goes_by_its_own_name_not_a_stripped_one(filled):
    """`latest ` (a trailing space, made by hand) names A, `latest` names B: removing A took
    B's `latest` and left `latest ` naming a bundle that is gone."""
    cache = Cache()
    _hand_made_ref("latest ", filled["A"])
    remove(cache, resolve_removal(cache, [f"{SMOL}@1"]))
    assert cache.refs(SMOL) == {"latest": filled["B"], "v2": filled["B"]}


def test_a_ref_named_with_capitals_is_that_ref_not_its_lowercase_twin(filled):
    """pull's syntax folds an alias's case: `@Draft` named the hand-made `draft` beside it (the
    other bundle), or, with no `draft`, was "not in the cache (refs Draft, ...)"."""
    cache = Cache()
    _hand_made_ref("Draft", filled["A"])
    assert resolve_removal(cache, [f"{SMOL}@Draft"])[0].digests == {filled["A"]}
    _hand_made_ref("draft", filled["B"])
    assert resolve_removal(cache, [f"{SMOL}@Draft"])[0].digests == {filled["A"]}
    assert resolve_removal(cache, [f"{SMOL}@draft"])[0].digests == {filled["B"]}


def test_a_folder_or_binary_file_where_a_ref_goes_is_no_ref(filled):
    """read_ref (every pull's write_ref, offline pulls) read refs/latest strictly: a folder
    there raised IsADirectoryError, binary bytes UnicodeDecodeError."""
    cache = Cache()
    refs = cache.model_dir(SMOL) / "refs"
    (refs / "latest").unlink()
    (refs / "latest").mkdir()
    (refs / "v2").write_bytes(b"\xff\xfe" * 40)
    assert cache.read_ref(SMOL, "latest") is None and cache.read_ref(SMOL, "v2") is None
    cache.write_ref(SMOL, "v1", filled["A"])
    assert cache.read_ref(SMOL, "v1") == filled["A"]


@pytest.mark.parametrize("name", ["../meta", "..", "", "a/b"])
def test_drop_refs_unlinks_nothing_for_a_name_that_is_no_ref_file(filled, name):
    cache = Cache()
    before = tree(cache.root)
    with pytest.raises(UnsafePathError, match="nothing was removed"):
        cache_mod.drop_refs(cache, SMOL, ["v1", name])
    assert tree(cache.root) == before


# --- bundles calibrate rescued -----------------------------------------------------------------

def rescue(bundles, key: str = "A", out: str = "qwen3-8b-bundle") -> Path:
    """Save a bundle as `oscar-zoo calibrate` does when its --out is full; its path."""
    saved, failures = calibrate_cmds._rescue(bundle_mod.read(bundles[key]), Path("/full") / out)
    assert saved is not None and saved.parent.parent == Cache().rescued, failures
    return saved


def killed(name: str, age: float = 0) -> Path:
    """A rescued dir a calibrate killed while writing its bundle left (only the hidden staging
    dir, 300 bytes in it), last written `age` seconds ago."""
    path = Cache().rescued / name
    staging = path / ".qwen3-8b-bundle.x1.partial"
    staging.mkdir(parents=True)
    (staging / "rotations.safetensors").write_bytes(b"x" * 300)
    aged(path, age)
    return path


def aged(path: Path, age: float) -> None:
    """Everything in it last written `age` seconds ago."""
    when = time.time() - age
    for p in [*path.rglob("*"), path]:
        os.utime(p, (when, when), follow_symlinks=False)


def cache_ls(*args: str):
    result = CliRunner().invoke(cli, ["cache", "ls", *args])
    assert result.exit_code == 0, result.output
    return result


def rm_rescued(*args: str, **kwargs):
    return CliRunner().invoke(cli, ["cache", "rm", "--rescued", *args], **kwargs)


def test_cache_ls_lists_rescued_bundles_after_the_cached_models(bundles, filled):
    """A user who missed calibrate's one error line finds the bundle again in `cache ls`: what
    to move (its path) and what to remove (its name); a dir a calibrate killed mid-write left
    with no bundle in it is listed too, as what it holds still takes room, and said to be
    incomplete (nothing in it to move). Times in UTC, as a bundle's pulled_at."""
    before = int(time.time())
    saved = rescue(bundles)
    dead = killed("calibrate-20000101-000000Z-killed00")
    os.utime(dead, (946684800, 946684800))     # 2000-01-01T00:00:00Z: its staging began
    data = json.loads(cache_ls("--json").stdout)
    assert {(b["model"], b["digest"]) for b in data["bundles"]} == {
        (SMOL, filled["A"]), (SMOL, filled["B"]), (FORK_DIR, filled["C"])}
    assert data["rescued"][0] == {
        "name": dead.name, "bundle": None, "state": "incomplete", "path": str(dead), "size": 300,
        "saved_at": "2000-01-01T00:00:00Z"}
    row = data["rescued"][1]
    assert len(data["rescued"]) == 2 and row == {
        "name": saved.parent.name, "bundle": "qwen3-8b-bundle", "state": "saved",
        "path": str(saved), "size": sum(f.stat().st_size for f in saved.iterdir()),
        "saved_at": row["saved_at"]}
    saved_at = calendar.timegm(time.strptime(row["saved_at"], "%Y-%m-%dT%H:%M:%SZ"))
    assert before <= saved_at <= time.time()        # UTC, when calibrate saved it
    # and its name carries the same UTC time (calibrate-<time>Z-<random>)
    assert saved.parent.name.startswith(time.strftime("calibrate-%Y%m%d-", time.gmtime(saved_at)))
    result = cache_ls()
    lines = result.stdout.splitlines()
    exports = lines.index(next(line for line in lines if line.startswith("exports: ")))
    assert lines[2:exports] and all(line.split()[0] in (SMOL, FORK_DIR) for line in lines[2:exports])
    assert lines[exports + 1] == "" and lines[exports + 2].split() == [
        "RESCUED", "BUNDLE", "SAVED", "(UTC)", "SIZE", "PATH"]
    rows = [line.split() for line in lines[exports + 3:]]
    assert [(r[0], r[1], r[2], r[-1]) for r in rows] == [
        (dead.name, "(incomplete)", "2000-01-01T00:00:00Z", str(dead)),
        (saved.parent.name, "qwen3-8b-bundle", row["saved_at"], str(saved))]
    hint = result.stderr        # stderr, not among the data
    assert "cache rm --rescued" in hint and "`mv PATH DIR`" in hint
    assert "(incomplete) one holds no whole bundle, nothing to move" in hint


def test_the_hint_tells_no_one_to_move_a_dir_that_holds_no_bundle(filled):
    killed("calibrate-20000101-000000Z-killed00")
    hint = cache_ls().stderr
    assert "mv " not in hint and "cache rm --rescued" in hint and "incomplete" in hint


def test_rescued_bundles_go_only_with_cache_rm_rescued(bundles, filled, monkeypatch):
    """prune and a cache rm of models leave them; `--rescued NAME` removes that one, under the
    lock and renamed aside as any removal; `--rescued` alone the rest."""
    from oscar_zoo.zoo.cache_remove import remove_rescued

    first, second = rescue(bundles, "A"), rescue(bundles, "C", "other-bundle")
    cache = Cache()
    prune(cache)
    assert CliRunner().invoke(cli, ["cache", "rm", FORK, "--yes"]).exit_code == 0
    assert first.is_dir() and second.is_dir()
    models = tree(cache.root / "models")
    dry = rm_rescued("--dry-run")
    assert dry.exit_code == 0 and "would free" in dry.stdout and first.is_dir() and second.is_dir()
    assert f"{first.parent.name} qwen3-8b-bundle, saved " in dry.stdout
    # under the lock: not while a pull (or a calibrate saving a bundle) holds it shared
    monkeypatch.setenv("OSCAR_ZOO_LOCK_TIMEOUT", "0.3")
    with cache.gc_guard():
        with pytest.raises(LockTimeout, match="a pull is still running"):
            remove_rescued(cache, resolve_rescued(cache, [first.parent.name]))
        held = rm_rescued(first.parent.name, "--yes")
        assert held.exit_code == 1 and "waited 0.3 s" in held.stderr, held.output
    assert first.is_dir()
    # renamed aside into tmp/ first, in one step, then deleted there
    deleted = []
    real_rmtree = cache_mod.shutil.rmtree

    def rmtree(path, *args, **kwargs):
        deleted.append((Path(path).parent, first.parent.exists()))
        return real_rmtree(path, *args, **kwargs)

    monkeypatch.setattr(cache_mod.shutil, "rmtree", rmtree)
    result = rm_rescued(first.parent.name, "--yes", "--json")
    assert result.exit_code == 0, result.output
    assert deleted == [(cache.root / "tmp", False)]
    data = json.loads(result.stdout)
    size = sum(f.stat().st_size for f in bundles["A"].iterdir())
    assert data["removed"] == [str(first.parent)] and data["bytes"] == size
    assert [r["name"] for r in data["rescued"]] == [first.parent.name] and data["failed"] == []
    assert not first.parent.exists() and second.is_dir()
    assert [r["name"] for r in json.loads(cache_ls("--json").stdout)["rescued"]] == [second.parent.name]
    result = rm_rescued(input="y\n")
    assert result.exit_code == 0 and "remove 1 rescued bundle," in result.stderr, result.output
    assert f"{second.parent.name} other-bundle, saved " in result.stderr     # the plan shown
    assert not second.parent.exists() and not cache.rescued.exists()     # with its last rescue
    assert json.loads(cache_ls("--json").stdout)["rescued"] == []
    assert "RESCUED" not in cache_ls().stdout
    assert tree(cache.root / "models") == models
    again = rm_rescued("--yes")
    assert again.exit_code == 0 and again.stdout.strip() == "nothing to remove"


def test_rescued_goes_with_its_last_rescue_under_the_lock(bundles, filled, monkeypatch):
    """rescued/ was left behind empty for good: now it goes with the last dir in it, in the same
    hold of gc.lock as that removal. A dry run, or a dir that stays in it, keeps it; the next
    rescue makes it again."""
    from oscar_zoo.zoo import cache_remove

    first, second = rescue(bundles, "A"), rescue(bundles, "C", "other-bundle")
    fresh = killed("calibrate-20990101-000000Z-writing0")     # --rescued with no name keeps it
    cache = Cache()
    assert rm_rescued(first.parent.name, "--yes").exit_code == 0 and cache.rescued.is_dir()
    assert rm_rescued("--dry-run").exit_code == 0 and second.is_dir()
    result = rm_rescued("--yes")
    assert result.exit_code == 0 and "keeping 1 rescued dir" in result.stderr, result.output
    assert not second.parent.exists() and fresh.is_dir() and cache.rescued.is_dir()
    monkeypatch.setenv("OSCAR_ZOO_LOCK_TIMEOUT", "0.1")
    real_rmdir, locked = cache_remove._rmdir_if_empty, []

    def rmdir_if_empty(path):
        if path == cache.rescued:
            with pytest.raises(LockTimeout), cache.gc_guard():     # as a calibrate would wait
                pass
            locked.append(path)
        real_rmdir(path)

    monkeypatch.setattr(cache_remove, "_rmdir_if_empty", rmdir_if_empty)
    result = rm_rescued(fresh.name, "--yes")
    assert result.exit_code == 0, result.output
    assert locked == [cache.rescued] and not cache.rescued.exists()
    assert json.loads(cache_ls("--json").stdout)["rescued"] == []
    assert rescue(bundles).parent.parent == cache.rescued


def test_a_rescued_dir_that_is_a_link_is_not_removed_for_being_empty(filled, tmp_path):
    from oscar_zoo.zoo.cache_remove import remove_rescued

    outside = tmp_path / "elsewhere"
    outside.mkdir()
    cache = Cache()
    cache.rescued.symlink_to(outside, target_is_directory=True)
    assert remove_rescued(cache, []).failed == []
    assert cache.rescued.is_symlink() and outside.is_dir()


def test_a_rescue_being_written_holds_off_cache_rm_rescued(bundles, filled, monkeypatch):
    """calibrate holds the cache's gc.lock shared from making its rescued dir to its bundle's
    last file: a `cache rm --rescued` then (with or without its name) waits, and removes
    nothing of a bundle half-written; the bundle is saved whole."""
    monkeypatch.setenv("OSCAR_ZOO_LOCK_TIMEOUT", "0.3")
    real_write = bundle_mod.atomic_write_bytes
    seen = []

    def write_while_cache_rm_runs(path, data, *args, **kwargs):
        if not seen:        # the staging dir exists: the first file of the bundle
            name = Path(path).parent.parent.name
            seen.append(name)
            for args_ in (["--yes"], [name, "--yes"]):
                result = rm_rescued(*args_)
                assert result.exit_code == 1 and "waited 0.3 s" in result.stderr, result.output
        return real_write(path, data, *args, **kwargs)

    monkeypatch.setattr(bundle_mod, "atomic_write_bytes", write_while_cache_rm_runs)
    saved = rescue(bundles)
    assert seen == [saved.parent.name]
    assert bundle_mod.read(saved).manifest == bundle_mod.read(bundles["A"]).manifest


def test_a_rescue_that_cannot_lock_the_cache_saves_the_bundle_all_the_same(bundles, filled,
                                                                            monkeypatch, capsys):
    """A prune (or cache rm) holding the lock past lock_timeout: hours of calibration lost
    would be worse, so the bundle is written anyway, with a warning."""
    monkeypatch.setenv("OSCAR_ZOO_LOCK_TIMEOUT", "0.3")
    cache = Cache()
    with cache.gc_guard(exclusive=True):
        capsys.readouterr()
        saved = rescue(bundles)
    warning = capsys.readouterr().err
    assert "could not lock the cache" in warning and "waited 0.3 s" in warning
    assert "run no `oscar-zoo cache rm --rescued` until this calibrate has ended" in warning
    assert bundle_mod.read(saved).manifest == bundle_mod.read(bundles["A"]).manifest


def test_a_rescued_dir_that_changed_since_it_was_confirmed_stays(bundles, filled, monkeypatch):
    """The plan, the question and the removal are three steps: what the user confirmed goes
    only as it was then. A dir a calibrate finished writing meanwhile (its staging dir renamed
    to the bundle), or a bundle moved in, stays; the rest of the plan goes."""
    first = rescue(bundles)
    dead = killed("calibrate-20000101-000000Z-killed00", age=7200)
    staging = next(dead.iterdir())

    def confirm_while_calibrate_finishes(*args, **kwargs):
        os.rename(staging, dead / "qwen3-8b-bundle")
        return True

    monkeypatch.setattr(click, "confirm", confirm_while_calibrate_finishes)
    result = rm_rescued("--json")
    assert result.exit_code == 0, result.output
    assert f"{dead.name} (incomplete: calibrate killed or still writing), saved" in result.stderr
    data = json.loads(result.stdout)
    assert data["removed"] == [str(first.parent)] and [r["name"] for r in data["rescued"]] == [
        first.parent.name]
    assert not first.parent.exists() and (dead / "qwen3-8b-bundle" / "rotations.safetensors").exists()
    assert [r["state"] for r in json.loads(cache_ls("--json").stdout)["rescued"]] == ["saved"]


def test_cache_rm_rescued_with_no_name_leaves_what_may_still_be_written(bundles, filled):
    """No NAME: every saved bundle; a dir with no bundle (a calibrate killed, or a rescue of a
    calibrate older than its lock still writing) once an hour has passed since anything was
    written to it; the empty calibrate-* dirs a user moving bundles out leaves, as old (a fresh
    one is a mkdtemp about to be filled). A NAME takes the one it names, however fresh."""
    saved = rescue(bundles)
    old_dead = killed("calibrate-20000101-000000Z-killed00", age=7200)
    fresh_dead = killed("calibrate-20990101-000000Z-writing0")
    old_empty, fresh_empty, kept_empty = (Cache().rescued / n for n in (
        "calibrate-20000101-000000Z-moved000", "calibrate-20990101-000000Z-mkdtemp0", "mine"))
    for path in (old_empty, fresh_empty, kept_empty):
        path.mkdir()
    aged(old_empty, 7200)
    aged(kept_empty, 7200)      # not a name calibrate gives: not its to tidy
    plan = rm_rescued("--dry-run")
    assert plan.exit_code == 0, plan.output
    assert f"{old_dead.name} (incomplete: calibrate killed or still writing), saved " in plan.stdout
    assert f"{old_empty.name} (empty: its bundle was moved out)" in plan.stdout
    assert f"keeping 1 rescued dir: {fresh_dead.name} (no whole bundle" in plan.stderr
    result = rm_rescued(input="y\n")
    assert result.exit_code == 0, result.output
    assert ("remove 1 rescued bundle and 2 rescued dirs with no bundle (1 incomplete, 1 empty)"
            in result.stderr)
    assert set(result.stdout.splitlines()[:-1]) == {str(saved.parent), str(old_dead), str(old_empty)}
    assert not saved.parent.exists() and not old_dead.exists() and not old_empty.exists()
    assert fresh_dead.is_dir() and fresh_empty.is_dir() and kept_empty.is_dir()
    named = rm_rescued(fresh_dead.name, "--yes", "--json")
    assert named.exit_code == 0 and json.loads(named.stdout)["removed"] == [str(fresh_dead)]
    assert json.loads(named.stdout)["bytes"] == 300
    assert sorted(p.name for p in Cache().rescued.iterdir()) == sorted([fresh_empty.name, "mine"])


@pytest.mark.parametrize("how", ["chmod", "scandir"])
def test_a_rescued_dir_that_cannot_be_read_is_listed_not_an_error(bundles, filled, monkeypatch,
                                                                  how):
    """Another user's rescue (mkdtemp makes it 0700) must not stop `cache ls` or `cache rm
    --rescued`: listed with its size unknown; left by `--rescued` with no name (whole or not,
    who knows), tried when named."""
    mine, theirs = rescue(bundles), rescue(bundles, "C", "their-bundle")
    if how == "chmod":
        if os.geteuid() == 0:
            pytest.skip("root reads a mode-000 dir all the same; the scandir case covers this")
        theirs.parent.chmod(0o000)
    else:
        real_scandir = os.scandir

        def scandir(path="."):
            if not isinstance(path, int) and Path(os.fspath(path)) in (theirs.parent, theirs):
                raise PermissionError(13, "Permission denied", os.fspath(path))
            return real_scandir(path)

        monkeypatch.setattr(os, "scandir", scandir)
    try:
        data = {r["name"]: r for r in json.loads(cache_ls("--json").stdout)["rescued"]}
        assert {n: (r["bundle"], r["state"], r["size"]) for n, r in data.items()} == {
            mine.parent.name: ("qwen3-8b-bundle", "saved", _size_of(mine)),
            theirs.parent.name: (None, "unreadable", None)}
        result = cache_ls()
        row = next(line for line in result.stdout.splitlines() if line.startswith(theirs.parent.name))
        assert row.split()[1:5] == ["(unreadable)", data[theirs.parent.name]["saved_at"], "?",
                                    str(theirs.parent)]
        assert "another user's" in result.stderr
        assert [r.kind for r in resolve_rescued(Cache(), [theirs.parent.name])] == ["unreadable"]
        removed = rm_rescued("--yes")
        assert removed.exit_code == 0, removed.output
        assert f"keeping 1 rescued dir: {theirs.parent.name} (not readable by you)" in removed.stderr
        assert not mine.parent.exists() and theirs.parent.is_dir()
    finally:
        theirs.parent.chmod(0o700)


def _size_of(bundle: Path) -> int:
    return sum(f.stat().st_size for f in bundle.iterdir())


def test_a_link_counts_as_itself_in_sizes_and_freed_bytes(bundles, filled, tmp_path):
    """`cache ls` and the bytes `cache rm` frees count a link the same way: its own size, never
    what it points at."""
    target = tmp_path / "big"
    target.write_bytes(b"x" * 5000)
    saved = rescue(bundles)
    (saved / "link").symlink_to(target)
    assert cache_mod._size(saved) == sum(n for _, n in cache_mod._freed([saved]))
    assert cache_mod._size(saved) == _size_of(saved) - 5000 + (saved / "link").lstat().st_size
    listed = json.loads(cache_ls("--json").stdout)["rescued"][0]["size"]
    freed = json.loads(rm_rescued("--dry-run", "--json").stdout)["bytes"]
    assert listed == freed == cache_mod._size(saved.parent)


@pytest.mark.parametrize("name, error", [
    ("../x", UnsafePathError), ("../models", UnsafePathError), ("calibrate-1/../../x", UnsafePathError),
    (".", UnsafePathError), ("..", UnsafePathError), ("", UnsafePathError), ("d:x", UnsafePathError),
    ("ABSOLUTE", UnsafePathError), ("nosuch", BundleNotFound)])
def test_a_rescued_name_that_is_a_path_or_names_nothing_removes_nothing(bundles, filled, name,
                                                                         error):
    """A name must never reach outside rescued/: `../x` is refused though cache/x exists, and
    so is the absolute path of a rescued dir itself (a name, not a path, is taken)."""
    saved = rescue(bundles)
    cache = Cache()
    (cache.root / "x").mkdir()
    (cache.root / "x" / "keep.txt").write_text("not a rescued bundle")
    name = str(saved.parent) if name == "ABSOLUTE" else name
    before = tree(cache.root)
    with pytest.raises(error) as e:
        resolve_rescued(cache, [name])
    says = "not the name of a rescued bundle" if error is UnsafePathError else "is not a rescued bundle"
    assert says in str(e.value) and "oscar-zoo cache ls" in str(e.value)
    result = rm_rescued(name, "--yes")
    assert result.exit_code == 1 and says in result.stderr, result.output
    both = rm_rescued(saved.parent.name, name, "--yes")
    assert both.exit_code == 1 and says in both.stderr
    assert tree(cache.root) == before


def test_a_rescued_entry_that_is_a_link_is_not_followed(bundles, filled, tmp_path):
    outside = tmp_path / "outside"
    (outside / "b").mkdir(parents=True)
    (outside / "b" / "keep.txt").write_text("not the cache's")
    cache = Cache()
    cache.rescued.mkdir(parents=True)
    (cache.rescued / "evil").symlink_to(outside, target_is_directory=True)
    assert json.loads(cache_ls("--json").stdout)["rescued"] == []
    result = rm_rescued("evil", "--yes")
    assert result.exit_code == 1 and "is a link" in result.stderr
    assert rm_rescued("--yes").exit_code == 0
    assert (outside / "b" / "keep.txt").exists() and (cache.rescued / "evil").is_symlink()


def test_an_empty_rescued_dir_adds_nothing_to_cache_ls(filled):
    """No rescued/ at all, an empty one, and the empty dir a user leaves moving the bundle out
    (`mv rescued/calibrate-.../b DIR`, as calibrate's message says): the same output."""
    plain, plain_json = cache_ls(), json.loads(cache_ls("--json").stdout)
    assert plain_json["rescued"] == []
    (Cache().rescued / "calibrate-20250101-120000-moved000").mkdir(parents=True)
    result = cache_ls()
    assert (result.stdout, result.stderr) == (plain.stdout, plain.stderr) and result.stderr == ""
    assert json.loads(cache_ls("--json").stdout) == plain_json


def test_cache_rm_needs_names_or_rescued(filled):
    result = CliRunner().invoke(cli, ["cache", "rm", "--yes"])
    assert result.exit_code == 2 and "--rescued" in result.stderr
