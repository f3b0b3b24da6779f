"""What a mirror run must not do to a hub repo: write into a repo that is not an oscar-zoo
mirror, write where the server's configuration did not allow (a job spec's targets), lose the
other entries of an index it could not read, or trip over another tool's index entries. Real
clients against the loopback emulator."""

from __future__ import annotations

import json

import pytest

from oscar_zoo.registry_db.mirrors import mirror_published, mirror_version
from tests.utils.bundles import make_bundle
from tests.zoo.test_mirror import HF, MS, REPO, TAG, registry  # noqa: F401 (fixture)

CARD = b"---\nlicense: mit\n---\n# Our real model\nUsage, benchmarks, citations...\n"


def hub_index(hub, kind: str = "hf") -> dict:
    return json.loads(hub.repo(kind, REPO).files()["oscar-zoo.json"][0])


def test_a_repo_with_files_but_no_index_is_refused_and_left_untouched(registry, hub, tmp_path):
    for kind in ("hf", "ms"):
        hub.seed(kind, REPO, {"README.md": CARD, "model.safetensors": b"\0" * 1024})
    before = {kind: len(hub.repo(kind, REPO).commits) for kind in ("hf", "ms")}
    registry.publish_dir(make_bundle(tmp_path / "b").path)
    results = mirror_version(registry.registry, "smollm2-135m", 1, [HF, MS])
    for r in results:
        assert r.status == "failed" and "is not an oscar-zoo mirror" in r.error
        assert "README.md" in r.error and "--to" in r.error
    for kind in ("hf", "ms"):
        repo = hub.repo(kind, REPO)
        assert repo.files()["README.md"][0] == CARD
        assert len(repo.commits) == before[kind] and not repo.tags
    with registry.client() as http:
        items = http.get("/v1/models/smollm2-135m/versions/1/mirrors").json()["items"]
    assert {i["status"] for i in items} == {"failed"}


def test_a_repo_holding_only_the_hubs_seed_is_mirrored_into(registry, hub, tmp_path):
    hub.seed("hf", REPO, {})  # a new repo: .gitattributes only
    registry.publish_dir(make_bundle(tmp_path / "b").path)
    assert mirror_version(registry.registry, "smollm2-135m", 1, [HF])[0].status == "done"


def test_a_repo_the_run_created_is_mirrored_into_whatever_the_hub_put_there(registry, hub,
                                                                           tmp_path):
    """A hub may start a repo it creates with a model card and a config (ModelScope's web UI
    does); those are not someone else's work, so the run that created the repo goes on, its
    README.md replacing the hub's. The same files in a repo that already existed are refused."""
    starter_card, config = b"# rotations\n", b'{"framework": "other"}'
    hub.starter_files["ms"] = {"README.md": starter_card, "configuration.json": config}
    # a hiccup right after the create: the retried push must still know the run made the repo
    hub.fail("GET", r"/repo/files", status=503, times=1, hub="ms")
    registry.publish_dir(make_bundle(tmp_path / "b").path)
    result = mirror_version(registry.registry, "smollm2-135m", 1, [MS])[0]
    assert result.status == "done", result.error
    files = hub.repo("ms", REPO).files()
    assert files["configuration.json"][0] == config
    assert files["README.md"][0] != starter_card and b"smollm2-135m" in files["README.md"][0]
    assert TAG in hub.repo("ms", REPO).tags

    other = "oscar-zoo/other"
    hub.seed("ms", other, {"README.md": starter_card, "configuration.json": config})
    result = mirror_version(registry.registry, "smollm2-135m", 1, [f"modelscope:{other}"])[0]
    assert result.status == "failed" and "is not an oscar-zoo mirror" in result.error
    assert hub.repo("ms", other).files()["README.md"][0] == starter_card


def test_a_repo_that_already_exists_is_not_taken_for_one_the_run_created(registry, hub, tmp_path):
    hub.seed("hf", REPO, {"notes.txt": b"ours"})
    registry.publish_dir(make_bundle(tmp_path / "b").path)
    result = mirror_version(registry.registry, "smollm2-135m", 1, [HF])[0]
    assert result.status == "failed" and "notes.txt" in result.error


def _from_a_job(registry, asked: list[str]) -> None:
    """Make version 1 the result of a job whose spec asks for `asked`."""
    from oscar_zoo.registry_db.models import BundleVersion, Job

    with registry.registry.db.write() as session:
        job = Job(spec={"model": "smollm2-135m", "mirror": asked}, model="smollm2-135m")
        session.add(job)
        session.flush()
        version = session.query(BundleVersion).one()
        version.source_job = job.id


