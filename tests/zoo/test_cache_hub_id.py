"""A model only the registry knows (not in the catalog), pulled by its hub id, is cached under
the registry's name for it (tiny-model). Offline, or with the registry unreachable, the same hub
id found nothing ("unknown model", "not cached at all"), nor did show, export, verify or
cache rm: the cache now answers a hub id (and `org--repo`, in any case) of a model it holds,
from the hub id in its cached bundles' manifests."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from oscar_zoo.zoo.bundle import Bundle, write
from oscar_zoo.zoo.cache import Cache
from oscar_zoo.zoo.cli.main import cli
from oscar_zoo.zoo.geometry import ModelGeometry
from oscar_zoo.zoo.manifest import Geometry, ModelRef
from oscar_zoo.zoo.pull import pull
from tests.utils.bundles import make_manifest, make_tensors

NAME, HUB_ID = "tiny-model", "myorg/Tiny-Model"


def zoo(*args):
    return CliRunner().invoke(cli, list(args))


def tiny_bundle(out, seed: int = 0):
    manifest = make_manifest("smollm2-135m", seed=seed).model_copy(update={
        "model": ModelRef(name=NAME, hub_id=HUB_ID, architecture="LlamaForCausalLM"),
        "geometry": Geometry.of(ModelGeometry(4, 4, 2, 64))})
    return write(Bundle(manifest, *make_tensors(manifest, seed)), out)


@pytest.fixture
def pulled_tiny(registry, tmp_path):
    """tiny-model v1 published and pulled by its hub id, online."""
    registry.publish_dir(tiny_bundle(tmp_path / "tiny").path)
    result = pull(HUB_ID, progress=False)
    assert (result.model, result.version) == (NAME, 1)
    assert [p.name for p in (Cache().root / "models").iterdir()] == [NAME]
    return result


@pytest.mark.parametrize("spec", [HUB_ID, "MYORG/tiny-model", "myorg--Tiny-Model",
                                  f"{HUB_ID}@1", f"{HUB_ID}@latest"])
def test_offline_pull_finds_a_registry_only_model_by_its_hub_id(pulled_tiny, monkeypatch, spec):
    monkeypatch.setenv("OSCAR_ZOO_OFFLINE", "1")
    r = pull(spec, progress=False)
    assert (r.model, r.digest, r.version) == (NAME, pulled_tiny.digest, 1)


def test_an_unreachable_registry_falls_back_to_the_copy_cached_by_hub_id(pulled_tiny, monkeypatch):
    from tests.utils.registry_server import free_socket

    with free_socket() as s:
        port = s.getsockname()[1]
    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("OSCAR_ZOO_SOURCES", "registry")
    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", "0")
    r = zoo("pull", HUB_ID, "--format", "safetensors")
    assert r.exit_code == 0, r.output
    assert "using the cached copy" in r.stderr and "not cached at all" not in r.stderr


def test_show_export_verify_and_cache_rm_take_the_hub_id_offline(pulled_tiny, monkeypatch,
                                                                  tmp_path):
    monkeypatch.setenv("OSCAR_ZOO_OFFLINE", "1")
    r = zoo("show", HUB_ID.lower(), "--json")
    assert r.exit_code == 0, r.output
    shown = json.loads(r.stdout)
    assert shown["name"] == NAME and [c["digest"] for c in shown["cache"]] == [pulled_tiny.digest]

    r = zoo("export", f"{HUB_ID}@1", "--format", "safetensors", "--out", str(tmp_path / "out"))
    assert r.exit_code == 0, r.output

    r = zoo("verify", HUB_ID)
    assert r.exit_code == 0 and "all checksums match" in r.stdout, r.output

    r = zoo("cache", "rm", "myorg--tiny-model@1", "--dry-run", "--json")
    assert r.exit_code == 0, r.output
    assert [b["digest"] for b in json.loads(r.stdout)["bundles"]] == [pulled_tiny.digest]
    r = zoo("cache", "rm", HUB_ID, "--yes")
    assert r.exit_code == 0, r.output
    assert not (Cache().root / "models" / NAME).exists()


def test_a_hub_id_no_cached_model_has_is_still_unknown(pulled_tiny, monkeypatch):
    monkeypatch.setenv("OSCAR_ZOO_OFFLINE", "1")
    r = zoo("pull", "myorg/Other-Model")
    assert r.exit_code == 1 and "unknown model 'myorg/Other-Model'" in r.stderr, r.output
