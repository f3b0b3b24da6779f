"""Mirroring to the loopback hub emulator with the real huggingface_hub and modelscope-hub
clients: layout, tags, hashes, idempotent re-runs, a crash mid-upload, one hub failing, the
registry's records, automatic mirroring after publish, and reading it all back."""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from oscar_zoo.zoo.bundle import verify_bundle
from oscar_zoo.zoo.cache import Cache
from oscar_zoo.registry_db.mirrors import configured_targets, mirror_after_publish, mirror_version
from oscar_zoo.zoo.pull import pull
from tests.utils.bundles import make_bundle

HF, MS = "hf:oscar-zoo/rotations", "modelscope:oscar-zoo/rotations"
REPO = "oscar-zoo/rotations"
FOLDER = "SmolLM2-135M-Instruct/seq1000_prompt0_group64"
TAG = "smollm2-135m-v1"
BUNDLE_FILES = ("bundle.json", "rotations.safetensors", "README.md")
PT_FILES = ("k_rotation_qqt_r_h_pbr.pt", "v_rotation_sst_r_h_pbr.pt")


@pytest.fixture
def registry(tmp_path, monkeypatch, hub):
    from tests.utils.databases import fresh_database
    from tests.utils.registry_server import run_registry

    hub.tokens = {"hf_test", "ms_test"}  # writes need the tokens the clients send
    with fresh_database("sqlite", tmp_path) as url, run_registry(url, tmp_path / "reg") as server:
        monkeypatch.setenv("OSCAR_ZOO_DATABASE_URL", url)
        monkeypatch.setenv("OSCAR_ZOO_DATA_DIR", str(tmp_path / "reg"))
        yield server


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    root = tmp_path_factory.mktemp("mirror-bundles")
    return [make_bundle(root / f"b{i}", seed=i) for i in range(2)]


def commits(hub, kind: str) -> int:
    return len(hub.repo("hf" if kind == "hf" else "ms", REPO).commits)


def test_mirror_to_both_hubs_and_read_it_back_with_the_plain_clients(registry, bundles, hub, tmp_path):
    registry.publish_dir(bundles[0].path)
    results = mirror_version(registry.registry, "smollm2-135m", 1, [HF, MS])
    assert [(r.target, r.status, r.committed, r.tag, r.path) for r in results] == [
        ("hf", "done", True, TAG, FOLDER), ("modelscope", "done", True, TAG, FOLDER)]
    # Hugging Face: snapshot_download at the tag
    from huggingface_hub import HfApi, snapshot_download

    local = Path(snapshot_download(REPO, revision=TAG, cache_dir=tmp_path / "hf"))
    _check_layout(local, bundles[0])
    refs = HfApi().list_repo_refs(REPO)
    assert {t.name: t.target_commit for t in refs.tags} == {TAG: results[0].revision}
    info = HfApi().get_paths_info(REPO, [f"{FOLDER}/rotations.safetensors"], revision=TAG)[0]
    assert info.lfs.sha256 == bundles[0].manifest.file("rotations.safetensors").sha256
    # ModelScope: download_repo at the tag
    from modelscope_hub import HubApi

    ms = HubApi()
    local = Path(ms.download_repo(REPO, "model", revision=TAG, local_dir=tmp_path / "ms"))
    _check_layout(local, bundles[0])
    assert TAG in {r["Revision"] for r in ms.list_repo_revisions(REPO, "model")}
    # the registry's records, through its API
    with registry.client() as http:
        items = http.get("/v1/models/smollm2-135m/versions/1/mirrors").json()["items"]
    assert {(i["target"], i["status"], i["path"]) for i in items} == {
        ("hf", "done", FOLDER), ("modelscope", "done", FOLDER)}
    assert next(i for i in items if i["target"] == "hf")["revision"] == results[0].revision


