"""`oscar-zoo verify` beside pulls: it hashes under the gc lock shared, as pulls hold it, so
they go on meanwhile; it deletes what is still wrong when checked again under the lock held
exclusively, as prune and cache rm hold it (waiting for pulls), removes a snapshot in one step,
and removes only what is wrong."""

from __future__ import annotations

import contextlib
import json
import threading
from pathlib import Path

import pytest
from click.testing import CliRunner

from oscar_zoo.zoo import cache as cache_mod
from oscar_zoo.zoo.cache import Cache, verify_cache
from oscar_zoo.zoo.cli.main import cli
from oscar_zoo.zoo.errors import LockTimeout
from oscar_zoo.zoo.pull import pull

from .conftest import flip_a_byte

GLM = "glm-4.7-fp8"


def _meta_paused(monkeypatch) -> tuple[threading.Event, threading.Event]:
    """(linked, release): a pull stops between publishing its snapshot and writing its meta,
    sets `linked` there and goes on once `release` is set."""
    linked, release = threading.Event(), threading.Event()
    real_write_meta = Cache.write_meta

    def write_meta_after_a_pause(self, *args):
        linked.set()
        release.wait(20)
        return real_write_meta(self, *args)

    monkeypatch.setattr(Cache, "write_meta", write_meta_after_a_pause)
    return linked, release


def test_verify_waits_for_a_pull_that_has_not_written_its_meta_yet(hf_only, monkeypatch):
    """A pull publishes its snapshot, then its meta and refs. verify running in between found
    the snapshot's files "not recorded in the cache's metadata", reported them CORRUPT and
    deleted the snapshot the pull was about to return and export."""
    monkeypatch.setenv("OSCAR_ZOO_LOCK_TIMEOUT", "0.5")
    linked, release = _meta_paused(monkeypatch)
    seen = {}

    def puller():
        try:
            seen["r"] = pull(GLM, fmt="sglang")
        except Exception as e:  # reported below
            seen["error"] = e

    thread = threading.Thread(target=puller)
    thread.start()
    try:
        assert linked.wait(60)
        assert list(Cache().snapshots(GLM))          # published, its meta not yet written
        with pytest.raises(LockTimeout, match="a pull is still running"):
            verify_cache(Cache())
    finally:
        release.set()
        thread.join(60)
    assert "error" not in seen, seen.get("error")
    assert seen["r"].path.exists() and seen["r"].export.files["k"].exists()
    assert verify_cache(Cache()) == (5, [])


def test_a_verify_killed_while_deleting_a_snapshot_leaves_none_half_there(hf_only, monkeypatch):
    """The repair deleted a corrupt snapshot file by file: killed midway, it left a snapshot
    directory missing files, which pulls take for complete (it exists) and served as cached."""
    first = pull(GLM)
    meta = Cache().read_meta(GLM, first.digest)
    flip_a_byte(Cache().blob(meta["files"]["rotations.safetensors"]))
    real_rmtree = cache_mod.shutil.rmtree

    def killed_after_one_file(path, *args, **kwargs):
        next(p for p in sorted(path.rglob("*")) if p.is_file()).unlink()
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(cache_mod.shutil, "rmtree", killed_after_one_file)
        with pytest.raises(KeyboardInterrupt):
            verify_cache(Cache())
    assert Cache().snapshot(GLM, first.digest) is None     # whole, or (here) not at all
    again = pull(GLM)     # converted again from the kept .pt files, all of it
    assert again.digest == first.digest
    assert sorted(p.name for p in again.path.iterdir()) == ["README.md", "bundle.json",
                                                            "rotations.safetensors"]
    assert verify_cache(Cache()) == (3, [])


