"""What a pull asked for online is what the same pull finds offline (OSCAR_ZOO_OFFLINE or
HF_HUB_OFFLINE), or when no source can be reached: the cache records the ref asked for, as the
Hugging Face cache records refs/<revision>."""

from __future__ import annotations

import pytest

from oscar_zoo.zoo.cache import Cache
from oscar_zoo.zoo.pull import pull

GLM = "glm-4.7-fp8"


@pytest.mark.parametrize("alias", ["latest", "recommended"])
def test_an_alias_the_rotationzoo_answered_is_served_offline(seed_zoo, hub, monkeypatch, alias):
    """The RotationZoo answers @latest and @recommended with its one calibration but recorded
    only the ref `rotationzoo`: offline, the same command said the bundle was not cached."""
    seed_zoo(("hf",))
    monkeypatch.setenv("OSCAR_ZOO_SOURCES", "hf")
    first = pull(f"{GLM}@{alias}", fmt="sglang")
    assert Cache().refs(GLM) == {alias: first.digest, "rotationzoo": first.digest}
    hub.log.clear()
    monkeypatch.setenv("OSCAR_ZOO_OFFLINE", "1")
    again = pull(f"{GLM}@{alias}", fmt="sglang")
    assert again.digest == first.digest and again.export.files == first.export.files
    assert hub.log == []
    monkeypatch.delenv("OSCAR_ZOO_OFFLINE")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")   # nothing listens: unreachable
    down = pull(f"{GLM}@{alias}")
    assert down.digest == first.digest and "no source could be reached" in down.notes[0]


# --- a source down, the others without the model: the cache answers ------------------------------

SMOL = "smollm2-135m"


def _two_versions_pulled(registry, tmp_path):
    """smollm2-135m v1 and v2 in the registry (the RotationZoo has none of it); v2 pulled."""
    from tests.utils.bundles import make_bundle

    for seed in (0, 1):
        registry.publish_dir(make_bundle(tmp_path / f"b{seed}", seed=seed).path)
    first = pull(SMOL)
    assert first.version == 2 and first.source == "registry"
    return first


def test_a_registry_that_refuses_connections_falls_back_to_the_cache(registry, monkeypatch,
                                                                     tmp_path):
    """The user's report: registry down, v2 of smollm2-135m cached, `oscar-zoo pull
    smollm2-135m` exited 1: the RotationZoo sources (hf, modelscope) answer "no rotations for
    smollm2-135m" from the catalog without any network, and a "not found" among the failures
    stopped the fallback to the cache, which only `--source registry` got."""
    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli

    first = _two_versions_pulled(registry, tmp_path)
    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", "http://127.0.0.1:1")    # nothing listens
    result = CliRunner().invoke(cli, ["pull", SMOL])
    assert result.exit_code == 0, result.output
    assert "warning: registry could not be reached (cannot reach the registry" in result.stderr
    assert "using the cached copy" in result.stderr
    r = pull(SMOL)
    assert (r.digest, r.version, r.cached) == (first.digest, 2, True)
    assert r.notes[0].startswith("registry could not be reached"), r.notes
    assert "hf, modelscope have no such bundle" in r.notes[0]
    assert "the RotationZoo has no rotations for smollm2-135m" in r.notes[0]
    assert pull(f"{SMOL}@2").digest == first.digest
    only = CliRunner().invoke(cli, ["pull", SMOL, "--source", "registry"])   # as before
    assert only.exit_code == 0 and "no source could be reached" in only.stderr, only.output


def test_a_registry_down_with_nothing_cached_still_fails(registry, monkeypatch, tmp_path):
    """The fallback serves only what the cache holds: a version never pulled, or a model
    not cached at all, is still an error naming every source's reason."""
    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli
    from oscar_zoo.zoo.errors import OfflineError

    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", "http://127.0.0.1:1")
    with pytest.raises(OfflineError, match="could not pull smollm2-135m: cannot reach the "
                                           "registry.*no rotations for smollm2-135m"):
        pull(SMOL)
    result = CliRunner().invoke(cli, ["pull", SMOL])
    assert result.exit_code == 1 and "cannot reach the registry" in result.stderr, result.output
    assert "using the cached copy" not in result.stderr


