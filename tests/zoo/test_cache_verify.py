"""`oscar-zoo verify` beside pulls: it deletes what it finds wrong, so it waits for pulls as
prune and cache rm do, removes a snapshot in one step, and removes only what is wrong."""

from __future__ import annotations

import json
import os
import threading

import pytest
from click.testing import CliRunner

from oscar_zoo.zoo import cache as cache_mod
from oscar_zoo.zoo.cache import Cache, verify_cache
from oscar_zoo.zoo.cli.main import cli
from oscar_zoo.zoo.errors import LockTimeout
from oscar_zoo.zoo.pull import pull

GLM = "glm-4.7-fp8"


@pytest.fixture
def hf_only(seed_zoo, monkeypatch):
    seed_zoo(("hf",))
    monkeypatch.setenv("OSCAR_ZOO_SOURCES", "hf")


def _flip_a_byte(path) -> None:
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 1]))


def test_verify_waits_for_a_pull_that_has_not_written_its_meta_yet(hf_only, monkeypatch):
    """A pull publishes its snapshot, then its meta and refs. verify running in between found
    the snapshot's files "not recorded in the cache's metadata", reported them CORRUPT and
    deleted the snapshot the pull was about to return and export."""
    monkeypatch.setenv("OSCAR_ZOO_LOCK_TIMEOUT", "0.5")
    linked, release = threading.Event(), threading.Event()
    real_write_meta = Cache.write_meta

    def write_meta_after_a_pause(self, *args):
        linked.set()
        release.wait(20)
        return real_write_meta(self, *args)

    monkeypatch.setattr(Cache, "write_meta", write_meta_after_a_pause)
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
    _flip_a_byte(Cache().blob(meta["files"]["rotations.safetensors"]))
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
    _flip_a_byte(Cache().blob(sha))
    result = CliRunner().invoke(cli, ["verify", GLM, "--json"])
    assert result.exit_code == 1, result.output
    assert [p["file"] for p in json.loads(result.stdout)["problems"]] == ["rotations.safetensors"]
    assert not part.path.exists() and not Cache().has_blob(sha)
    assert whole.path.exists() and verify_cache(Cache()) == (3, [])
    assert pull(GLM, layers="0-3").path == whole.path     # layers 0-3 come from it now
