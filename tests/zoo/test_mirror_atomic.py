"""A mirror changes a hub's main branch in one commit or not at all, whatever fails on the way:
a blob that will not upload, an answer lost after the commit landed, a process killed between
creating a repo and its first commit. Real huggingface_hub and modelscope-hub clients against
the loopback emulator."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from oscar_zoo.registry_db.mirrors import mirror_version
from oscar_zoo.zoo.mirror.runner import mirror_bundle
from tests.utils.bundles import make_bundle
from tests.zoo.test_mirror import (FOLDER, HF, MS, REPO, TAG, bundles,  # noqa: F401 (fixtures)
                                   registry, same_calibration_as)
from tests.zoo.test_mirror_yank import folder_on

TARGETS = [pytest.param(HF, "hf", id="hf"), pytest.param(MS, "ms", id="modelscope")]
STARTER = {"README.md": b"# rotations\n", "configuration.json": b'{"framework": "other"}'}


@pytest.fixture
def hub_w(hub):
    hub.tokens = {"hf_test", "ms_test"}
    return hub


def versions_on_main(repo) -> list[str]:
    index = json.loads(repo.files()["oscar-zoo.json"][0])
    return sorted(index["models"]["smollm2-135m"]["versions"])


@pytest.mark.parametrize("target,kind", TARGETS)
def test_a_blob_that_will_not_upload_leaves_main_as_it_was(hub_w, bundles, tmp_path, target,
                                                           kind):
    """v2 into v1's folder, its rotations.safetensors refused by the storage: modelscope-hub's
    upload_folder committed the files that did upload, so main served v2's bundle.json and .pt
    files over v1's rotations, and its index listed v2."""
    assert mirror_bundle(bundles[0].path, 1, target).status == "done"
    second = same_calibration_as(bundles[0], tmp_path / "v2", seed=7)
    blob = second.manifest.file("rotations.safetensors").sha256
    repo = hub_w.repo(kind, REPO)
    n = len(repo.commits)
    hub_w.fail("PUT", rf"/_(ms)?lfs/{blob}", status=500)
    failed = mirror_bundle(second.path, 2, target)
    assert failed.status == "failed"
    assert len(repo.commits) == n and folder_on(repo) == folder_on(repo, TAG)
    assert versions_on_main(repo) == ["1"] and "smollm2-135m-v2" not in repo.tags
    hub_w.faults.clear()
    done = mirror_bundle(second.path, 2, target)
    assert (done.status, done.committed, len(repo.commits)) == ("done", True, n + 1)
    assert folder_on(repo) == folder_on(repo, "smollm2-135m-v2")


@pytest.mark.parametrize("target,kind", TARGETS)
def test_a_commit_whose_answer_was_lost_is_not_made_twice(hub_w, tmp_path, target, kind):
    """The commit lands but the gateway answers 504: modelscope-hub retried the same commit
    (ModelScope has no parent check), so the version landed in two commits. The retry must
    find it there and only tag it."""
    b = make_bundle(tmp_path / "b")
    hub_w.lose_response("POST", r"/commit/", status=504, times=1)
    result = mirror_bundle(b.path, 1, target)
    assert (result.status, result.error) == ("done", None)
    repo = hub_w.repo(kind, REPO)
    ours = [c for c in repo.commits.values() if c.message.startswith("oscar-zoo:")]
    assert len(ours) == 1 and repo.tags[TAG] == ours[0].oid
    assert len(hub_w.requests("POST", r"/commit/")) == 1


@pytest.mark.parametrize("target,kind", TARGETS)
def test_a_mirror_killed_between_creating_the_repo_and_its_first_commit_finishes_on_a_rerun(
        registry, hub, bundles, target, kind):
    """The hub starts the repo with its own files (ModelScope may add a model card and a
    configuration.json); the run that created it would replace them, but it was killed before
    its first commit. The rerun did not create the repo and refused it as someone else's."""
    hub.starter_files["ms"] = dict(STARTER)
    registry.publish_dir(bundles[0].path)
    create = r"^/api/(repos/create|v1/models)$"
    after_create = r"/repo/files|/paths-info/|/revision/main"
    hub.delay("*", after_create, seconds=60)  # the next request hangs, then the kill
    proc = subprocess.Popen([sys.executable, "-m", "oscar_zoo.zoo.cli.main", "mirror",
                             "smollm2-135m@1", "--to", target], env=os.environ.copy(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not (hub.requests("POST", create) and hub.requests(None, after_create)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    hub.faults.clear()
    repo = hub.repo(kind, REPO)
    assert len(repo.commits) == 1 and not repo.tags   # the hub's initial commit only
    result = mirror_version(registry.registry, "smollm2-135m", 1, [target])[0]
    assert (result.status, result.error, result.committed) == ("done", None, True)
    files = repo.files()
    assert b"smollm2-135m" in files["README.md"][0] and repo.tags[TAG] == repo.branches[
        repo.default_branch]
    assert folder_on(repo) == folder_on(repo, TAG) and folder_on(repo)
    again = mirror_version(registry.registry, "smollm2-135m", 1, [target])[0]
    assert (again.status, again.committed) == ("done", False)


def test_a_repo_oscar_zoo_created_that_holds_versions_but_lost_its_index_is_still_refused(
        hub_w, tmp_path):
    """What lets a rerun into a repo an earlier run created is that nothing was mirrored there
    yet (no tag): once a version was, a missing index is for a person to look at."""
    hub_w.starter_files["ms"] = dict(STARTER)
    assert mirror_bundle(make_bundle(tmp_path / "b").path, 1, MS).status == "done"
    repo = hub_w.repo("ms", REPO)
    files = {p: data for p, (data, _lfs) in repo.files().items() if p != "oscar-zoo.json"}
    repo.commit("master", {p: (d, False) for p, d in files.items()}, "index removed by hand")
    n = len(repo.commits)
    again = mirror_bundle(make_bundle(tmp_path / "b2", seed=1).path, 2, MS)
    assert again.status == "failed" and "is not an oscar-zoo mirror" in again.error
    assert len(repo.commits) == n


def test_a_blob_the_hubs_storage_refuses_says_what_it_answered(hub_w, tmp_path):
    """huggingface_hub reports a failed LFS upload as a bare RuntimeError ("Error while
    uploading ... to the Hub"): no status, nothing to act on, and never retried."""
    hub_w.fail("PUT", r"^/_lfs/", status=403)
    result = mirror_bundle(make_bundle(tmp_path / "b").path, 1, HF)
    assert result.status == "failed" and "403" in result.error, result.error
    assert "HF_TOKEN" in result.error and not result.error.startswith("RuntimeError")
    assert not hub_w.repo("hf", REPO).tags