def test_a_registry_down_does_not_serve_a_version_the_cache_lacks(registry, monkeypatch, tmp_path):
    from oscar_zoo.zoo.errors import OfflineError

    _two_versions_pulled(registry, tmp_path)
    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", "http://127.0.0.1:1")
    with pytest.raises(OfflineError, match="could not pull smollm2-135m@1: cannot reach") as e:
        pull(f"{SMOL}@1")
    # the pull already asked the cache: it says what is there, and no hint to go offline
    assert "cached refs of smollm2-135m: latest, v2" in str(e.value), e.value
    assert "OSCAR_ZOO_OFFLINE" not in str(e.value).split("; and ")[0], e.value


class _Failing:
    """A source whose plan fails with `error`."""

    def __init__(self, name, error):
        self.name, self.error = name, error

    def plan(self, entry, name, ref):
        raise self.error


class _CatalogFailing(_Failing):
    """Like the RotationZoo: its "not found" comes from the catalog."""

    answers_from_catalog = True


@pytest.mark.parametrize("error, raised", [
    ("IntegrityError", "IntegrityError"),   # a corrupt download
    ("Unauthorized", "Unauthorized"),       # a 401: the token is the user's to fix
    ("Forbidden", "Forbidden"),
])
def test_a_source_down_beside_one_that_failed_otherwise_is_not_hidden_by_the_cache(
        hf_only, monkeypatch, error, raised):
    """Only "not found" from the sources that were reached lets the cache answer: a corrupt
    download or a refused token is an error, even with the bundle cached."""
    from oscar_zoo.zoo import errors
    from oscar_zoo.zoo import pull as pull_mod

    pull(GLM)
    down = errors.OfflineError("cannot reach the registry at http://127.0.0.1:1 (ConnectError)")
    other = getattr(errors, error)(f"hf: {error.lower()} here")
    monkeypatch.setattr(pull_mod, "_sources", lambda names, cache: [
        _Failing("registry", down), _Failing("hf", other)])
    with pytest.raises(getattr(errors, raised), match="could not pull glm-4.7-fp8: cannot reach"):
        pull(GLM)
    # a reached mirror saying the version is gone (yanked, removed) has an opinion too
    monkeypatch.setattr(pull_mod, "_sources", lambda names, cache: [
        _Failing("registry", down), _Failing("hf", errors.VersionNotFound("hf: all versions yanked"))])
    with pytest.raises(errors.OscarZooError, match="all versions yanked"):
        pull(GLM)
    # the same source down beside sources with no opinion (a model they do not know, the
    # RotationZoo's catalog answer): the cached copy, saying which source was down
    monkeypatch.setattr(pull_mod, "_sources", lambda names, cache: [
        _Failing("registry", down), _Failing("hf", errors.ModelNotFound("hf: no such model")),
        _CatalogFailing("modelscope", errors.BundleNotFound("modelscope: none"))])
    r = pull(GLM)
    assert r.cached and r.notes[0] == (
        "registry could not be reached (cannot reach the registry at http://127.0.0.1:1 "
        "(ConnectError)), and hf, modelscope have no such bundle (hf: no such model; "
        "modelscope: none); using the cached copy")


# --- the not-in-cache error lists only refs that still name a cached bundle ---------------------

def test_the_not_cached_error_lists_only_refs_whose_bundle_is_cached(registry, glm_bundles,
                                                                     monkeypatch):
    """A ref left naming a snapshot that is gone (a verify repair of an older oscar-zoo) was
    listed as cached: "cached refs of ...: latest, recommended, v1" for nothing cached."""
    from oscar_zoo.zoo.errors import OfflineError

    registry.publish_dir(glm_bundles[0].path)
    registry.publish_dir(glm_bundles[1].path)
    pull(f"{GLM}@1", layers="0-3")                     # v1: only a --layers part
    whole = pull(f"{GLM}@2")                           # v2: whole
    cache = Cache()
    gone = "f" * 64                                    # a ref to a bundle no longer cached
    cache.write_ref(GLM, "recommended", gone)
    monkeypatch.setenv("OSCAR_ZOO_OFFLINE", "1")
    with pytest.raises(OfflineError) as e:
        pull(f"{GLM}@recommended")
    assert f"cached refs of {GLM}: latest, v1 (only layers 0-3), v2." in str(e.value), e.value
    assert "recommended" not in str(e.value).split("cached refs of")[1].split(". To fix")[0]
    # only dangling refs left: nothing is cached, and the error says so
    for ref, digest in cache.refs(GLM).items():
        cache.write_ref(GLM, ref, gone)
    with pytest.raises(OfflineError, match=f"{GLM} is not cached at all"):
        pull(f"{GLM}@recommended")
    assert whole.path.exists()
