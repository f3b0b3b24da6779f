"""`oscar-zoo cache rm` of what `pull --layers` from a registry leaves: a part (partial/<digest>/
layers-<spec>/, linking bundle.json and a rotations file of those layers), its meta and refs,
its layered exports, its blobs. All of it goes with its bundle, nothing of a bundle that stays,
and a pull of those layers in progress holds the removal off until its export is built."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from oscar_zoo.zoo.cache import Cache, prune, verify_cache
from oscar_zoo.zoo.cache_remove import remove, resolve_removal
from oscar_zoo.zoo.cli.main import cli
from oscar_zoo.zoo.errors import LockTimeout
from oscar_zoo.zoo.pull import pull

from .conftest import pull_paused_after

GLM = "glm-4.7-fp8"


def files(root: Path) -> set[str]:
    """Every file under the cache, locks aside, relative to it."""
    return {str(p.relative_to(root)) for p in root.rglob("*")
            if p.is_file() and ".locks" not in p.parts}


def rm(*args: str) -> dict:
    result = CliRunner().invoke(cli, ["cache", "rm", *args, "--yes", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_a_part_goes_with_its_export_and_blobs(registry, glm_bundles):
    registry.publish_dir(glm_bundles[0].path)
    part = pull(GLM, layers="0-3", fmt="sglang")
    cache = Cache()
    d = part.digest
    rotations = cache.blob(json.loads((part.path / ".partial.json").read_text())["rotations.safetensors"])
    assert part.path.parent == cache.model_dir(GLM) / "partial" / d and rotations.exists()
    planned = json.loads(CliRunner().invoke(cli, ["cache", "rm", f"{GLM}@1", "--dry-run",
                                                  "--json"]).stdout)
    assert [(b["digest"], b["layers"], sorted(b["refs"])) for b in planned["bundles"]] == [
        (d, "0-3", ["latest", "v1"])]
    done = rm(f"{GLM}@1")
    assert done["removed"] == planned["removed"] and done["bytes"] == planned["bytes"] > 0
    assert {str(cache.model_dir(GLM) / "partial" / d), str(cache.root / "exports" / d),
            str(rotations), str(cache.blob(d))} <= set(done["removed"])
    assert files(cache.root) == {"CACHEDIR.TAG"}        # nothing of it left, for prune either
    assert prune(cache) == [] and verify_cache(cache) == (0, [])
    again = pull(GLM, layers="0-3", fmt="sglang")       # and it comes back as it was
    assert not again.cached and again.export.files["k"].read_bytes() == part.export.files["k"].read_bytes()


def test_a_part_goes_and_the_whole_bundle_of_another_version_stays(registry, glm_bundles):
    for b in glm_bundles:
        registry.publish_dir(b.path)
    whole = pull(f"{GLM}@1", fmt="sglang")
    cache = Cache()
    before = files(cache.root)
    parts = [pull(f"{GLM}@2", layers=spec, fmt=fmt) for spec, fmt in (("0-3", "sglang"),
                                                                        ("10-12", "vllm"))]
    done = rm(f"{GLM}@latest")
    assert {b["layers"] for b in done["bundles"]} == {"0-3", "10-12"}
    assert not any(p.path.exists() or p.export.dir.exists() for p in parts)
    assert cache.refs(GLM) == {"v1": whole.digest}
    assert files(cache.root) == before     # v1's snapshot, meta, export and blobs stay
    assert verify_cache(cache) == (5, []) and prune(cache) == []
    assert pull(f"{GLM}@1", fmt="sglang").cached


def test_the_whole_bundle_and_a_part_of_it_go_together(registry, glm_bundles):
    """Pulled with --layers first, then whole: both hold one digest, and @1 names both."""
    registry.publish_dir(glm_bundles[0].path)
    part = pull(f"{GLM}@1", layers="0-3", fmt="sglang")
    whole = pull(f"{GLM}@1", fmt="sglang")
    assert part.digest == whole.digest and part.path.exists() and whole.path.exists()
    done = rm(f"{GLM}@1")
    assert sorted((b["layers"] or "") for b in done["bundles"]) == ["", "0-3"]
    assert files(Cache().root) == {"CACHEDIR.TAG"}


def test_a_layers_pull_holds_off_cache_rm_from_its_download_to_its_export(registry, glm_bundles,
                                                                          monkeypatch):
    """Paused once the part is in the cache, before its export: `cache rm` used to get in there
    and remove the part, and the export failed on the missing bundle.json."""
    registry.publish_dir(glm_bundles[0].path)
    monkeypatch.setenv("OSCAR_ZOO_LOCK_TIMEOUT", "0.5")
    cache = Cache()
    with pull_paused_after(monkeypatch, "_pull_online", GLM, layers="0-3", fmt="sglang") as seen:
        with pytest.raises(LockTimeout, match="a pull is still running"):
            remove(cache, resolve_removal(cache, [GLM]))
    assert seen["r"].path.exists() and seen["r"].export.files["k"].exists()
    assert rm(GLM)["failed"] == [] and files(cache.root) == {"CACHEDIR.TAG"}


def test_cache_ls_passes_over_a_part_removed_while_it_lists(registry, glm_bundles, monkeypatch):
    """`cache ls` takes no lock: a `cache rm` that removed a part between ls finding it and
    sizing it made ls fail ("No such file or directory"), listing nothing."""
    for b in glm_bundles:
        registry.publish_dir(b.path)
    whole = pull(f"{GLM}@1")
    part = pull(f"{GLM}@2", layers="0-3")
    monkeypatch.setenv("OSCAR_ZOO_LOCK_TIMEOUT", "5")
    real_read_meta = Cache.read_meta
    removed = []

    def read_meta_while_v2_goes(self, name, digest):
        if digest == part.digest and not removed:   # once: the removal reads meta too
            removed.append(None)
            removed[0] = remove(self, resolve_removal(self, [f"{GLM}@2"]))
        return real_read_meta(self, name, digest)

    monkeypatch.setattr(Cache, "read_meta", read_meta_while_v2_goes)
    result = CliRunner().invoke(cli, ["cache", "ls", "--json"])
    assert result.exit_code == 0, result.output
    assert [(r["digest"], r["layers"]) for r in json.loads(result.stdout)["bundles"]] == [
        (whole.digest, None)]
    assert removed[0].failed == [] and not part.path.exists()