def test_a_job_mirrors_only_to_targets_the_configuration_names(registry, hub, tmp_path,
                                                               monkeypatch):
    """The push uses the server's HF_TOKEN: a jobs:submit token naming any repo would write
    wherever that token can."""
    other = "hf:victim/models"
    monkeypatch.setenv("OSCAR_ZOO_MIRROR_TARGETS", f"qwen3-*={HF}")  # allowed, not for smollm2
    registry.publish_dir(make_bundle(tmp_path / "b").path)
    _from_a_job(registry, [HF, other])
    mirror_published(registry.registry, "smollm2-135m", 1, wait=True)
    assert TAG in hub.repo("hf", REPO).tags
    assert hub.repo("hf", "victim/models") is None
    with registry.client() as http:
        items = {i["repo"]: i for i in
                 http.get("/v1/models/smollm2-135m/versions/1/mirrors").json()["items"]}
    assert items[REPO]["status"] == "done"
    assert items["victim/models"]["status"] == "failed"
    assert "OSCAR_ZOO_MIRROR_TARGETS" in items["victim/models"]["error"]


def test_an_index_damaged_in_transit_is_read_again_not_rebuilt(registry, hub, tmp_path):
    for i in range(2):
        registry.publish_dir(make_bundle(tmp_path / f"b{i}", seed=i).path)
    assert mirror_version(registry.registry, "smollm2-135m", 1, [HF])[0].status == "done"
    hub.corrupt(r"/resolve/[^/]+/oscar-zoo\.json", times=1, hub="hf")
    assert mirror_version(registry.registry, "smollm2-135m", 2, [HF])[0].status == "done"
    assert sorted(hub_index(hub)["models"]["smollm2-135m"]["versions"]) == ["1", "2"]


@pytest.mark.parametrize("damage", [b"{not json", b'{"models": []}'])
def test_an_unreadable_index_fails_the_mirror_and_is_left_for_a_person(registry, hub, tmp_path,
                                                                       damage):
    hub.seed("hf", REPO, {"oscar-zoo.json": damage})
    n = len(hub.repo("hf", REPO).commits)
    registry.publish_dir(make_bundle(tmp_path / "b").path)
    r = mirror_version(registry.registry, "smollm2-135m", 1, [HF])[0]
    assert r.status == "failed" and "oscar-zoo.json on the main branch cannot be read" in r.error
    assert "repair it" in r.error
    repo = hub.repo("hf", REPO)
    assert len(repo.commits) == n and repo.files()["oscar-zoo.json"][0] == damage


def test_a_tagged_version_the_index_lost_is_indexed_again(registry, hub, tmp_path):
    """The tag exists, so the files are there; but a pull finds versions by the index."""
    registry.publish_dir(make_bundle(tmp_path / "b").path)
    first = mirror_version(registry.registry, "smollm2-135m", 1, [HF])[0]
    lost = {"format": "oscar-zoo.mirror", "format_version": 1, "models": {}}
    hub.seed("hf", REPO, {"oscar-zoo.json": json.dumps(lost).encode()})
    again = mirror_version(registry.registry, "smollm2-135m", 1, [HF])[0]
    assert (again.status, again.committed, again.revision) == ("done", True, first.revision)
    entry = hub_index(hub)["models"]["smollm2-135m"]["versions"]["1"]
    assert (entry["tag"], entry["path"]) == (TAG, first.path)
    assert hub.repo("hf", REPO).tags == {TAG: first.revision}
    assert not mirror_version(registry.registry, "smollm2-135m", 1, [HF])[0].committed


def test_another_tools_incomplete_entry_in_the_index_is_tolerated(registry, hub, tmp_path):
    index = {"format": "oscar-zoo.mirror", "format_version": 1,
             "models": {"other": {"hub_id": "o/x", "versions": {"1": {"digest": "ab"}},
                                  "latest": 1}}}
    hub.seed("hf", REPO, {"oscar-zoo.json": json.dumps(index).encode()})
    registry.publish_dir(make_bundle(tmp_path / "b").path)
    r = mirror_version(registry.registry, "smollm2-135m", 1, [HF])[0]
    assert r.status == "done", r.error
    assert hub_index(hub)["models"]["other"] == index["models"]["other"]
