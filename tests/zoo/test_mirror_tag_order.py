"""A mirror never advertises a version before its tag exists: the files go up in one commit,
the tag is made on it, and only then does a second commit add the version to the index that
pulls go by. A run stopped at any step leaves pulls getting the previous version, and a re-run
finishes it and says it did something. Pulls tolerate mirrors that older runs left indexing a
version with no tag; and a mirror, which keeps no aliases, refuses `@recommended`. Real
huggingface_hub and modelscope-hub clients against the loopback emulator."""

from __future__ import annotations

import json

import pytest

from oscar_zoo.zoo.cache import Cache
from oscar_zoo.zoo.errors import RemoteError, VersionNotFound
from oscar_zoo.zoo.mirror.runner import mirror_bundle
from oscar_zoo.zoo.pull import pull
from tests.zoo.test_mirror import (FOLDER, HF, MS, REPO, TAG, bundles,  # noqa: F401 (fixture)
                                   same_calibration_as)
from tests.zoo.test_mirror_atomic import STARTER
from tests.zoo.test_mirror_yank import folder_on

MODEL = "smollm2-135m"
V2 = "smollm2-135m-v2"
TAG_POST = r"/tag(/|$)"   # the Hub's /api/models/R/tag/REV, ModelScope's /models/R/repo/tag
TARGETS = [pytest.param(HF, "hf", "OSCAR_ZOO_HF_MIRROR_REPO", id="hf"),
           pytest.param(MS, "ms", "OSCAR_ZOO_MODELSCOPE_MIRROR_REPO", id="modelscope")]


@pytest.fixture
def hub_w(hub):
    hub.tokens = {"hf_test", "ms_test"}
    return hub


@pytest.fixture
def second(bundles, tmp_path):
    """v2 of the model, in v1's folder (same calibration tag)."""
    return same_calibration_as(bundles[0], tmp_path / "v2", seed=7)


def indexed(repo) -> list[str]:
    index = json.loads(repo.files()["oscar-zoo.json"][0])
    return sorted(index["models"].get(MODEL, {}).get("versions", {}))


def from_mirror(monkeypatch, kind: str, setting: str) -> None:
    monkeypatch.setenv(setting, REPO)
    monkeypatch.setenv("OSCAR_ZOO_SOURCES", "hf" if kind == "hf" else "modelscope")


def index_commit_fails(monkeypatch, target: str) -> None:
    """The hub goes away after the tag: the index commit (the second) never lands."""
    from oscar_zoo.zoo.mirror.runner import open_target, parse_target

    cls = type(open_target(*parse_target(target)))
    real = cls.commit

    def commit(self, files, message, parent, delete=()):
        if message.endswith(": index"):
            raise RemoteError("injected: the hub went away")
        return real(self, files, message, parent, delete)

    monkeypatch.setattr(cls, "commit", commit)


@pytest.mark.parametrize("target,kind,setting", TARGETS)
def test_a_tag_that_fails_leaves_the_version_out_of_the_index_and_a_rerun_finishes_it(
        hub_w, bundles, second, target, kind, setting, monkeypatch):
    """The tag call failed after the commit that listed v2 in the index: a plain pull from the
    mirror then failed on "no such revision", and the re-run that made the tag said "already
    there, nothing uploaded"."""
    assert mirror_bundle(bundles[0].path, 1, target).status == "done"
    repo = hub_w.repo(kind, REPO)
    hub_w.fail("POST", TAG_POST, status=500)
    failed = mirror_bundle(second.path, 2, target)
    assert failed.status == "failed" and "500" in failed.error, failed.error
    assert indexed(repo) == ["1"] and V2 not in repo.tags
    # main's folder holds v2's files already: engine scripts never read the index
    assert folder_on(repo)["bundle.json"] == (second.path / "bundle.json").read_bytes()
    from_mirror(monkeypatch, kind, setting)
    got = pull(MODEL)
    assert (got.version, got.digest) == (1, bundles[0].digest)
    hub_w.faults.clear()
    n = len(repo.commits)
    done = mirror_bundle(second.path, 2, target)
    assert (done.status, done.error, done.committed) == ("done", None, True)
    assert len(repo.commits) == n + 1   # the index; the files were there already
    assert repo.tags[V2] == repo.commits[repo.branches[repo.default_branch]].parent
    assert indexed(repo) == ["1", "2"] and done.revision == repo.tags[V2]
    got = pull(MODEL)
    assert (got.version, got.digest) == (2, second.digest)
    again = mirror_bundle(second.path, 2, target)
    assert (again.status, again.committed, len(repo.commits)) == ("done", False, n + 1)


@pytest.mark.parametrize("target,kind,setting", TARGETS)
def test_a_first_run_into_a_new_repo_stopped_at_its_tag_is_finished_by_a_rerun(
        hub_w, bundles, target, kind, setting, monkeypatch):
    """The first commit into a repo the run created holds the version's files: it also writes
    an index listing nothing, so the re-run (which did not create the repo) does not take the
    repo for someone else's."""
    hub_w.starter_files["ms"] = dict(STARTER)
    hub_w.fail("POST", TAG_POST, status=500)
    assert mirror_bundle(bundles[0].path, 1, target).status == "failed"
    repo = hub_w.repo(kind, REPO)
    assert indexed(repo) == [] and not repo.tags
    assert b"oscar-zoo" in repo.files()["README.md"][0]   # the hub's starter README replaced
    hub_w.faults.clear()
    done = mirror_bundle(bundles[0].path, 1, target)
    assert (done.status, done.error, done.committed) == ("done", None, True)
    assert indexed(repo) == ["1"] and TAG in repo.tags
    from_mirror(monkeypatch, kind, setting)
    assert pull(MODEL).digest == bundles[0].digest