def _check_layout(root: Path, bundle) -> None:
    folder = root / FOLDER
    assert sorted(p.name for p in folder.iterdir()) == sorted(BUNDLE_FILES + PT_FILES)
    assert hashlib.sha256((folder / "bundle.json").read_bytes()).hexdigest() == bundle.digest
    verify_dir = root.parent / (root.name + "-bundle")
    verify_dir.mkdir()
    for name in BUNDLE_FILES:
        (verify_dir / name).write_bytes((folder / name).read_bytes())
    verify_bundle(verify_dir)
    torch = pytest.importorskip("torch")
    k = torch.load(folder / PT_FILES[0], weights_only=True)  # what SGLang scripts load
    assert k["format_version"] == 1
    np.testing.assert_array_equal(k["layers"][29]["rotation"].numpy(), bundle.k[29].rotation)
    index = json.loads((root / "oscar-zoo.json").read_text())
    assert index["models"]["smollm2-135m"]["versions"]["1"]["digest"] == bundle.digest
    readme = (root / "README.md").read_text()
    assert "| smollm2-135m | 1 | `" + FOLDER + "` | `" + TAG + "` |" in readme


def test_mirroring_again_commits_nothing(registry, bundles, hub):
    registry.publish_dir(bundles[0].path)
    first = mirror_version(registry.registry, "smollm2-135m", 1, [HF, MS])
    n_hf, n_ms, puts = commits(hub, "hf"), commits(hub, "ms"), len(hub.requests("PUT"))
    again = mirror_version(registry.registry, "smollm2-135m", 1, [HF, MS])
    assert [r.status for r in again] == ["done", "done"] and not any(r.committed for r in again)
    assert (commits(hub, "hf"), commits(hub, "ms")) == (n_hf, n_ms)
    assert again[0].revision == first[0].revision
    assert len(hub.requests("PUT")) == puts  # nothing uploaded the second time
    assert not hub.requests("POST", "/commit/")[2:]  # the two first commits only


def same_calibration_as(bundle, out: Path, seed: int):
    """Another bundle with the same calibration tag (seq/prompt/group): the same folder."""
    from oscar_zoo.zoo.bundle import Bundle, write
    from tests.utils.bundles import make_manifest, make_tensors

    manifest = make_manifest(seed=seed)
    cal = manifest.calibration.model_copy(update={"tokens": bundle.manifest.calibration.tokens})
    manifest = manifest.model_copy(update={"calibration": cal})
    k, v = make_tensors(manifest, seed)
    return write(Bundle(manifest, k, v), out)


def test_versions_tags_and_the_root_readme(registry, bundles, hub, tmp_path):
    second = same_calibration_as(bundles[0], tmp_path / "again", seed=7)
    for b in (bundles[0], second):
        registry.publish_dir(b.path)
    mirror_version(registry.registry, "smollm2-135m", 2, [HF])
    older = mirror_version(registry.registry, "smollm2-135m", 1, [HF])[0]
    # v1 came after v2 into the same folder: it goes to a v1/ subfolder, main keeps v2
    assert older.path == f"{FOLDER}/v1"
    from huggingface_hub import HfApi, hf_hub_download

    main = hf_hub_download(REPO, f"{FOLDER}/bundle.json", cache_dir=tmp_path / "h")
    assert hashlib.sha256(Path(main).read_bytes()).hexdigest() == second.digest
    at_v1 = hf_hub_download(REPO, f"{FOLDER}/v1/bundle.json", revision=TAG, cache_dir=tmp_path / "h")
    assert hashlib.sha256(Path(at_v1).read_bytes()).hexdigest() == bundles[0].digest
    readme = Path(hf_hub_download(REPO, "README.md", cache_dir=tmp_path / "h")).read_text()
    assert "| smollm2-135m | 2 |" in readme and "| smollm2-135m | 1 |" in readme
    assert {t.name for t in HfApi().list_repo_refs(REPO).tags} == {TAG, "smollm2-135m-v2"}
    # in order, each version has its own calibration folder
    third = make_bundle(tmp_path / "third", seed=3)
    registry.publish_dir(third.path)
    r3 = mirror_version(registry.registry, "smollm2-135m", 3, [HF])[0]
    assert r3.path == "SmolLM2-135M-Instruct/seq1003_prompt0_group64"


def test_an_older_version_mirrored_again_after_a_newer_one_is_left_alone(hub, bundles, tmp_path):
    """v1 in the folder, then v2 (same calibration tag) takes it over on main: mirroring v1
    again finds it where its tag put it, instead of failing on a v1/ subfolder."""
    from oscar_zoo.zoo.mirror.runner import mirror_bundle

    hub.tokens = {"hf_test", "ms_test"}
    second = same_calibration_as(bundles[0], tmp_path / "again", seed=7)
    for target in (HF, MS):
        first = mirror_bundle(bundles[0].path, 1, target)
        assert mirror_bundle(second.path, 2, target).path == FOLDER
        n = commits(hub, "hf" if target == HF else "ms")
        again = mirror_bundle(bundles[0].path, 1, target)
        assert (again.status, again.error, again.committed) == ("done", None, False)
        assert (again.path, again.revision) == (FOLDER, first.revision)
        assert commits(hub, "hf" if target == HF else "ms") == n


