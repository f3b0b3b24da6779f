"""`oscar-zoo pull` and `publish` against the real registry (uvicorn on loopback, SQLite):
versions, aliases, layer ranges, fallbacks, and the registry client's errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from oscar_zoo.zoo.bundle import read, verify_bundle
from oscar_zoo.zoo.cli.main import cli
from oscar_zoo.zoo.cache import Cache
from oscar_zoo.zoo.errors import (InvalidInput, ModelNotFound, OfflineError, RemoteError,
                                  Unauthorized, VersionNotFound)
from oscar_zoo.zoo.pull import pull
from oscar_zoo.zoo.registry_client import RegistryClient
from tests.utils.bundles import make_bundle


def test_pull_from_the_registry_end_to_end(registry, glm_bundles):
    registry.publish_dir(glm_bundles[0].path)
    result = CliRunner().invoke(cli, ["pull", "glm-4.7-fp8", "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["source"] == "registry" and data["version"] == 1
    assert data["digest"] == glm_bundles[0].digest
    snap = read(data["path"])  # verifies hashes, shapes, orthogonality
    for layer in (0, 91):
        np.testing.assert_array_equal(snap.k[layer].rotation, glm_bundles[0].k[layer].rotation)
    torch = pytest.importorskip("torch")
    k = torch.load(data["export"]["files"]["k"], weights_only=True)
    np.testing.assert_array_equal(k["layers"][91]["rotation"].numpy(), glm_bundles[0].k[91].rotation)
    assert data["export"]["recipe"]["env"]["SGLANG_OSCAR_K_CLIP_RATIO"] == "0.96"


def test_versions_aliases_and_hub_ids(registry, glm_bundles):
    for b in glm_bundles:
        registry.publish_dir(b.path)
    assert pull("glm-4.7-fp8").version == 2  # no recommended yet: latest
    with RegistryClient(token=registry.token("bundles:publish")) as client:
        client.set_alias("glm-4.7-fp8", "recommended", 1, reason="validated on GPQA")
    r = pull("zai-org/GLM-4.7-FP8")
    assert (r.version, r.digest) == (1, glm_bundles[0].digest)
    assert pull("glm-4.7-fp8@2").digest == glm_bundles[1].digest
    assert pull("GLM-4.7-FP8@latest").version == 2
    assert pull("glm-4.7-fp8@v1").cached
    refs = Cache().refs("glm-4.7-fp8")
    assert refs["recommended"] == refs["v1"] == glm_bundles[0].digest
    assert refs["latest"] == refs["v2"] == glm_bundles[1].digest


def test_unknown_version_and_model_from_the_registry(registry, glm_bundles):
    registry.publish_dir(glm_bundles[0].path)
    with pytest.raises(VersionNotFound) as e:
        pull("glm-4.7-fp8@9")
    assert "registry" in str(e.value) and "no numbered versions" in str(e.value)
    with pytest.raises(ModelNotFound, match="Did you mean: glm-4.7-fp8"):
        pull("glm-4.7-fp9")


def test_layers_come_as_a_range_from_the_registry(registry, glm_bundles):
    registry.publish_dir(glm_bundles[0].path)
    r = pull("glm-4.7-fp8", layers="0-45", fmt="sglang")
    assert r.layers == list(range(46)) and "partial" in str(r.path)
    torch = pytest.importorskip("torch")
    k = torch.load(r.export.files["k"], weights_only=True)
    assert sorted(k["layers"]) == list(range(46))
    np.testing.assert_array_equal(k["layers"][45]["rotation"].numpy(), glm_bundles[0].k[45].rotation)
    assert not list(r.path.parents[2].glob("snapshots/*"))  # the whole bundle was not fetched
    for f in ("bundle.json", "rotations.safetensors"):  # links of read-only blobs stay read-only
        assert not (r.path / f).stat().st_mode & 0o222
    again = pull("glm-4.7-fp8", layers="0-45", fmt="sglang")
    assert again.cached and again.export.files == r.export.files
    # the whole bundle is not here: say which layers are, not "unset OSCAR_ZOO_OFFLINE" (unset)
    out = CliRunner().invoke(cli, ["export", "glm-4.7-fp8", "--out", str(r.path.parents[5] / "x")])
    assert out.exit_code == 1 and "only layers 0-45 of it are cached" in out.stderr, out.output
    assert "OFFLINE" not in out.stderr


def test_registry_down_falls_back_to_the_hubs(registry, seed_zoo, monkeypatch):
    seed_zoo(("hf",))
    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", "http://127.0.0.1:9")
    r = pull("glm-4.7-fp8")
    assert r.source == "hf" and r.imported
    result = CliRunner().invoke(cli, ["list", "glm-*", "--json"])  # the catalog still answers
    assert result.exit_code == 0, result.output
    assert "cannot reach the registry" in result.stderr
    assert [r["name"] for r in json.loads(result.stdout)] == ["glm-4.7-fp8"]


def test_publish_command(registry, glm_bundles, sandbox):
    bundle = glm_bundles[0].path
    result = CliRunner().invoke(cli, ["publish", str(bundle)])
    assert result.exit_code == 1 and "oscar-zoo login" in result.stderr
    token = registry.token("bundles:publish")
    # a refused token is not stored over nothing (or over a good one): login asks the registry
    bad = CliRunner().invoke(cli, ["login", "--token", "ozk_" + "x" * 43])
    assert bad.exit_code == 1 and "unknown or revoked token" in bad.stderr
    assert "oscar-zoo login" in CliRunner().invoke(cli, ["publish", str(bundle)]).stderr
    good = CliRunner().invoke(cli, ["login", "--token", token])
    assert good.exit_code == 0 and "as token:test (scopes: bundles:publish)" in good.stderr
    assert CliRunner().invoke(cli, ["whoami"]).stdout.startswith("token:test at http://127.0.0.1")
    result = CliRunner().invoke(cli, ["publish", str(bundle), "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["created"] and body["version"] == 1 and body["digest"] == glm_bundles[0].digest
    result = CliRunner().invoke(cli, ["publish", str(bundle)])
    assert "already there as glm-4.7-fp8 v1" in result.stdout
    result = CliRunner().invoke(cli, ["publish", str(glm_bundles[1].path), "--status", "draft"])
    assert "stored as a draft: glm-4.7-fp8 v2 (draft" in result.stdout
    assert pull("glm-4.7-fp8").version == 1  # a draft is not latest


def test_publishing_a_failed_bundle_keeps_it_a_draft_and_says_why(registry, tmp_path):
    """The registry keeps a bundle whose validation failed as a draft unless told otherwise:
    `publish` printed "stored as a draft" with no word of the reason."""
    from tests.api.ui.seeding import make_validated_bundle

    failed = make_validated_bundle(tmp_path / "b", passed=False).path
    assert CliRunner().invoke(cli, ["login", "--token", registry.token("bundles:publish")]).exit_code == 0
    result = CliRunner().invoke(cli, ["publish", str(failed)])
    assert result.exit_code == 0, result.output
    assert "stored as a draft: smollm2-135m v1 (draft" in result.stdout
    assert "validation report failed" in result.stderr and "--status published" in result.stderr


def test_publishing_a_layers_part_is_refused_before_any_upload(registry, glm_bundles, tmp_path):
    """A part verifies against its partial.json: it passed the local check and went up whole,
    to be refused by the registry (or, an export's, published with unchecked bytes)."""
    registry.publish_dir(glm_bundles[0].path)
    exported = tmp_path / "part"
    assert CliRunner().invoke(cli, ["export", str(glm_bundles[0].path), "--format", "safetensors",
                                    "--layers", "0-3", "--out", str(exported)]).exit_code == 0
    cached = pull("glm-4.7-fp8", layers="0-3").path
    assert CliRunner().invoke(cli, ["login", "--token", registry.token("bundles:publish")]).exit_code == 0
    for part in (exported, cached):
        result = CliRunner().invoke(cli, ["publish", str(part), "--name", "glm-4.7-fp8"])
        assert result.exit_code == 1 and "is a --layers part" in result.stderr, result.output
        assert "publish the whole bundle" in result.stderr
    with RegistryClient() as client:    # nothing reached the registry
        assert [v["version"] for v in client.versions("glm-4.7-fp8")] == [1]


def test_a_bad_token_is_unauthorized(registry, glm_bundles):
    with RegistryClient(token="ozk_wrong") as client, pytest.raises(Unauthorized, match="login"):
        client.publish(glm_bundles[0].path)


def test_list_and_show_with_the_registry(registry, glm_bundles):
    registry.publish_dir(glm_bundles[0].path)
    rows = json.loads(CliRunner().invoke(cli, ["ls", "glm-*", "--json"]).stdout)
    glm = next(r for r in rows if r["name"] == "glm-4.7-fp8")
    assert glm["latest"] == 1 and "registry" in glm["sources"] and "rotationzoo" in glm["sources"]
    result = CliRunner().invoke(cli, ["info", "zai-org/GLM-4.7-FP8@1"])
    assert result.exit_code == 0, result.output
    assert "92 of 92 layers" in result.stdout and "v1" in result.stdout
    assert "rotations.safetensors" in result.stdout
    for ref, said in (("7", "no version 7"), ("nightly", "no alias 'nightly'")):
        # the registry lacks it: say so, do not show the model alone
        result = CliRunner().invoke(cli, ["show", f"glm-4.7-fp8@{ref}"])
        assert result.exit_code == 1 and said in result.stderr, result.output
    verify_bundle(glm_bundles[0].path)


def test_show_of_a_version_offline_answers_from_the_cache_or_fails(registry, glm_bundles, monkeypatch):
    registry.publish_dir(glm_bundles[0].path)
    pull("glm-4.7-fp8@1")
    monkeypatch.setenv("OSCAR_ZOO_OFFLINE", "1")
    result = CliRunner().invoke(cli, ["show", "glm-4.7-fp8@1", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["version"]["digest"] == glm_bundles[0].digest
    result = CliRunner().invoke(cli, ["show", "glm-4.7-fp8@7"])
    assert result.exit_code == 1 and "glm-4.7-fp8@7 is not in the cache" in result.stderr, result.output


def test_yanked_version_warns_and_drops_out_of_latest(registry, glm_bundles):
    for b in glm_bundles:
        registry.publish_dir(b.path)
    with RegistryClient(token=registry.token("bundles:publish")) as client:
        client.yank("glm-4.7-fp8", 2, "clip search bug")
    assert pull("glm-4.7-fp8").version == 1
    result = CliRunner().invoke(cli, ["pull", "glm-4.7-fp8@2"])
    assert result.exit_code == 0
    assert "yanked: clip search bug" in result.stderr


def test_offline_layers_are_served_only_when_the_cached_part_holds_them(registry, glm_bundles,
                                                                         monkeypatch):
    registry.publish_dir(glm_bundles[0].path)
    pull("glm-4.7-fp8", layers="0-3")
    monkeypatch.setenv("OSCAR_ZOO_OFFLINE", "1")
    assert pull("glm-4.7-fp8", layers="1-2").layers == [1, 2]
    for spec in ("0-45", "10"):  # a wider range, a layer the part lacks: not cached
        with pytest.raises(OfflineError, match="not in the cache"):
            pull("glm-4.7-fp8", layers=spec)


def test_cache_ls_lists_layers_parts_beside_snapshots(registry, glm_bundles):
    for b in glm_bundles:
        registry.publish_dir(b.path)
    pull("glm-4.7-fp8@1")
    for spec in ("10-12", "0-3"):
        pull("glm-4.7-fp8@2", layers=spec)
    result = CliRunner().invoke(cli, ["cache", "ls", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)["bundles"]
    whole, part = glm_bundles[0].digest, glm_bundles[1].digest
    expected = {(whole, None, ("v1",)), (part, "0-3", ("latest", "v2")), (part, "10-12", ("latest", "v2"))}
    assert {(r["digest"], r["layers"], tuple(r["refs"])) for r in rows} == expected
    assert [r["layers"] for r in rows if r["digest"] == part] == ["0-3", "10-12"]  # by first layer
    for r in rows:
        assert r["model"] == "glm-4.7-fp8" and r["source"] == "registry"
        assert r["version"] == (1 if r["digest"] == whole else 2)
        files = list(Path(r["path"]).iterdir())
        assert "rotations.safetensors" in {f.name for f in files}
        assert r["size"] == sum(f.stat().st_size for f in files)
    size = {r["layers"]: r["size"] for r in rows}
    assert size[None] > 10 * size["0-3"]  # 92 layers against 4
    table = CliRunner().invoke(cli, ["cache", "ls"]).stdout.splitlines()
    assert table[1].split()[:4] == ["MODEL", "REFS", "DIGEST", "LAYERS"]
    assert [line.split()[3] for line in table[2:-1]] == [r["layers"] or "all" for r in rows]
    shown = json.loads(CliRunner().invoke(cli, ["show", "glm-4.7-fp8", "--json"]).stdout)["cache"]
    assert sorted((c["digest"], c["layers"] or "") for c in shown) == sorted(
        (d, layers or "") for d, layers, _ in expected)


def test_show_offline_answers_from_a_layers_part(registry, glm_bundles, monkeypatch):
    registry.publish_dir(glm_bundles[0].path)
    pull("glm-4.7-fp8@1", layers="0-3")
    monkeypatch.setenv("OSCAR_ZOO_OFFLINE", "1")
    result = CliRunner().invoke(cli, ["show", "glm-4.7-fp8@1", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["version"] == {"version": 1, "status": "cached", "digest": glm_bundles[0].digest}
    assert [c["layers"] for c in data["cache"]] == ["0-3"]
    text = CliRunner().invoke(cli, ["show", "glm-4.7-fp8"]).stdout
    assert "layers 0-3" in text


def test_layers_from_the_registry_export_as_safetensors(registry, glm_bundles, tmp_path):
    """The registry's layer file comes without the model card; the export must not need it."""
    registry.publish_dir(glm_bundles[0].path)
    result = CliRunner().invoke(cli, ["pull", "glm-4.7-fp8", "--layers", "0-3", "--format",
                                      "safetensors", "--out", str(tmp_path / "out"), "--json"])
    assert result.exit_code == 0, result.output
    files = json.loads(result.stdout)["export"]["files"]
    assert sorted(files) == ["bundle.json", "partial.json", "rotations.safetensors"]
    from safetensors.numpy import load_file

    tensors = load_file(files["rotations.safetensors"])
    assert {k.split(".")[1] for k in tensors} == {"0", "1", "2", "3"}
    np.testing.assert_array_equal(tensors["k.3.rotation"], glm_bundles[0].k[3].rotation)


def test_an_endpoint_that_is_not_the_registry_is_a_clear_error(seed_zoo, monkeypatch):
    """A web page where the registry's JSON should be (a proxy's portal, a wrong URL)."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse
    from starlette.routing import Route

    from tests.utils.registry_server import serve_app

    seed_zoo(("hf",))
    page = Starlette(routes=[Route("/{path:path}", lambda request: HTMLResponse("<html>sign in</html>"))])
    with serve_app(page) as url:
        monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", url)
        monkeypatch.setenv("OSCAR_ZOO_SOURCES", "registry,hf")
        r = pull("glm-4.7-fp8")  # the hubs still answer
        assert r.source == "hf"
        result = CliRunner().invoke(cli, ["show", "glm-4.7-fp8@1"])
        assert result.exit_code == 1 and "text/html, not JSON" in result.stderr, result.output


@pytest.fixture(scope="module")
def per_head_bundle(tmp_path_factory):
    return make_bundle(tmp_path_factory.mktemp("per-head") / "b", per_head=True)


def test_vllm_of_a_per_head_bundle_is_refused_before_any_rotation_is_fetched(registry, per_head_bundle):
    b = per_head_bundle
    registry.publish_dir(b.path)
    blobs = Cache().blobs
    for layers in (None, "0-3"):  # the whole bundle, and a --layers part
        with pytest.raises(InvalidInput, match="one per KV head.*Use --format sglang") as early:
            pull("smollm2-135m", fmt="vllm", layers=layers)
        assert sorted(p.name for p in blobs.iterdir()) == [b.digest]  # bundle.json, nothing more
    result = CliRunner().invoke(cli, ["pull", "smollm2-135m", "--format", "vllm"])
    assert result.exit_code == 1 and str(early.value) in result.stderr
    assert pull("smollm2-135m", fmt="sglang").fetched_bytes > 0
    with pytest.raises(InvalidInput) as warm:  # cached: export() refuses it, in the same words
        pull("smollm2-135m", fmt="vllm")
    assert str(warm.value) == str(early.value)


def test_vllm_of_a_per_head_bundle_on_a_hub_mirror_fetches_no_rotations(registry, per_head_bundle,
                                                                         hub, monkeypatch):
    from oscar_zoo.registry_db.mirrors import mirror_version

    registry.publish_dir(per_head_bundle.path)
    mirrored = mirror_version(registry.registry, "smollm2-135m", 1, ["hf:oscar-zoo/rotations"])
    assert mirrored[0].status == "done"
    monkeypatch.setenv("OSCAR_ZOO_HF_MIRROR_REPO", "oscar-zoo/rotations")
    monkeypatch.setenv("OSCAR_ZOO_SOURCES", "hf")
    hub.log.clear()
    with pytest.raises(InvalidInput, match="one per KV head"):
        pull("smollm2-135m", fmt="vllm")
    assert hub.requests("GET", "/bundle.json") and not hub.requests("GET", "/rotations.safetensors")
    assert not Cache().has_blob(per_head_bundle.manifest.file("rotations.safetensors").sha256)


def test_a_digest_that_is_not_a_sha256_never_names_a_cache_path(registry, glm_bundles, monkeypatch,
                                                               tmp_path):
    """The digest a registry or mirror announces names snapshots/<digest> and meta/<digest>.json:
    a hostile or broken server's '../..' must be refused before any of them is made."""
    registry.publish_dir(glm_bundles[0].path)
    monkeypatch.setenv("OSCAR_ZOO_SOURCES", "registry")
    real_model = RegistryClient.model
    evil = "../" * 12 + str(tmp_path / "escaped" / "evil").lstrip("/")

    def model_with_a_bad_digest(self, name, **kwargs):
        detail = real_model(self, name, **kwargs)
        for v in detail.get("versions", []):
            v["digest"] = evil
        return detail

    monkeypatch.setattr(RegistryClient, "model", model_with_a_bad_digest)
    with pytest.raises(RemoteError, match="not a sha256 hex digest"):
        pull("glm-4.7-fp8")
    assert not (tmp_path / "escaped").exists()
    assert not any(Cache().root.glob("models/*/refs/*"))


def test_a_snapshot_appears_only_after_its_tensors_are_checked(registry, glm_bundles, monkeypatch):
    """Interrupted during the tensor checks (Ctrl-C here; a kill alike), a pull used to leave a
    published snapshot that every later pull and `verify` trusted unchecked."""
    import oscar_zoo.zoo.bundle as bundle_module

    registry.publish_dir(glm_bundles[0].path)
    monkeypatch.setenv("OSCAR_ZOO_SOURCES", "registry")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(bundle_module, "check_tensors", interrupted)
        with pytest.raises(KeyboardInterrupt):
            pull("glm-4.7-fp8")
    assert Cache().snapshot("glm-4.7-fp8", glm_bundles[0].digest) is None
    assert not list(Cache().root.glob("models/*/snapshots/*"))  # no staging dir left either
    assert pull("glm-4.7-fp8").digest == glm_bundles[0].digest


@pytest.mark.parametrize("first, second", [("0,1,3", "0,2,3"), ("0-10,20-30", "0-20,30")])
def test_two_layer_lists_never_share_a_part_or_an_export(registry, glm_bundles, first, second):
    """Their cache dirs used to be named first-last.count, so the second list was answered with
    the first one's part and export: an engine got layers it did not ask for, and lacked others."""
    torch = pytest.importorskip("torch")
    registry.publish_dir(glm_bundles[0].path)
    for spec in (first, second, first):
        r = pull("glm-4.7-fp8", layers=spec, fmt="sglang")
        want = [i for a, _, b in (p.partition("-") for p in spec.split(","))
                for i in range(int(a), int(b or a) + 1)]
        assert r.layers == want
        k = torch.load(r.export.files["k"], weights_only=True)
        assert sorted(k["layers"]) == want
        part = read(r.path, verify=False)  # the whole bundle's manifest, some of its layers
        assert sorted(part.k) == want
        for layer in (want[0], want[-1]):
            np.testing.assert_array_equal(part.k[layer].rotation, glm_bundles[0].k[layer].rotation)


def test_list_shows_validation_and_the_registry_only_where_it_holds_a_version(registry, tmp_path):
    """`list` said VALIDATED "-" for a version that passed unless --validated was given, and
    named the registry a source of every catalog model, versions or not."""
    from tests.api.ui.seeding import make_validated_bundle

    registry.publish_dir(make_validated_bundle(tmp_path / "b").path)
    rows = {r["name"]: r for r in json.loads(CliRunner().invoke(cli, ["list", "--json"]).stdout)}
    assert rows["smollm2-135m"]["validated"] is True and rows["smollm2-135m"]["latest"] == 1
    assert "registry" not in rows["qwen3-8b"]["sources"] and rows["qwen3-8b"]["validated"] is None
    only = json.loads(CliRunner().invoke(cli, ["list", "--validated", "--json"]).stdout)
    assert [r["name"] for r in only] == ["smollm2-135m"]


def test_show_of_a_version_gives_its_clips_validation_and_yank_reason(registry, tmp_path):
    """`show NAME@V` printed the catalog's clip pair as "serving" and no validation numbers
    or yank reason: the version's own were only on the web UI."""
    from tests.api.ui.seeding import make_validated_bundle

    registry.publish_dir(make_validated_bundle(tmp_path / "b").path)
    with registry.registry.db.write() as s:
        from oscar_zoo.registry_db import queries
        from oscar_zoo.registry_db.publish import yank_version

        yank_version(s, queries.resolve_version(s, queries.resolve_model(s, "smollm2-135m"), 1),
                     "clip search bug", "ops")
    detail = RegistryClient().version("smollm2-135m", 1)
    text = CliRunner().invoke(cli, ["show", "smollm2-135m@1"]).stdout
    clip = detail["manifest"]["clip"]
    assert f"clip         K {clip['k_global']:g} / V {clip['v_global']:g} (searched per" in text
    loss = {r["name"]: r["delta_nll"] for r in detail["validation"]["variants"]}
    # as served beside it: the verdict judges both (a per-layer bundle failing as served only
    # read "FAILED: extra loss +0.04" with no sign why)
    assert (f"validation   passed: extra loss {loss['bundle']:+.4f}, as served "
            f"{loss['bundle-served']:+.4f} nats/token (hadamard") in text
    assert "yanked       clip search bug" in text and "criterion" not in text


def test_show_of_a_failed_version_gives_the_criterion_it_failed(registry, tmp_path):
    from tests.api.ui.seeding import make_validated_bundle

    registry.publish_dir(make_validated_bundle(tmp_path / "b", passed=False).path)
    criterion = RegistryClient().version("smollm2-135m", 1)["validation"]["criterion"]
    text = CliRunner().invoke(cli, ["show", "smollm2-135m@1"]).stdout
    assert "validation   FAILED: extra loss" in text
    assert f"criterion    {criterion}" in text


def test_offline_default_pull_says_when_recommended_is_cached_only_in_part(registry, glm_bundles,
                                                                           monkeypatch):
    """Offline, "recommended, else latest" fell through to a whole @latest without a word when
    @recommended was cached only as a --layers part: the user got another version silently."""
    for b in glm_bundles:
        registry.publish_dir(b.path)
    with RegistryClient(token=registry.token("bundles:publish")) as client:
        client.set_alias("glm-4.7-fp8", "recommended", 1, reason="validated")
    pull("glm-4.7-fp8", layers="0-3")       # recommended (v1), one stage's layers
    pull("glm-4.7-fp8@latest")              # v2, whole
    monkeypatch.setenv("OSCAR_ZOO_OFFLINE", "1")
    r = pull("glm-4.7-fp8")
    assert r.digest == glm_bundles[1].digest
    rec, latest = glm_bundles[0].digest[:12], glm_bundles[1].digest[:12]
    assert any(f"@recommended (sha256:{rec}, only layers 0-3 cached)" in n.text
               and f"@latest (sha256:{latest}) was served instead" in n.text for n in r.notes), r.notes
    result = CliRunner().invoke(cli, ["pull", "glm-4.7-fp8", "-q"])
    assert result.exit_code == 0, result.output
    assert "warning:" in result.stderr and "served instead" in result.stderr
    assert "# WARNING:" in result.stdout and "served instead" in result.stdout
    # the layers the part holds are still served from it, with no such note
    part = pull("glm-4.7-fp8", layers="1-2")
    assert part.digest == glm_bundles[0].digest and not any("instead" in n.text for n in part.notes)


def test_a_missing_version_is_echoed_as_typed_in_one_plain_sentence(registry, glm_bundles):
    registry.publish_dir(glm_bundles[0].path)         # v1 only, aliases latest and recommended
    with RegistryClient(token=registry.token("bundles:publish")) as client:
        client.set_alias("glm-4.7-fp8", "recommended", 1)
    r = CliRunner().invoke(cli, ["pull", "glm-4.7-fp8@3"])
    assert r.exit_code == 1 and "could not pull glm-4.7-fp8@3:" in r.stderr, r.output
    said = ("glm-4.7-fp8 has no version 3; its versions: 1; aliases: latest, recommended; ")
    assert said in r.stderr and "1 to 1" not in r.stderr, r.output
    with pytest.raises(VersionNotFound, match="could not pull glm-4.7-fp8@v3:"):
        pull("glm-4.7-fp8@v3")                        # v3 typed, v3 echoed


def test_a_missing_alias_is_called_an_alias(registry, glm_bundles):
    for b in glm_bundles:
        registry.publish_dir(b.path)
    with pytest.raises(VersionNotFound) as e:
        pull("glm-4.7-fp8@canary")
    assert ("glm-4.7-fp8 has no alias 'canary'; its versions: 1 to 2; aliases: latest;"
            in str(e.value)), e.value
    assert "no version 'canary'" not in str(e.value)


def test_layers_past_the_last_layer_are_refused_not_clamped(registry, glm_bundles):
    registry.publish_dir(glm_bundles[0].path)         # 92 layers: 0-91
    for spec in ("0-99", "90-92", "0-45,80-100"):
        with pytest.raises(InvalidInput, match=r"the model has 92 layers \(0-91\).*--layers out"):
            pull("glm-4.7-fp8", layers=spec, fmt="sglang")
    cache = Cache()
    assert not list(cache.root.glob("exports/*/*")) and not list(cache.root.glob("models/*/partial/*/*"))
    assert pull("glm-4.7-fp8", layers="46-91").layers == list(range(46, 92))  # the last stage
    r = CliRunner().invoke(cli, ["export", "glm-4.7-fp8@v1", "--layers", "0-99", "--format", "sglang",
                                 "--out", str(cache.root.parent / "out")])
    assert r.exit_code == 1 and "the model has 92 layers (0-91)" in r.stderr, r.output


def test_an_alias_the_registry_refused_is_not_answered_by_the_rotationzoo(registry, glm_bundles,
                                                                          seed_zoo):
    """The registry holds glm-4.7-fp8 v1 and no `recommended`; the RotationZoo answers
    @recommended from the catalog with its shipped calibration, and did so here: the user got
    another bundle than any of ours, cached as `recommended`, and never saw the refusal."""
    seed_zoo()
    registry.publish_dir(glm_bundles[0].path)
    with pytest.raises(VersionNotFound) as e:
        pull("glm-4.7-fp8@recommended")
    said = str(e.value)
    assert "not answering @recommended with the RotationZoo's shipped calibration" in said, said
    assert "has no alias 'recommended'" in said.split("not answering")[0], said   # why, first
    assert "recommended" not in Cache().refs("glm-4.7-fp8")
    assert pull("glm-4.7-fp8").version == 1          # the default still falls to latest
    assert pull("glm-4.7-fp8@latest").source == "registry"


def test_an_alias_named_like_a_version_is_not_written_as_a_cache_ref():
    """A registry kept an alias `v3` (on version 4) from before such names were refused: pull
    wrote refs/v3 -> version 4, and an offline `pull NAME@3` served version 4."""
    from oscar_zoo.zoo.sources.registry import _cacheable

    assert _cacheable(["v3", "rotationzoo", "rotationzoo-hf", "recommended", "prod", 7]) == [
        "recommended", "prod"]
