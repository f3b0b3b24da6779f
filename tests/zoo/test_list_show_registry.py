"""`oscar-zoo list` and `show` against a registry: one failing on its side (a 5xx or 429 behind
a proxy) is told and done without, as an unreachable one is, rather than end the command; a
server that is no registry is named as the likely cause of a 404 of the API's listing; models
holding only drafts or yanked versions are listed, saying so; and `show` of a model only the
registry knows prints its hub id and geometry."""

from __future__ import annotations

import http.server
import json
import threading
from contextlib import contextmanager

import pytest
from click.testing import CliRunner

from oscar_zoo.zoo.bundle import Bundle, write
from oscar_zoo.zoo.cli.main import cli
from oscar_zoo.zoo.geometry import ModelGeometry
from oscar_zoo.zoo.manifest import Geometry, ModelRef
from tests.utils.bundles import make_bundle, make_manifest, make_tensors
from tests.zoo.test_pull_offline import _in_front_of


def zoo(*args):
    return CliRunner().invoke(cli, list(args))


def registry_only_bundle(out, name: str, hub_id: str, seed: int = 0):
    manifest = make_manifest("smollm2-135m", seed=seed).model_copy(update={
        "model": ModelRef(name=name, hub_id=hub_id, architecture="LlamaForCausalLM"),
        "geometry": Geometry.of(ModelGeometry(4, 4, 2, 64))})
    return write(Bundle(manifest, *make_tensors(manifest, seed)), out)


# --- a registry failing on its side ------------------------------------------------------------

@pytest.mark.parametrize("status", [502, 503, 429])
def test_list_and_show_carry_on_without_a_registry_failing_on_its_side(registry, monkeypatch,
                                                                      tmp_path, status):
    """They ended with `Error: registry ...: 502 Bad Gateway`, while pull used the cache and an
    unreachable registry got a warning."""
    registry.publish_dir(make_bundle(tmp_path / "smol").path)
    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", "0")
    with _in_front_of(registry.url, r"^/v1/", status) as url:
        monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", url)
        listed = zoo("list", "glm-*", "--json")
        shown = zoo("show", "glm-4.7-fp8")
        version = zoo("show", "glm-4.7-fp8@1")
        unknown = zoo("show", "tiny-model")         # the registry might hold it: not "unknown"
    assert unknown.exit_code == 1 and "unknown model" not in unknown.stderr, unknown.output
    assert "did not answer, which may hold it" in unknown.stderr
    assert listed.exit_code == 0, listed.output
    assert [r["name"] for r in json.loads(listed.stdout)] == ["glm-4.7-fp8"]   # the catalog's
    assert f"warning: registry {url}: {status}" in listed.stderr
    assert f"the registry failed on its side: HTTP {status}" in listed.stderr
    assert "this list holds only the RotationZoo's models and the local cache" in listed.stderr
    assert shown.exit_code == 0, shown.output
    assert "zai-org/GLM-4.7-FP8" in shown.stdout and f"HTTP {status}" in shown.stderr
    # the version: from the cache, which does not hold it; said as such, not as a 5xx
    assert version.exit_code == 1 and "not in the cache, and no registry answered" in version.stderr


def test_list_still_fails_on_a_registry_refusing_the_request(registry, monkeypatch, tmp_path):
    """A 4xx is the registry's answer, for the user to see (as pull does not hide it)."""
    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", "0")
    with _in_front_of(registry.url, r"^/v1/", 400) as url:
        monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", url)
        listed = zoo("list")
    assert listed.exit_code == 1 and "400" in listed.stderr, listed.output


# --- an endpoint that is no registry -----------------------------------------------------------

@contextmanager
def _file_server(root):
    """`python -m http.server` in a thread, serving an empty directory."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *args):
            super().__init__(*args, directory=str(root))

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_404_of_the_listing_says_the_endpoint_may_be_no_registry(monkeypatch, tmp_path):
    (tmp_path / "www").mkdir()
    with _file_server(tmp_path / "www") as url:
        monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", url)
        listed = zoo("list")
        shown = zoo("show", "acme-model")       # a model's 404: as it was
    assert listed.exit_code == 1, listed.output
    assert (f"Error: registry {url}: 404 File not found; every oscar-zoo registry serves "
            f"/v1/models, so OSCAR_ZOO_ENDPOINT ({url}) may not point at one: set it to the "
            "registry's base URL (e.g. http://127.0.0.1:8000, without /v1)") in listed.stderr
    assert shown.exit_code == 1 and "404 File not found" in shown.stderr
    assert "may not point at" not in shown.stderr


# --- models with no published version ----------------------------------------------------------

@pytest.fixture
def unpublished(registry, tmp_path, monkeypatch):
    """draft-model: one draft; gone-model: one version, yanked; mixed-model: a draft and a
    yanked version; tiny-model: published."""
    for name in ("draft-model", "gone-model", "mixed-model", "tiny-model"):
        hub_id = f"myorg/{name.title()}"
        registry.publish_dir(registry_only_bundle(tmp_path / name, name, hub_id).path,
                             status="draft" if name == "draft-model" else None)
    registry.publish_dir(registry_only_bundle(tmp_path / "mixed2", "mixed-model",
                                              "myorg/Mixed-Model", seed=1).path, status="draft")
    monkeypatch.setenv("OSCAR_ZOO_TOKEN", registry.token("bundles:publish"))
    for name in ("gone-model", "mixed-model"):
        r = zoo("yank", f"{name}@1", "--reason", "bad clips")
        assert r.exit_code == 0, r.output
    return registry


def test_list_shows_models_with_only_drafts_or_yanked_versions(unpublished):
    """They were left out ("no models match"; --json []), while the API, the UI and show list
    them."""
    r = zoo("list", "*-model", "--json")
    assert r.exit_code == 0, r.output
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert {n: (rows[n]["state"], rows[n]["sources"], rows[n]["latest"]) for n in rows} == {
        "draft-model": ("drafts only", ["registry"], None),
        "gone-model": ("all yanked", ["registry"], None),
        "mixed-model": ("drafts and yanked only", ["registry"], None),
        "tiny-model": ("published", ["registry"], 1)}
    text = zoo("list", "draft-*")
    assert text.exit_code == 0 and "registry (drafts only)" in text.stdout, text.output
    assert "registry (all yanked)" in zoo("list", "gone-model").stdout
    # --validated: a model with no published version has no verdict a bare pull gets
    assert json.loads(zoo("list", "*-model", "--validated", "--json").stdout) == []


# --- show of a model only the registry knows ---------------------------------------------------

def test_show_prints_hub_id_and_geometry_of_a_registry_only_model(unpublished):
    r = zoo("show", "tiny-model")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0] == "tiny-model"
    assert lines[1] == "  hub id       myorg/Tiny-Model (LlamaForCausalLM)"
    assert lines[2] == "  geometry     4 of 4 layers with a KV cache, 4 q / 2 KV heads, head_dim 64"
    assert lines[3].startswith("  registry     1 version(s)")


def test_a_404_for_a_model_named_like_an_api_path_is_not_blamed_on_the_endpoint(registry):
    """`pull v1` (404 at /v1/models/v1) was told the endpoint may not be a registry."""
    from oscar_zoo.zoo.errors import ModelNotFound
    from oscar_zoo.zoo.registry_client import RegistryClient

    with RegistryClient() as client, pytest.raises(ModelNotFound) as e:
        client.model("v1")
    assert "may not point at one" not in str(e.value), str(e.value)