def test_a_newer_version_in_the_folder_leaves_no_stale_oscar_files(hub, bundles, tmp_path):
    """v1 per layer, then v2 per KV head with the same calibration tag: the folder on main must
    not keep v1's k_rotation_qqt_r_h_pbr.pt beside v2's per-head pair (scripts pick by name;
    the shared file on a per-head model collapses it, oscar-spec 7.2). v1's tag keeps them."""
    from oscar_zoo.zoo.bundle import Bundle, write
    from oscar_zoo.zoo.mirror.runner import mirror_bundle
    from tests.utils.bundles import make_manifest, make_tensors

    hub.tokens = {"hf_test", "ms_test"}
    manifest = make_manifest(per_head=True, seed=0)
    per_head = write(Bundle(manifest, *make_tensors(manifest, 0)), tmp_path / "ph")
    for target, kind in ((HF, "hf"), (MS, "ms")):
        assert mirror_bundle(bundles[0].path, 1, target).status == "done"
        second = mirror_bundle(per_head.path, 2, target)
        assert (second.status, second.path) == ("done", FOLDER)
        repo = hub.repo(kind, REPO)
        pts = sorted(p.rsplit("/", 1)[1] for p in repo.files() if p.startswith(FOLDER + "/")
                     and p.endswith(".pt"))
        assert pts == ["k_rotation_perhead.pt", "v_rotation_perhead.pt"]
        assert all(f"{FOLDER}/{name}" in repo.files(TAG) for name in PT_FILES)
        again = mirror_bundle(per_head.path, 2, target)
        assert again.status == "done" and not again.committed


def test_oscar_zoo_pull_reads_the_mirror(registry, bundles, monkeypatch):
    for b in bundles:
        registry.publish_dir(b.path)
    mirror_version(registry.registry, "smollm2-135m", 1, [HF, MS])
    mirror_version(registry.registry, "smollm2-135m", 2, [HF, MS])
    for kind, setting in (("hf", "OSCAR_ZOO_HF_MIRROR_REPO"), ("modelscope", "OSCAR_ZOO_MODELSCOPE_MIRROR_REPO")):
        monkeypatch.setenv(setting, REPO)
        monkeypatch.setenv("OSCAR_ZOO_SOURCES", kind)
        latest = pull("smollm2-135m", fmt="sglang")
        assert (latest.source, latest.version, latest.digest) == (kind, 2, bundles[1].digest)
        old = pull("smollm2-135m@1")
        assert old.digest == bundles[0].digest and old.origin.endswith(f"@{TAG}")