@pytest.mark.parametrize("target,kind,setting", TARGETS)
def test_a_run_stopped_after_its_tag_is_indexed_by_a_rerun(hub_w, bundles, second, target,
                                                           kind, setting, monkeypatch):
    assert mirror_bundle(bundles[0].path, 1, target).status == "done"
    repo = hub_w.repo(kind, REPO)
    with monkeypatch.context() as m:
        index_commit_fails(m, target)
        assert mirror_bundle(second.path, 2, target).status == "failed"
    assert V2 in repo.tags and indexed(repo) == ["1"]
    from_mirror(monkeypatch, kind, setting)
    assert pull(MODEL).version == 1
    tags, n = dict(repo.tags), len(repo.commits)
    done = mirror_bundle(second.path, 2, target)
    assert (done.status, done.committed, done.note) == ("done", True, None)
    assert (repo.tags, len(repo.commits), indexed(repo)) == (tags, n + 1, ["1", "2"])
    assert pull(MODEL).version == 2


@pytest.mark.parametrize("target,kind,setting", TARGETS[:1])
def test_an_older_version_tagged_but_never_indexed_is_found_where_its_tag_put_it(
        hub_w, bundles, second, target, kind, setting, monkeypatch):
    """v1 stopped after its tag; v2 took the folder since. v1's re-run computes a v1/
    subfolder, but its tag holds it in the folder itself: that is where it is recorded, and
    main's folder keeps v2."""
    with monkeypatch.context() as m:
        index_commit_fails(m, target)
        assert mirror_bundle(bundles[0].path, 1, target).status == "failed"
    assert mirror_bundle(second.path, 2, target).status == "done"
    repo = hub_w.repo(kind, REPO)
    on_main = folder_on(repo)
    done = mirror_bundle(bundles[0].path, 1, target)
    assert (done.status, done.error, done.committed, done.path) == ("done", None, True, FOLDER)
    assert folder_on(repo) == on_main == folder_on(repo, V2)
    index = json.loads(repo.files()["oscar-zoo.json"][0])["models"][MODEL]["versions"]
    assert (index["1"]["path"], index["1"]["tag"]) == (FOLDER, TAG)


@pytest.mark.parametrize("target,kind,setting", TARGETS)
def test_a_mirror_an_older_run_left_indexing_an_untagged_version_is_pulled_with_a_note(
        hub_w, bundles, second, target, kind, setting, monkeypatch):
    """What older oscar-zoo runs left when the tag failed: the index lists v2, its tag is not
    there. A plain pull gets v1 and says why; v2 by number says how to fix it; the re-run
    makes the tag and says it did."""
    for number, b in ((1, bundles[0]), (2, second)):
        assert mirror_bundle(b.path, number, target).status == "done"
    repo = hub_w.repo(kind, REPO)
    del repo.tags[V2]
    from_mirror(monkeypatch, kind, setting)
    got = pull(MODEL)
    assert (got.version, got.digest) == (1, bundles[0].digest)
    said = " ".join(n.text for n in got.notes)
    assert "v2 is listed but not tagged" in said and "last run did not finish" in said
    assert f"oscar-zoo mirror {MODEL}@2" in said
    with pytest.raises(VersionNotFound) as e:
        pull(f"{MODEL}@2")
    assert "tag smollm2-135m-v2 does not exist" in str(e.value)
    assert "last run did not finish" in str(e.value)
    assert f"oscar-zoo mirror {MODEL}@2" in str(e.value)
    n = len(repo.commits)
    done = mirror_bundle(second.path, 2, target)
    assert (done.status, done.error, done.committed) == ("done", None, True)
    assert "tagged only" in done.note and len(repo.commits) == n
    assert repo.tags[V2] == repo.branches[repo.default_branch]
    got = pull(MODEL)
    assert (got.version, got.digest, [n.text for n in got.notes if "tagged" in n.text]) == (
        2, second.digest, [])


@pytest.mark.parametrize("target,kind,setting", TARGETS)
def test_recommended_is_refused_by_a_mirror_and_a_bare_pull_records_no_such_alias(
        hub_w, bundles, second, target, kind, setting, monkeypatch):
    """`@recommended` was answered with the mirror's latest, and cached as `recommended`,
    which offline bare pulls prefer over `latest`."""
    for number, b in ((1, bundles[0]), (2, second)):
        assert mirror_bundle(b.path, number, target).status == "done"
    from_mirror(monkeypatch, kind, setting)
    for alias in ("recommended", "stable"):
        with pytest.raises(VersionNotFound) as e:
            pull(f"{MODEL}@{alias}")
        said = str(e.value)
        assert "mirrors keep version numbers and `latest` only" in said, said
        assert f"not aliases such as '{alias}'" in said and "registry" in said
    got = pull(MODEL)
    assert got.version == 2
    assert pull(f"{MODEL}@latest").version == 2
    refs = Cache().refs(MODEL)
    assert "recommended" not in refs and "stable" not in refs
    assert {"latest", "v2"} <= set(refs)