def test_a_corrupt_layers_part_goes_and_the_whole_snapshot_of_its_bundle_stays(registry,
                                                                             glm_bundles):
    """verify deleted every directory of a bundle with a problem: the part's rotation file of
    layers 0-3 took the whole, sound snapshot of the same bundle with it."""
    registry.publish_dir(glm_bundles[0].path)
    part = pull(GLM, layers="0-3")
    whole = pull(GLM)
    assert part.digest == whole.digest and part.path != whole.path
    sha = json.loads((part.path / ".partial.json").read_text())["rotations.safetensors"]
    flip_a_byte(Cache().blob(sha))
    result = CliRunner().invoke(cli, ["verify", GLM, "--json"])
    assert result.exit_code == 1, result.output
    assert [p["file"] for p in json.loads(result.stdout)["problems"]] == ["rotations.safetensors"]
    assert not part.path.exists() and not Cache().has_blob(sha)
    assert whole.path.exists() and verify_cache(Cache()) == (3, [])
    assert pull(GLM, layers="0-3").path == whole.path     # layers 0-3 come from it now


# --- verify hashes beside pulls, and repairs only what is still wrong --------------------------

def _guard_calls(monkeypatch, before_exclusive=None) -> list[bool]:
    """Record each gc_guard taken (True: exclusive), running `before_exclusive` as an exclusive
    one is asked for: what another process might do between verify's hashing and its repair."""
    calls: list[bool] = []
    real = Cache.gc_guard

    @contextlib.contextmanager
    def guard(self, exclusive=False):
        calls.append(exclusive)
        if exclusive and before_exclusive is not None:
            before_exclusive()
        with real(self, exclusive):
            yield

    monkeypatch.setattr(Cache, "gc_guard", guard)
    return calls


def test_pulls_and_exports_go_on_while_verify_hashes(hf_only, monkeypatch):
    """verify held gc.lock exclusively while it hashed the whole cache, so every pull and
    export on the machine waited (and timed out) behind a long verify. It hashes under the
    shared lock now: a pull takes it beside verify; prune and cache rm still wait."""
    first = pull(GLM, fmt="sglang")
    monkeypatch.setenv("OSCAR_ZOO_LOCK_TIMEOUT", "0.5")
    hashing, release = threading.Event(), threading.Event()
    real_sha256 = cache_mod.sha256_file

    def a_slow_hash(path):      # a blob of many GB, as far as the lock is concerned
        hashing.set()
        release.wait(20)
        return real_sha256(path)

    monkeypatch.setattr(cache_mod, "sha256_file", a_slow_hash)
    seen = {}
    verifier = threading.Thread(target=lambda: seen.update(r=verify_cache(Cache())))
    verifier.start()
    try:
        assert hashing.wait(20)
        with Cache().gc_guard():        # what a pull or an export takes, within 0.5 s
            pass
        again = pull(GLM, fmt="sglang")
        assert again.cached and again.export.files == first.export.files
        with pytest.raises(LockTimeout):
            cache_mod.prune(Cache())    # deletes: it must not take a file from under the hash
        assert verifier.is_alive()
    finally:
        release.set()
        verifier.join(30)
    assert seen["r"] == (5, [])


@pytest.mark.parametrize("fix", ["in place", "replaced"])
def test_a_blob_fixed_between_the_hash_and_the_repair_is_not_deleted(hf_only, monkeypatch, fix):
    """Between verify's hashing (shared lock) and its repair (exclusive), a pull may have put
    a sound copy of a corrupt blob in place: the repair checks again, and spares it. Replaced
    by a new file, the blob is sound but the snapshot still links the corrupt one: it goes."""
    first = pull(GLM)
    cache = Cache()
    sha = cache.read_meta(GLM, first.digest)["files"]["rotations.safetensors"]
    blob = cache.blob(sha)
    sound = blob.read_bytes()
    flip_a_byte(blob)

    def put_right():
        if fix == "in place":
            flip_a_byte(blob)
        else:
            fresh = cache.root / "tmp" / "fresh"
            fresh.parent.mkdir(exist_ok=True)
            fresh.write_bytes(sound)
            cache.adopt(fresh, sha)

    calls = _guard_calls(monkeypatch, put_right)
    checked, problems = verify_cache(cache)
    assert calls == [False, True]           # hashed under the shared lock, repaired under the other
    assert blob.read_bytes() == sound
    if fix == "in place":
        assert (checked, problems) == (3, []) and first.path.exists()
    else:
        assert checked == 3 and [(p.file, p.problem) for p in problems] == [
            ("rotations.safetensors", "the snapshot's copy was modified")]
        assert not first.path.exists()
        assert pull(GLM).path == first.path         # linked again, to the sound blob
    assert verify_cache(cache) == (3, [])


