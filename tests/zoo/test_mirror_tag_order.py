"""A mirror run that stops between its commit (files and the index listing the version) and its
tag: pulls skip the untagged version, saying why, instead of failing on it; the re-run makes the
tag and says it did something. (Committing the index after the tag instead was tried and
dropped: main's folder and its index then disagree between the two commits, which a yank in
between cannot mend.) And a mirror, which keeps no aliases, refuses `@recommended`. Real
huggingface_hub and modelscope-hub clients against the loopback emulator."""

from __future__ import annotations

import json

import pytest

from oscar_zoo.zoo.cache import Cache
from oscar_zoo.zoo.errors import VersionNotFound
from oscar_zoo.zoo.mirror.runner import mirror_bundle
from oscar_zoo.zoo.pull import pull
from tests.zoo.test_mirror import (HF, MS, REPO, bundles,  # noqa: F401 (fixture)
                                   same_calibration_as)

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


@pytest.mark.parametrize("target,kind,setting", TARGETS)
def test_a_tag_that_fails_leaves_pulls_on_the_previous_version_and_a_rerun_finishes_it(
        hub_w, bundles, second, target, kind, setting, monkeypatch):
    """The tag call failed after the commit that listed v2 in the index: a plain pull from the
    mirror then failed on "no such revision", and the re-run that made the tag said "already
    there, nothing uploaded"."""
    assert mirror_bundle(bundles[0].path, 1, target).status == "done"
    repo = hub_w.repo(kind, REPO)
    hub_w.fail("POST", TAG_POST, status=500)
    failed = mirror_bundle(second.path, 2, target)
    assert failed.status == "failed" and "500" in failed.error, failed.error
    assert indexed(repo) == ["1", "2"] and V2 not in repo.tags
    from_mirror(monkeypatch, kind, setting)
    got = pull(MODEL)
    assert (got.version, got.digest) == (1, bundles[0].digest)
    assert any("v2 is listed but not tagged" in n.text for n in got.notes), got.notes
    hub_w.faults.clear()
    n = len(repo.commits)
    done = mirror_bundle(second.path, 2, target)
    assert (done.status, done.error, done.committed) == ("done", None, True)
    assert "tagged only" in done.note and len(repo.commits) == n
    got = pull(MODEL)
    assert (got.version, got.digest) == (2, second.digest)
    again = mirror_bundle(second.path, 2, target)
    assert (again.status, again.committed, len(repo.commits)) == ("done", False, n)


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
