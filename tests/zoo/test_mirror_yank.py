"""A yank takes its version off the main branch of a mirror, in the commit that records it:
engine scripts fetch `<Model>/<tag>/` from main and never read oscar-zoo.json. The folder gets
the newest version not yanked back from that version's tag, or is emptied; tags are untouched.
Real huggingface_hub and modelscope-hub clients against the loopback emulator."""

from __future__ import annotations

import json

import pytest

from oscar_zoo.zoo.errors import VersionNotFound
from oscar_zoo.zoo.mirror import layout
from oscar_zoo.zoo.mirror.runner import mark_yanked, mirror_bundle
from oscar_zoo.zoo.pull import pull
from tests.zoo.test_mirror import (FOLDER, HF, MS, PT_FILES, REPO, TAG,  # noqa: F401 (fixture)
                                   bundles, same_calibration_as)

MODEL = "smollm2-135m"
V2 = "smollm2-135m-v2"
TARGETS = [pytest.param(HF, "hf", id="hf"), pytest.param(MS, "ms", id="modelscope")]


@pytest.fixture
def hub_w(hub):
    hub.tokens = {"hf_test", "ms_test"}  # writes need the tokens the clients send
    return hub


@pytest.fixture
def second(bundles, tmp_path):
    """v2 of the model, in v1's folder (same calibration tag): main's folder then holds it."""
    return same_calibration_as(bundles[0], tmp_path / "again", seed=7)


def folder_on(repo, rev: str | None = None, folder: str = FOLDER) -> dict[str, bytes]:
    """name -> bytes of the files directly in `folder` at `rev` (default: the main branch)."""
    return {p.rsplit("/", 1)[1]: data for p, (data, _lfs) in repo.files(rev).items()
            if p.rpartition("/")[0] == folder}


def mirrored(target: str, *versions) -> None:
    for number, bundle in versions:
        assert mirror_bundle(bundle.path, number, target).status == "done"


def hub_slot(repo) -> dict:
    return json.loads(repo.files()["oscar-zoo.json"][0])["models"][MODEL]


@pytest.mark.parametrize("target,kind", TARGETS)
def test_yanking_the_version_main_holds_puts_the_older_one_back(hub_w, bundles, second, target,
                                                               kind):
    mirrored(target, (1, bundles[0]), (2, second))
    repo = hub_w.repo(kind, REPO)
    tags, n = dict(repo.tags), len(repo.commits)
    at_v2 = folder_on(repo, V2)
    result = mark_yanked(target, MODEL, 2, "clip search bug")
    assert (result.status, result.error, result.committed) == ("done", None, True)
    assert len(repo.commits) == n + 1   # the folder, index and README in one commit
    assert folder_on(repo) == folder_on(repo, TAG)    # v1's exact bytes, every file
    assert layout.RepoFile.of("", folder_on(repo)["bundle.json"]).sha256 == bundles[0].digest
    assert repo.tags == tags and folder_on(repo, V2) == at_v2   # v2 stays at its tag
    slot = hub_slot(repo)
    assert slot["versions"]["2"]["yanked"] and slot["latest"] == 1
    readme = repo.files()["README.md"][0].decode()
    assert f"| smollm2-135m | 2 (yanked) | `{FOLDER}` |" in readme   # v1 holds it again
    again = mark_yanked(target, MODEL, 2, "clip search bug")
    assert (again.status, again.committed, len(repo.commits)) == ("done", False, n + 1)


@pytest.mark.parametrize("target,kind", TARGETS)
def test_yanking_the_only_version_empties_its_folder_on_main(hub_w, bundles, target, kind):
    mirrored(target, (1, bundles[0]))
    repo = hub_w.repo(kind, REPO)
    n, at_tag = len(repo.commits), folder_on(repo, TAG)
    assert mark_yanked(target, MODEL, 1, "bad rotations").committed
    assert not [p for p in repo.files() if p.startswith("SmolLM2-135M-Instruct/")]
    assert folder_on(repo, TAG) == at_tag and set(repo.tags) == {TAG}
    assert len(repo.commits) == n + 1   # index, README and deletions together, on both hubs
    assert hub_slot(repo)["latest"] is None
    readme = repo.files()["README.md"][0].decode()
    assert f"| smollm2-135m | 1 (yanked) | `{FOLDER}` (removed from main" in readme
    n = len(repo.commits)
    assert not mark_yanked(target, MODEL, 1, "bad rotations").committed
    assert len(repo.commits) == n


