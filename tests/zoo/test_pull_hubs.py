"""`oscar-zoo pull` against the loopback hub emulator with the real huggingface_hub and
modelscope-hub clients: RotationZoo layout, format 1 and format 2 files written by torch.save."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from oscar_zoo.zoo.bundle import verify_bundle
from oscar_zoo.zoo.cache import Cache
from oscar_zoo.zoo.cli.main import cli
from oscar_zoo.zoo.errors import (BundleNotFound, ModelNotFound, OfflineError, RemoteError,
                                  Unauthorized, VersionNotFound)
from oscar_zoo.zoo.pull import pull

from .conftest import GLM_FILES, GLM_FOLDER, HF_ZOO, MS_ZOO, QWEN30_FILES

torch = pytest.importorskip("torch")


def run(*args, ok: bool = True):
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    if ok:
        assert result.exit_code == 0, result.output + result.stderr
    return result


def seeded_rotation(zoo_files, name: str, layer: int) -> np.ndarray:
    obj = torch.load(__import__("io").BytesIO(zoo_files[name]), weights_only=True)
    return obj["layers"][layer]["rotation"].numpy()


def test_pull_glm_end_to_end_from_the_hf_rotationzoo(seed_zoo, hub, zoo_files, cache_root):
    seed_zoo()
    result = run("pull", "glm-4.7-fp8")
    # stdout: a runnable SGLang recipe pointing at the exported OSCAR files
    out = result.stdout
    assert "--kv-cache-dtype int2" in out and "--kv-cache-quant-group-size 128" in out
    assert "--tp-size 8" in out and "SGLANG_OSCAR_K_CLIP_RATIO=0.96" in out
    env = dict(line[len("export "):].split("=", 1) for line in out.splitlines()
               if line.startswith("export "))
    k_path, v_path = Path(env["SGLANG_OSCAR_K_ROTATION_PATH"]), Path(env["SGLANG_OSCAR_V_ROTATION_PATH"])
    assert (k_path.name, v_path.name) == GLM_FILES
    # what SGLang will load equals what the zoo holds, bit for bit, read by real torch
    k = torch.load(k_path, weights_only=True)
    assert k["format_version"] == 1 and sorted(k["layers"]) == list(range(92))
    for layer in (0, 45, 91):
        np.testing.assert_array_equal(k["layers"][layer]["rotation"].numpy(),
                                      seeded_rotation(zoo_files, f"{GLM_FOLDER}/{GLM_FILES[0]}", layer))
    # the cache: content-addressed blobs, a ref, a verified snapshot marked as imported
    snapshots = list((cache_root / "models" / "glm-4.7-fp8" / "snapshots").iterdir())
    assert len(snapshots) == 1
    snap = snapshots[0]
    manifest = verify_bundle(snap)
    assert manifest.calibration.source == "imported" and manifest.validation is None
    commit = hub.repo("hf", HF_ZOO).branches["main"]
    assert manifest.calibration.imported_from == f"hf:{HF_ZOO}/{GLM_FOLDER}@{commit}"
    assert (cache_root / "models/glm-4.7-fp8/refs/rotationzoo").read_text().strip() == snap.name
    meta = json.loads((cache_root / "models/glm-4.7-fp8/meta" / f"{snap.name}.json").read_text())
    for f in ("bundle.json", "rotations.safetensors", "README.md"):  # hardlinks of the blobs
        assert os.path.samefile(snap / f, cache_root / "blobs/sha256" / meta["files"][f])
        assert not (snap / f).stat().st_mode & 0o222, f"{f}: a writable link makes its blob writable"
    pt_sha = hashlib.sha256(zoo_files[f"{GLM_FOLDER}/{GLM_FILES[0]}"]).hexdigest()
    assert (cache_root / "blobs" / "sha256" / pt_sha).is_file()
    # pinned to one commit: both files came from /resolve/<commit>/
    assert len(hub.requests("GET", f"/resolve/{commit}/")) == 2
    assert "imported from hf:" in result.stderr and "validation  none" in result.stderr


def test_every_name_of_the_model_gives_the_same_bundle_and_warm_pulls_download_nothing(seed_zoo, hub):
    seed_zoo()
    first = pull("glm-4.7-fp8", fmt="sglang")
    downloads = len(hub.requests("GET", "/resolve/"))
    for name in ("GLM-4.7-FP8", "zai-org/GLM-4.7-FP8", "glm-4.7", "glm-4.7-fp8@recommended"):
        again = pull(name, fmt="sglang")
        assert again.digest == first.digest and again.cached
        assert again.export.files == first.export.files
    assert len(hub.requests("GET", "/resolve/")) == downloads
    # A warm pull asks the Hub only for the commit and hashes (HEAD), not through HfApi.
    hub.log.clear()
    assert pull("glm-4.7-fp8").cached
    assert {m for m, _ in hub.log} == {"HEAD"} and all("/resolve/main/" in p for _, p in hub.log)


def test_the_commit_date_is_best_effort_once_the_files_are_verified(seed_zoo, hub):
    seed_zoo(("hf",))
    hub.fail("*", r"^/api/models/", status=503, hub="hf")
    r = pull("glm-4.7-fp8", fmt="sglang")
    assert r.source == "hf" and not r.cached
    assert hub.requests("GET", "/resolve/")


def test_per_head_format_2_entry(seed_zoo, zoo_files):
    seed_zoo(("hf",))
    r = pull("qwen3-30b-a3b", fmt="sglang")
    assert [p.name for p in r.export.files.values()] == list(QWEN30_FILES)
    k = torch.load(r.export.files["k"], weights_only=True)
    assert k["format_version"] == 2 and k["source_grouping"] == "per_kv_head"
    assert tuple(k["layers"][0]["rotation"].shape) == (4, 128, 128)
    np.testing.assert_array_equal(k["layers"][47]["rotation"].numpy(),
                                  seeded_rotation(zoo_files, f"Qwen3-30B-A3B/{QWEN30_FILES[0]}", 47))
    assert r.export.recipe.env["SGLANG_OSCAR_ABSORB_V_ROTATION"] == "0"
    assert json.loads((r.path / "bundle.json").read_text())["method"]["granularity"] == "kv_head"
    result = run("pull", "qwen3-30b-a3b", "--format", "vllm", ok=False)  # cached: export() says no
    assert result.exit_code == 1 and "per KV head" in result.stderr


def test_vllm_of_per_head_zoo_files_is_refused_before_they_are_downloaded(seed_zoo, hub):
    """The catalog says the entry is per KV head; the .pt files would say so only once fetched."""
    seed_zoo(("hf",))
    hub.log.clear()
    result = run("pull", "qwen3-30b-a3b", "--format", "vllm", ok=False)
    assert result.exit_code == 1 and "one per KV head" in result.stderr and "--format sglang" in result.stderr
    assert not hub.requests("GET", "/resolve/")


def test_layers_fetches_whole_hub_files_and_exports_the_share(seed_zoo):
    seed_zoo(("hf",))
    r = pull("glm-4.7-fp8", layers="0-45", fmt="sglang")
    assert r.layers == list(range(46))
    assert any("all of them were fetched" in n.text for n in r.notes)
    k = torch.load(r.export.files["k"], weights_only=True)
    assert sorted(k["layers"]) == list(range(46))
    assert "layers 0-45 only" in " ".join(r.export.recipe.notes)


def test_modelscope_serves_when_the_hf_hub_fails(seed_zoo, hub):
    seed_zoo()
    hub.fail("*", r"^/api/models/|/resolve/", status=503, hub="hf")
    r = pull("glm-4.7-fp8", fmt="sglang")
    assert r.source == "modelscope" and r.origin.startswith(f"modelscope:{MS_ZOO}/")
    assert hub.requests("GET", "/api/v1/models/togethercomputer/OSCAR-RotationZoo/repo?")
    assert not hub.requests("GET", "/resolve/")


def test_a_modelscope_pull_draws_no_bars_off_a_terminal_or_under_quiet(seed_zoo, monkeypatch):
    """modelscope-hub draws its own tqdm bar per file on stderr, terminal or not: `pull -q`
    printed two of them, and a pull logged to a file printed their redraws."""
    from modelscope_hub import _download as ms_download

    seed_zoo(("ms",))
    monkeypatch.setenv("OSCAR_ZOO_SOURCES", "modelscope")
    cmd = [sys.executable, "-m", "oscar_zoo.zoo.cli.main", "pull", "glm-4.7-fp8", "--format", "sglang"]
    quiet = subprocess.run(cmd + ["-q"], capture_output=True, text=True, timeout=120)
    assert quiet.returncode == 0 and quiet.stderr == "" and "SGLANG_OSCAR" in quiet.stdout
    shutil.rmtree(Cache().root)                    # each run below downloads again
    logged = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert logged.returncode == 0 and "%|" not in logged.stderr and "glm-4.7-fp8" in logged.stderr
    shutil.rmtree(Cache().root)
    real = ms_download.tqdm
    assert not pull("glm-4.7-fp8", progress=False).cached            # in process: the client's own tqdm put back
    assert ms_download.tqdm is real


@pytest.mark.parametrize("intact", [True, False])
def test_a_modelscope_file_a_killed_pull_left_unadopted_is_used(seed_zoo, hub, zoo_files, intact):
    """The ModelScope client's finished file waits at <key>.hub.done until we adopt it; a pull
    killed in between left a whole download that the next pull fetched again."""
    seed_zoo()
    hub.fail("*", r"^/api/models/|/resolve/", status=503, hub="hf")
    data = zoo_files[f"{GLM_FOLDER}/{GLM_FILES[0]}"]
    sha = hashlib.sha256(data).hexdigest()
    cache = Cache()
    cache.ensure()
    (cache.blobs / f"{sha}.hub.done").write_bytes(data if intact else data[:-1] + b"x")
    r = pull("glm-4.7-fp8")
    assert r.source == "modelscope" and cache.blob(sha).read_bytes() == data
    assert bool(hub.requests("GET", GLM_FILES[0])) != intact
    assert not (cache.blobs / f"{sha}.hub.done").exists()


def test_out_dir_and_json(seed_zoo, tmp_path, monkeypatch):
    seed_zoo(("hf",))
    out = tmp_path / "rot"
    data = json.loads(run("pull", "glm-4.7-fp8", "--format", "vllm", "--out", str(out), "--json").stdout)
    assert data["export"]["recipe"]["env"]["VLLM_OSCAR_K_ROTATION_PATH"] == str(out / GLM_FILES[0])
    assert data["export"]["recipe"]["command"][:2] == ["vllm", "serve"]
    assert sorted(os.listdir(out)) == sorted([*GLM_FILES, ".oscar-zoo.json"])   # what it holds
    data = json.loads(run("pull", "glm-4.7-fp8", "--format", "safetensors", "--out", str(tmp_path / "b"),
                          "--json").stdout)
    verify_bundle(tmp_path / "b")
    assert data["digest"] == hashlib.sha256((tmp_path / "b" / "bundle.json").read_bytes()).hexdigest()
    # a relative --out still gives the recipe absolute paths (it runs from another directory)
    monkeypatch.chdir(tmp_path)
    data = json.loads(run("export", "glm-4.7-fp8", "--format", "vllm", "--out", "rel", "--json").stdout)
    assert data["recipe"]["env"]["VLLM_OSCAR_K_ROTATION_PATH"] == str(tmp_path / "rel" / GLM_FILES[0])
    (tmp_path / "file").write_text("in the way")
    for cmd in ("pull", "export"):  # an --out that cannot be a directory: one line, no traceback
        result = CliRunner().invoke(cli, [cmd, "glm-4.7-fp8", "--out", str(tmp_path / "file" / "rot")])
        assert result.exit_code == 1 and "cannot create that directory" in result.stderr, result.output


# --- clear errors ------------------------------------------------------------------------------

def test_unknown_model_suggests_names(seed_zoo):
    seed_zoo()
    result = run("pull", "glm-4.7-fp9", ok=False)
    assert result.exit_code == 1
    assert "unknown model 'glm-4.7-fp9'" in result.stderr and "Did you mean: glm-4.7-fp8" in result.stderr
    with pytest.raises(ModelNotFound):
        pull("no-such-model")


def test_unknown_version_on_hubs(seed_zoo):
    seed_zoo()
    with pytest.raises(VersionNotFound, match="no numbered versions"):
        pull("glm-4.7-fp8@3")


def test_hub_404_names_the_missing_file(hub):
    hub.seed("hf", HF_ZOO, {"README.md": b"# empty zoo\n"})
    hub.seed("ms", MS_ZOO, {"README.md": b"# empty zoo\n"})
    with pytest.raises(BundleNotFound, match=f"no file {GLM_FOLDER}/{GLM_FILES[0]}"):
        pull("glm-4.7-fp8")


def test_missing_repo_is_not_found(hub, monkeypatch):
    monkeypatch.setenv("OSCAR_ZOO_SOURCES", "hf")
    with pytest.raises(BundleNotFound, match="repository not found"):
        pull("glm-4.7-fp8")


def test_hub_401_says_which_token(seed_zoo, hub, monkeypatch):
    seed_zoo()
    hub.fail("*", r"^/api/", status=401)
    with pytest.raises(Unauthorized) as e:
        pull("glm-4.7-fp8")
    assert "HF_TOKEN" in str(e.value) and "MODELSCOPE_API_TOKEN" in str(e.value)


def test_hub_500_is_retried_then_reported(seed_zoo, hub, monkeypatch):
    seed_zoo(("hf",))
    monkeypatch.setenv("OSCAR_ZOO_SOURCES", "hf")
    hub.fail("GET", r"/resolve/", status=500)
    with pytest.raises(RemoteError, match="500"):
        pull("glm-4.7-fp8")
    # 1 + 2 retries for the file reported; the other stops with it, at most as far
    counts = sorted(len(hub.requests("GET", f"/resolve/.*{name}")) for name in GLM_FILES)
    assert counts[-1] == 3 and 1 <= counts[0] <= 3


def test_transient_500_heals_with_retries(seed_zoo, hub, monkeypatch):
    seed_zoo(("hf",))
    monkeypatch.setenv("OSCAR_ZOO_SOURCES", "hf")
    hub.fail("GET", r"/resolve/", status=502, times=2)
    hub.fail("GET", r"^/api/models/", status=503, times=1)
    assert pull("glm-4.7-fp8").source == "hf"


def test_a_refused_metadata_call_is_not_retried(seed_zoo, hub, monkeypatch):
    seed_zoo(("hf",))
    monkeypatch.setenv("OSCAR_ZOO_SOURCES", "hf")
    hub.fail("HEAD", r"/resolve/", status=404)      # no quick HEAD listing: ask the API
    hub.fail("GET", r"^/api/models/", status=400)
    with pytest.raises(RemoteError, match="400"):
        pull("glm-4.7-fp8")
    assert len(hub.requests("GET", r"^/api/models/")) == 1   # a 400 would only be refused again


def test_a_throttled_pull_fails_at_once_saying_how_long_the_hub_asked_to_wait(seed_zoo, hub,
                                                                              monkeypatch):
    """A 429 asking for 10 minutes was reported as a bare 429: how long to wait was lost."""
    seed_zoo(("hf",))
    monkeypatch.setenv("OSCAR_ZOO_SOURCES", "hf")
    hub.fail("HEAD", r"/resolve/", status=404)      # no quick HEAD listing: ask the API
    hub.fail("GET", r"^/api/models/", status=429, retry_after=600)
    with pytest.raises(RemoteError, match="429") as e:
        pull("glm-4.7-fp8")
    assert "the hub asked to wait 10 min before another request" in str(e.value)
    assert len(hub.requests("GET", r"^/api/models/")) == 1   # not sat out, not retried


def test_no_network_is_a_clear_error_and_a_cached_copy_still_serves(seed_zoo, monkeypatch):
    seed_zoo()
    first = pull("glm-4.7-fp8")
    dead = "http://127.0.0.1:9"  # the discard port: nothing listens there
    monkeypatch.setenv("HF_ENDPOINT", dead)
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", dead)
    again = pull("glm-4.7-fp8")  # cached: served from the cache, with a warning
    assert again.digest == first.digest and again.cached
    assert "no source could be reached" in again.notes[0].text
    with pytest.raises(OfflineError, match="cannot reach") as e:  # not cached: a clear error
        pull("qwen3-30b-a3b")
    # not "set OSCAR_ZOO_OFFLINE=1": pull already asked the cache, which has no qwen3-30b-a3b
    assert "OSCAR_ZOO_OFFLINE" not in str(e.value)
    assert "qwen3-30b-a3b is not cached at all" in str(e.value)