def test_a_mirror_killed_mid_upload_finishes_on_the_next_run(registry, bundles, hub, tmp_path):
    registry.publish_dir(bundles[0].path)
    hub.delay("PUT", r"^/_lfs/", seconds=60)  # the upload hangs, then the process is killed
    proc = subprocess.Popen([sys.executable, "-m", "oscar_zoo.zoo.cli.main", "mirror",
                             "smollm2-135m@1", "--to", HF], env=os.environ.copy(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not hub.requests("PUT", r"^/_lfs/"):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()[-2000:]
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    hub.faults.clear()
    assert commits(hub, "hf") == 1  # only the repo's initial commit: nothing half-committed
    result = mirror_version(registry.registry, "smollm2-135m", 1, [HF])[0]
    assert result.status == "done" and result.committed
    assert commits(hub, "hf") == 2
    assert mirror_version(registry.registry, "smollm2-135m", 1, [HF])[0].committed is False


def test_a_crash_between_commit_and_tag_is_finished_without_a_second_commit(registry, bundles, hub):
    registry.publish_dir(bundles[0].path)
    hub.fail("POST", r"/tag/", status=500)  # the commit lands, the tag never does
    failed = mirror_version(registry.registry, "smollm2-135m", 1, [HF])[0]
    assert failed.status == "failed" and "500" in failed.error
    n = commits(hub, "hf")
    hub.faults.clear()
    done = mirror_version(registry.registry, "smollm2-135m", 1, [HF])[0]
    assert done.status == "done" and commits(hub, "hf") == n
    # it made the tag: not "already there, nothing uploaded", as it said
    assert done.committed and done.note == "tagged only: its files were already on the main branch"
    assert hub.repo("hf", REPO).tags[TAG] == hub.repo("hf", REPO).branches["main"]


def test_a_500_from_one_hub_leaves_the_other_mirrored_and_recorded(registry, bundles, hub, caplog):
    registry.publish_dir(bundles[0].path)
    hub.fail("*", r"^/api/v1/", status=500, hub="ms")
    hf, ms = mirror_version(registry.registry, "smollm2-135m", 1, [HF, MS])
    assert hf.status == "done" and ms.status == "failed" and "500" in ms.error
    with registry.client() as http:
        items = {i["target"]: i for i in
                 http.get("/v1/models/smollm2-135m/versions/1/mirrors").json()["items"]}
    assert items["hf"]["status"] == "done" and items["modelscope"]["status"] == "failed"
    assert "500" in items["modelscope"]["error"]
    everything = caplog.text + json.dumps(items)
    assert "hf_test" not in everything and "ms_test" not in everything  # tokens never logged


def test_automatic_mirroring_after_publish(registry, bundles, hub, monkeypatch):
    monkeypatch.setenv("OSCAR_ZOO_MIRROR_TARGETS", f"qwen3-*={MS},smollm2-*={HF}")
    assert configured_targets("smollm2-135m") == [HF] and configured_targets("glm-4.7-fp8") == []
    publication = registry.publish_dir(bundles[0].path)
    mirror_after_publish(registry.registry, publication, wait=True)
    assert TAG in hub.repo("hf", REPO).tags and hub.repo("ms", REPO) is None
    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli

    out = CliRunner().invoke(cli, ["mirror", "smollm2-135m@1", "--status", "--json"]).stdout
    assert [(r["target"], r["status"]) for r in json.loads(out)] == [("hf", "done")]


def test_uploads_never_take_the_xet_path(registry, bundles, hub, monkeypatch):
    """The emulator has no xet endpoints (they answer 501): with xet on, upload_folder fails
    (hubs.md 1.3). The mirror forces it off, so production takes the path tested here."""
    import huggingface_hub.constants as constants

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", False)
    registry.publish_dir(bundles[0].path)
    assert mirror_version(registry.registry, "smollm2-135m", 1, [HF])[0].status == "done"
    assert not hub.requests(None, "xet")


def test_per_head_bundle_uses_oscars_per_head_names(registry, hub, tmp_path):
    b = make_bundle(tmp_path / "ph", per_head=True)
    registry.publish_dir(b.path)
    r = mirror_version(registry.registry, "smollm2-135m", 1, [HF])[0]
    files = hub.repo("hf", REPO).files()
    assert f"{r.path}/k_rotation_perhead.pt" in files and f"{r.path}/v_rotation_perhead.pt" in files
    torch = pytest.importorskip("torch")
    k = torch.load(io.BytesIO(files[f"{r.path}/k_rotation_perhead.pt"][0]), weights_only=True)
    assert k["format_version"] == 2 and tuple(k["layers"][0]["rotation"].shape) == (3, 64, 64)


def test_root_readme_and_index_carry_validation_numbers():
    from oscar_zoo.zoo.mirror import layout

    manifest = {"model": {"name": "qwen3-8b", "hub_id": "Qwen/Qwen3-8B"},
                "calibration": {"source": "calibrated", "tokens": 30000, "prompts": 83,
                                "created_at": "2026-11-22T00:00:00Z"},
                "quantization": {"group_size": 128}, "method": {"granularity": "layer"},
                "validation": {"passed": True, "context_len": 4096,
                               "variants": [{"name": "bundle", "delta_nll": 0.0123},
                                            {"name": "hadamard", "delta_nll": 0.0456}]}}
    folder = layout.version_folder(manifest)
    assert folder == "Qwen3-8B/seq30000_prompt83_group128"
    entry = layout.index_entry(manifest, "ab" * 32, 4, [], folder)
    index = layout.updated_index(None, manifest, entry)
    assert index["models"]["qwen3-8b"]["latest"] == 4
    readme = layout.render_root_readme(index, "org/rot").decode()
    assert "| qwen3-8b | 4 | `Qwen3-8B/seq30000_prompt83_group128` | `qwen3-8b-v4` | calibrated " \
           "| passed | +0.0123 | +0.0456 |" in readme
    assert layout.dump_index(index) == layout.dump_index(json.loads(layout.dump_index(index)))


@pytest.mark.parametrize("slot", [{}, {"versions": []}, {"versions": {"one": {}}}, {"versions": {"1": 3}}, "x"])
def test_a_hand_edited_model_entry_in_the_index_is_rebuilt(slot):
    from oscar_zoo.zoo.mirror import layout, runner

    manifest = {"model": {"name": "m", "hub_id": "org/M"},
                "calibration": {"source": "calibrated", "tokens": 8, "prompts": 1},
                "quantization": {"group_size": 64}, "method": {"granularity": "layer"}}
    entry = layout.index_entry(manifest, "ab" * 32, 3, [], layout.version_folder(manifest))
    other = {"hub_id": "org/N", "versions": {"2": {**entry, "version": 2, "tag": "n-v2",
                                                   "path": "N/seq8_prompt1_group64"}}, "latest": 2}
    current = json.dumps({"models": {"m": slot, "n": other}}).encode()
    index = layout.updated_index(current, manifest, entry)
    assert index["models"]["m"] == {"hub_id": "org/M", "versions": {"3": entry}, "latest": 3}
    assert index["models"]["n"] == other        # other models' entries are kept as they are
    assert "`m-v3`" in layout.render_root_readme(index, "org/rot").decode()
    # and the mirror's own reading of that index, for the folder, takes it as no versions
    loaded = layout.load_index(current)
    assert runner._folder_for(loaded, manifest, 3, "m") == layout.version_folder(manifest)
    assert runner._recorded_folder(loaded, "m", 1) is None


def test_a_file_name_in_the_manifest_cannot_upload_files_outside_the_bundle(tmp_path):
    from oscar_zoo.zoo.errors import UnsafePathError
    from oscar_zoo.zoo.mirror import layout

    b = make_bundle(tmp_path / "b")
    (tmp_path / "secret").write_text("not for the hub")
    manifest = json.loads((b.path / "bundle.json").read_text())
    manifest["files"].append({"name": "../secret", "sha256": "0" * 64, "size": 15})
    with pytest.raises(UnsafePathError):
        layout.version_files(b.path, manifest, "M/seq8_prompt1_group64")


def test_publishing_over_http_mirrors_to_configured_targets(registry, bundles, hub, monkeypatch):
    from tests.utils.registry_server import upload_bundle

    monkeypatch.setenv("OSCAR_ZOO_MIRROR_TARGETS", HF)
    with registry.client(token=registry.token("bundles:publish")) as client:
        assert upload_bundle(client, bundles[1].path).status_code == 201
        deadline, records = time.monotonic() + 60, []
        while [r["status"] for r in records] != ["done"]:   # the mirror runs in the background
            assert time.monotonic() < deadline, f"publish did not mirror: {records}"
            time.sleep(0.2)
            records = client.get("/v1/models/smollm2-135m/versions/1/mirrors").json()["items"]
    assert TAG in hub.repo("hf", REPO).tags
    assert [r["target"] for r in records] == ["hf"]


def test_a_pull_from_the_mirror_into_another_cache_leaves_the_default_one_alone(
        registry, bundles, monkeypatch, tmp_path):
    """The mirror's index was fetched into the default cache whatever cache the pull used."""
    registry.publish_dir(bundles[0].path)
    mirror_version(registry.registry, "smollm2-135m", 1, [HF])
    monkeypatch.setenv("OSCAR_ZOO_HF_MIRROR_REPO", REPO)
    monkeypatch.setenv("OSCAR_ZOO_SOURCES", "hf")
    default, other = Cache(), Cache(tmp_path / "other-cache")
    before = sorted(default.root.rglob("*")) if default.root.exists() else []
    got = pull("smollm2-135m", cache=other)
    assert got.source == "hf" and got.path.is_relative_to(other.root)
    assert (sorted(default.root.rglob("*")) if default.root.exists() else []) == before