@pytest.mark.parametrize("target,kind", TARGETS)
def test_yanking_an_older_version_leaves_the_folder_alone(hub_w, bundles, second, target, kind):
    """v2 holds the folder, v1 (mirrored after it) its own v1/ subfolder: yanking v1 changes
    the index and README, and takes v1/ off main, but not the folder v2 is served from."""
    mirrored(target, (2, second), (1, bundles[0]))
    repo = hub_w.repo(kind, REPO)
    before = folder_on(repo)
    assert f"{FOLDER}/v1/bundle.json" in repo.files()
    assert mark_yanked(target, MODEL, 1, "superseded").committed
    assert folder_on(repo) == before
    assert not folder_on(repo, folder=f"{FOLDER}/v1")
    assert folder_on(repo, TAG, f"{FOLDER}/v1")   # still at its tag
    assert hub_slot(repo)["latest"] == 2


@pytest.mark.parametrize("target,kind", TARGETS)
def test_yanking_an_older_version_outside_the_folder_changes_only_the_index(hub_w, bundles,
                                                                            second, target,
                                                                            kind):
    mirrored(target, (1, bundles[0]), (2, second))
    repo = hub_w.repo(kind, REPO)
    before = dict(repo.files())
    assert mark_yanked(target, MODEL, 1, "superseded").committed
    after = repo.files()
    assert {p for p in set(before) | set(after) if before.get(p) != after.get(p)} == {
        "oscar-zoo.json", "README.md"}


@pytest.mark.parametrize("target,kind", TARGETS)
def test_another_calibrations_version_is_never_put_in_the_yanked_ones_folder(hub_w, bundles,
                                                                            target, kind):
    """v1 (seq1000) and v2 (seq1001) live in folders of their own: yanking v2 empties its
    folder rather than fill it with v1, whose calibration its name would misstate."""
    mirrored(target, (1, bundles[0]), (2, bundles[1]))
    repo = hub_w.repo(kind, REPO)
    v2_folder = FOLDER.replace("seq1000", "seq1001")
    assert folder_on(repo, folder=v2_folder)
    before = folder_on(repo)
    assert mark_yanked(target, MODEL, 2, "broken").committed
    assert not folder_on(repo, folder=v2_folder) and folder_on(repo) == before
    assert f"`{v2_folder}` (removed from main" in repo.files()["README.md"][0].decode()
    assert hub_slot(repo)["latest"] == 1


def test_a_per_head_version_yanked_leaves_no_per_head_files_beside_the_restored_ones(
        hub_w, bundles, tmp_path):
    """Engine scripts pick k_rotation_*.pt by name: the restored per-layer v1 must not sit
    beside the yanked per-head v2's pair."""
    from oscar_zoo.zoo.bundle import Bundle, write
    from tests.utils.bundles import make_manifest, make_tensors

    manifest = make_manifest(per_head=True, seed=0)
    per_head = write(Bundle(manifest, *make_tensors(manifest, 0)), tmp_path / "ph")
    for target, kind in ((HF, "hf"), (MS, "ms")):
        mirrored(target, (1, bundles[0]), (2, per_head))
        repo = hub_w.repo(kind, REPO)
        n = len(repo.commits)
        assert mark_yanked(target, MODEL, 2, "per-head collapse").committed
        assert folder_on(repo) == folder_on(repo, TAG)
        assert sorted(n for n in folder_on(repo) if n.endswith(".pt")) == sorted(PT_FILES)
        assert len(repo.commits) == n + 1   # no moment with both pairs, or neither
        assert not mark_yanked(target, MODEL, 2, "per-head collapse").committed


@pytest.mark.parametrize("target,kind", TARGETS)
def test_a_yank_recorded_without_fixing_main_is_finished_by_a_rerun(hub_w, bundles, second,
                                                                    target, kind):
    """An index that already says yanked (an older oscar-zoo, which on ModelScope deleted in a
    second commit, and was cut short before it) with main still serving the yanked files."""
    mirrored(target, (1, bundles[0]), (2, second))
    repo = hub_w.repo(kind, REPO)
    index = layout.load_index(repo.files()["oscar-zoo.json"][0])
    layout.mark_yanked(index, MODEL, 2, "broken")
    hub_w.seed(kind, REPO, {"oscar-zoo.json": layout.dump_index(index),
                            "README.md": layout.render_root_readme(index, REPO)})
    n = len(repo.commits)
    assert mark_yanked(target, MODEL, 2, "broken").committed
    assert folder_on(repo) == folder_on(repo, TAG) and len(repo.commits) == n + 1
    assert not mark_yanked(target, MODEL, 2, "broken").committed


@pytest.mark.parametrize("target,kind", TARGETS)
def test_an_older_version_mirrored_after_a_yank_emptied_the_folder_takes_it(hub_w, bundles,
                                                                            second, target,
                                                                            kind):
    mirrored(target, (2, second))
    mark_yanked(target, MODEL, 2, "broken")
    result = mirror_bundle(bundles[0].path, 1, target)
    assert (result.status, result.path) == ("done", FOLDER)
    repo = hub_w.repo(kind, REPO)
    assert folder_on(repo) == folder_on(repo, TAG)
    assert "(removed from main" not in repo.files()["README.md"][0].decode()