def test_a_pull_that_writes_its_meta_while_verify_waits_keeps_its_snapshot(hf_only, monkeypatch):
    """A snapshot published before its meta reads as "not recorded" to the hashing, which no
    longer waits for pulls: the repair waits for the pull instead, checks again, and finds
    nothing wrong, rather than deleting the snapshot the pull is about to return."""
    monkeypatch.setenv("OSCAR_ZOO_LOCK_TIMEOUT", "20")
    linked, release = _meta_paused(monkeypatch)
    _guard_calls(monkeypatch, release.set)      # let the pull finish once verify wants to repair
    seen = {}
    puller = threading.Thread(target=lambda: seen.update(r=pull(GLM, fmt="sglang")))
    puller.start()
    try:
        assert linked.wait(60)
        verified = verify_cache(Cache())
    finally:
        release.set()
        puller.join(60)
    assert verified == (3, [])      # the snapshot, hashed before its export was built
    assert seen["r"].path.exists() and seen["r"].export.files["k"].exists()
    assert verify_cache(Cache()) == (5, [])


def test_a_snapshot_linked_to_a_corrupt_blob_during_the_hashing_goes_with_it(hf_only, monkeypatch):
    """A pull beside verify's hashing takes a blob in the store for good by its size, corrupt or
    not, and links it into a snapshot the hashing never listed: the repair deletes that
    snapshot with the blob, as it does every other that uses it, rather than leave it there
    holding the corrupt file with no blob behind it."""
    first = pull(GLM)
    cache = Cache()
    meta = cache.read_meta(GLM, first.digest)
    blob = cache.blob(meta["files"]["rotations.safetensors"])
    flip_a_byte(blob)
    monkeypatch.setenv("OSCAR_ZOO_LOCK_TIMEOUT", "0.5")
    hashing, release = threading.Event(), threading.Event()
    real_sha256 = cache_mod.sha256_file

    def a_slow_hash(path):
        hashing.set()
        release.wait(20)
        return real_sha256(path)

    monkeypatch.setattr(cache_mod, "sha256_file", a_slow_hash)
    seen = {}
    verifier = threading.Thread(target=lambda: seen.update(r=verify_cache(cache)))
    verifier.start()
    try:
        assert hashing.wait(20)
        with cache.gc_guard():      # what a pull of another model with the same files does
            late = cache.link_snapshot("org/glm-copy", first.digest, meta["files"])
            cache.write_meta("org/glm-copy", first.digest, meta)
            cache.write_ref("org/glm-copy", "latest", first.digest)
    finally:
        release.set()
        verifier.join(30)
    checked, problems = seen["r"]
    assert [(p.model, p.file) for p in problems] == [(GLM, "rotations.safetensors"),
                                                     ("org--glm-copy", "rotations.safetensors")]
    assert checked == 3 + 1         # the late snapshot: the one file that links the blob
    assert not blob.exists() and not first.path.exists() and not late.exists()
    assert verify_cache(cache) == (0, [])


# --- verify's repair drops the refs of a bundle it removes -------------------------------------

def test_verify_drops_the_refs_of_a_snapshot_it_deletes(hf_only, monkeypatch):
    """After verify deleted a corrupt snapshot, `cache ls` showed the model gone but an offline
    pull said "glm-4.7-fp8 is not in the cache ...; cached refs of glm-4.7-fp8: latest,
    rotationzoo": the refs still named the snapshot verify had removed."""
    from oscar_zoo.zoo.errors import OfflineError

    r = pull(f"{GLM}@latest")
    cache = Cache()
    assert set(cache.refs(GLM)) == {"latest", "rotationzoo"}
    flip_a_byte(cache.blob(cache.read_meta(GLM, r.digest)["files"]["rotations.safetensors"]))
    result = CliRunner().invoke(cli, ["verify", GLM])
    assert result.exit_code == 1, result.output
    assert not r.path.exists() and cache.refs(GLM) == {}
    assert not list((cache.model_dir(GLM) / "refs").iterdir())   # no temp file left either
    listed = CliRunner().invoke(cli, ["cache", "ls", "--json"])
    assert listed.exit_code == 0 and GLM not in listed.stdout, listed.output
    monkeypatch.setenv("OSCAR_ZOO_OFFLINE", "1")
    with pytest.raises(OfflineError, match=f"{GLM} is not cached at all") as e:
        pull(GLM)
    assert "cached refs" not in str(e.value)
    monkeypatch.delenv("OSCAR_ZOO_OFFLINE")
    again = pull(f"{GLM}@latest")             # online: converted again (the .pt files stayed)
    assert again.digest == r.digest and again.path.exists()
    assert verify_cache(cache, GLM)[1] == []
    assert cache.refs(GLM) == {"latest": r.digest, "rotationzoo": r.digest}