def test_a_tag_that_lost_the_files_to_restore_fails_the_yank_and_changes_nothing(hub_w, bundles,
                                                                                 second):
    mirrored(HF, (1, bundles[0]), (2, second))
    repo = hub_w.repo("hf", REPO)
    del repo.tags[TAG]
    n = len(repo.commits)
    result = mark_yanked(HF, MODEL, 2, "broken")
    assert result.status == "failed" and f"its tag {TAG} lacks" in result.error
    assert "oscar-zoo mirror" in result.error and len(repo.commits) == n


@pytest.mark.parametrize("target,kind,setting", [
    pytest.param(HF, "hf", "OSCAR_ZOO_HF_MIRROR_REPO", id="hf"),
    pytest.param(MS, "modelscope", "OSCAR_ZOO_MODELSCOPE_MIRROR_REPO", id="modelscope")])
def test_pulling_a_model_whose_every_version_is_yanked_says_what_to_do(hub_w, bundles, target,
                                                                       kind, setting,
                                                                       monkeypatch):
    mirrored(target, (1, bundles[0]))
    mark_yanked(target, MODEL, 1, "bad rotations")
    monkeypatch.setenv(setting, REPO)
    monkeypatch.setenv("OSCAR_ZOO_SOURCES", kind)
    with pytest.raises(VersionNotFound) as e:
        pull(MODEL)
    message = str(e.value)
    assert "every mirrored version of smollm2-135m is yanked: v1 (bad rotations)" in message
    assert "smollm2-135m@1" in message
    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli

    out = CliRunner().invoke(cli, ["pull", MODEL])   # one line on stderr, no traceback
    assert out.exit_code == 1 and "v1 (bad rotations)" in out.stderr, out.output
    assert "Traceback" not in out.output
    assert pull(f"{MODEL}@1").digest == bundles[0].digest   # by number, from its tag


@pytest.mark.parametrize("target,kind", TARGETS)
def test_yanking_a_version_an_earlier_yank_put_back_restores_the_next_one(hub_w, bundles,
                                                                         tmp_path, target, kind):
    """v1, v3, then v2 (which goes to FOLDER/v2, v3 holding FOLDER). Yanking v3 puts v2 back
    in FOLDER; yanking v2 then used to clear only FOLDER/v2, leaving the yanked v2 served."""
    v2 = same_calibration_as(bundles[0], tmp_path / "v2", seed=7)
    v3 = same_calibration_as(bundles[0], tmp_path / "v3", seed=8)
    mirrored(target, (1, bundles[0]), (3, v3), (2, v2))
    repo = hub_w.repo(kind, REPO)
    held = lambda: layout.RepoFile.of("", folder_on(repo)["bundle.json"]).sha256  # noqa: E731
    assert held() == v3.digest
    assert mark_yanked(target, MODEL, 3, "bad").status == "done" and held() == v2.digest
    result = mark_yanked(target, MODEL, 2, "bad too")
    assert (result.status, result.error) == ("done", None)
    assert held() == bundles[0].digest and folder_on(repo) == folder_on(repo, TAG)


def test_a_yank_the_index_cannot_take_fails_instead_of_reporting_done(hub_w, bundles):
    """Another tool's key among the model's versions: the yank took nothing off main and
    said done, so the registry believed the mirror no longer served the version."""
    mirrored(HF, (1, bundles[0]))
    repo = hub_w.repo("hf", REPO)
    index = json.loads(repo.files()["oscar-zoo.json"][0])
    index["models"][MODEL]["versions"]["next"] = {"note": "v2 in review (another tool)"}
    hub_w.seed("hf", REPO, {"oscar-zoo.json": json.dumps(index).encode()})
    n = len(repo.commits)
    result = mark_yanked(HF, MODEL, 1, "broken rotations")
    assert result.status == "failed" and "mirror a version" in result.error
    assert len(repo.commits) == n and folder_on(repo)


@pytest.mark.parametrize("slot", ["managed by another tool", {"versions": {"1": {"digest": "ab"}}}])
def test_a_pull_from_a_mirror_passes_over_another_tools_entries(hub_w, bundles, monkeypatch,
                                                                slot):
    mirrored(HF, (1, bundles[0]))
    repo = hub_w.repo("hf", REPO)
    index = json.loads(repo.files()["oscar-zoo.json"][0])
    index["models"]["aaa-other"] = slot     # sorted before ours: a raw AttributeError before
    hub_w.seed("hf", REPO, {"oscar-zoo.json": layout.dump_index(index)})
    monkeypatch.setenv("OSCAR_ZOO_HF_MIRROR_REPO", REPO)
    monkeypatch.setenv("OSCAR_ZOO_SOURCES", "hf")
    assert pull(MODEL).digest == bundles[0].digest