def test_verify_drops_the_refs_with_one_fsync_before_the_snapshot_goes(hf_only, monkeypatch):
    """As cache rm drops them (cache.drop_refs): both refs of the bundle, then one fsync of their
    dir, then the snapshot renamed aside; a crash between leaves a snapshot no ref names."""
    r = pull(f"{GLM}@latest")
    cache = Cache()
    flip_a_byte(cache.blob(cache.read_meta(GLM, r.digest)["files"]["rotations.safetensors"]))
    steps = []
    real_fsync, real_delete = cache_mod.fsync_dir, cache_mod._delete

    def fsync_dir(path):
        steps.append(("fsync", Path(path), sorted(cache.refs(GLM))))
        real_fsync(path)

    def delete(cache_, path):
        steps.append(("delete", path, sorted(cache.refs(GLM))))
        return real_delete(cache_, path)

    monkeypatch.setattr(cache_mod, "fsync_dir", fsync_dir)
    monkeypatch.setattr(cache_mod, "_delete", delete)
    assert verify_cache(cache, GLM)[1]
    assert steps == [("fsync", cache.model_dir(GLM) / "refs", []), ("delete", r.path, [])]


def test_verify_keeps_the_refs_of_bundles_it_leaves(registry, glm_bundles, monkeypatch):
    """Only the refs of the bundle that went: another version's stay, and so do the refs of a
    bundle whose corrupt --layers part went while its whole snapshot stays."""
    from oscar_zoo.zoo.errors import OfflineError

    for b in glm_bundles:
        registry.publish_dir(b.path)
    v1, v2 = pull(f"{GLM}@1"), pull(f"{GLM}@2")
    cache = Cache()
    before = cache.refs(GLM)
    assert before["v1"] == v1.digest and before["latest"] == before["v2"] == v2.digest
    flip_a_byte(cache.blob(cache.read_meta(GLM, v1.digest)["files"]["rotations.safetensors"]))
    checked, problems = verify_cache(cache, GLM)
    assert [(p.digest, p.file) for p in problems] == [(v1.digest, "rotations.safetensors")]
    assert cache.refs(GLM) == {r: d for r, d in before.items() if d != v1.digest}
    assert v2.path.exists() and not v1.path.exists()
    monkeypatch.setenv("OSCAR_ZOO_OFFLINE", "1")
    with pytest.raises(OfflineError, match=f"cached refs of {GLM}: latest, v2\\."):
        pull(f"{GLM}@1")
    assert pull(GLM).digest == v2.digest


def test_verify_keeps_the_refs_of_a_bundle_whose_part_stays(registry, glm_bundles, monkeypatch):
    """A corrupt whole snapshot goes; a --layers part of the same bundle (its own rotation
    file) stays, and so do the refs that name the bundle: the part still serves its layers."""
    registry.publish_dir(glm_bundles[0].path)
    part = pull(GLM, layers="0-3")
    whole = pull(GLM)
    cache = Cache()
    before = cache.refs(GLM)
    flip_a_byte(cache.blob(cache.read_meta(GLM, whole.digest)["files"]["rotations.safetensors"]))
    checked, problems = verify_cache(cache, GLM)
    assert problems and not whole.path.exists() and part.path.exists()
    assert cache.refs(GLM) == before
    monkeypatch.setenv("OSCAR_ZOO_OFFLINE", "1")     # the refs still lead to the part
    assert pull(GLM, layers="1-2").path == part.path
