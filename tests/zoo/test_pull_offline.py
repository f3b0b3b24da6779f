"""What a pull asked for online is what the same pull finds offline (OSCAR_ZOO_OFFLINE or
HF_HUB_OFFLINE), or when no source can be reached: the cache records the ref asked for, as the
Hugging Face cache records refs/<revision>."""

from __future__ import annotations

from contextlib import contextmanager

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
    assert down.digest == first.digest and "no source could be reached" in down.notes[0].text


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
    assert r.notes[0].text.startswith("registry could not be reached"), r.notes
    assert "hf, modelscope have no such bundle" in r.notes[0].text
    assert "the RotationZoo has no rotations for smollm2-135m" in r.notes[0].text
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


# --- a registry that answers an error: 5xx is its failure (the cache stands in), 4xx its answer ---

@contextmanager
def _in_front_of(upstream: str, fail: str, status: int):
    """A proxy on loopback in front of the registry, as a load balancer: requests whose path
    matches `fail` get `status` and a plain-text page, the rest are passed through."""
    import re

    import httpx
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse, Response
    from starlette.routing import Route

    from tests.utils.registry_server import serve_app

    def forward(request):
        if re.search(fail, request.url.path):
            return PlainTextResponse(f"the load balancer says {status}", status_code=status)
        r = httpx.get(upstream + request.url.path, params=request.query_params,
                      follow_redirects=True)
        return Response(r.content, r.status_code,
                        media_type=r.headers.get("content-type", "application/octet-stream"))

    with serve_app(Starlette(routes=[Route("/{path:path}", forward)])) as url:
        yield url


def _phrase(status: int) -> str:
    from http import HTTPStatus

    return f"{status} {HTTPStatus(status).phrase}"


@pytest.mark.parametrize("status", [500, 502, 503, 504, 429])
def test_a_registry_failing_on_its_side_falls_back_to_the_cache_naming_the_status(
        registry, monkeypatch, tmp_path, status):
    """A 5xx was told as "registry could not be reached", although it was: the warning says
    which registry answered which status, and that the cached copy was used instead."""
    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli

    first = _two_versions_pulled(registry, tmp_path)
    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", "0")
    with _in_front_of(registry.url, r"^/v1/", status) as url:
        monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", url)
        r = pull(SMOL)
        assert (r.digest, r.version, r.cached) == (first.digest, 2, True)
        assert r.notes[0].text == (
            f"registry {url} was reached but answered HTTP {status} ({_phrase(status)}), and "
            "hf, modelscope have no such bundle (hf:Zhongzhu/OSCAR-RotationZoo: the "
            "RotationZoo has no rotations for smollm2-135m; modelscope:togethercomputer/"
            "OSCAR-RotationZoo: the RotationZoo has no rotations for smollm2-135m); using the "
            "cached copy"), r.notes
        told = CliRunner().invoke(cli, ["pull", SMOL])
    assert told.exit_code == 0, told.output
    assert f"warning: registry {url} was reached but answered HTTP {status}" in told.stderr
    assert "# WARNING" not in told.stdout     # a passing outage is no part of the recipe


def test_a_page_where_the_registrys_json_should_be_falls_back_saying_so(registry, monkeypatch,
                                                                        tmp_path):
    """A login portal answering 200 with a page: reached, but no answer (no status to name)."""
    first = _two_versions_pulled(registry, tmp_path)
    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", "0")
    with _in_front_of(registry.url, r"^/v1/", 200) as url:
        monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", url)
        r = pull(SMOL)
    assert (r.digest, r.cached) == (first.digest, True)
    assert r.notes[0].text.startswith(
        f"registry {url} was reached but gave no usable answer (/v1/models/smollm2-135m "
        "answered 200 with text/plain, not JSON"), r.notes


def test_files_failing_on_the_registrys_side_fall_back_too_naming_the_registry(
        registry, monkeypatch, tmp_path):
    """The metadata answers, the bundle's files get 503: the file error names only the
    source ("bundle.json from registry"), the warning which registry it was."""
    from tests.utils.bundles import make_bundle

    first = _two_versions_pulled(registry, tmp_path)
    registry.publish_dir(make_bundle(tmp_path / "b2", seed=2).path)    # v3: latest, not cached
    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", "0")
    with _in_front_of(registry.url, r"/files/", 503) as url:
        monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", url)
        r = pull(SMOL)
    assert (r.digest, r.version, r.cached) == (first.digest, 2, True)
    assert r.notes[0].text.startswith(f"registry {url} was reached but answered HTTP 503 "
                                 "(bundle.json from registry: 503 Service Unavailable"), r.notes


@pytest.mark.parametrize("fail, status", [(r"^/v1/", 400), (r"^/v1/", 422), (r"/files/", 410),
                                          (r"/files/", 400)])
def test_a_registry_refusing_the_request_does_not_fall_back_to_the_cache(
        registry, monkeypatch, tmp_path, fail, status):
    """A 4xx other than 408 / 429 is the registry's answer to this request (a bad request, a
    file gone): a cached copy served instead would hide it."""
    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli
    from oscar_zoo.zoo.errors import OscarZooError
    from tests.utils.bundles import make_bundle

    _two_versions_pulled(registry, tmp_path)
    registry.publish_dir(make_bundle(tmp_path / "b2", seed=2).path)    # v3: latest, not cached
    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", "0")
    with _in_front_of(registry.url, fail, status) as url:
        monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", url)
        with pytest.raises(OscarZooError, match=_phrase(status)):
            pull(SMOL)
        told = CliRunner().invoke(cli, ["pull", SMOL])
    assert told.exit_code == 1 and _phrase(status) in told.stderr, told.output
    assert "cached copy" not in told.stderr


@pytest.mark.parametrize("status, falls_back", [(503, True), (429, True), (400, False)])
def test_a_hub_answering_an_error_falls_back_only_on_its_failure(hf_only, hub, monkeypatch,
                                                                 status, falls_back):
    from oscar_zoo.zoo.errors import RemoteError

    first = pull(GLM)
    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", "0")
    hub.fail("HEAD", r"/resolve/", status=404)      # no quick HEAD listing: ask the API
    hub.fail("GET", r"^/api/models/", status=status)
    if not falls_back:
        with pytest.raises(RemoteError, match=f"{status} from the hub"):
            pull(GLM)
        return
    r = pull(GLM)
    assert r.digest == first.digest and r.cached
    assert r.notes[0].text.startswith(f"hf was reached but answered HTTP {status} "
                                 f"(hf:Zhongzhu/OSCAR-RotationZoo@main: {status} from the hub"), r.notes


def test_the_sources_reasons_join_without_a_stray_full_stop(monkeypatch):
    """The RotationZoo's reasons end a sentence: joined with "; " they showed ".;"."""
    from oscar_zoo.zoo.errors import OfflineError

    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", "http://127.0.0.1:1")      # nothing listens
    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", "0")
    with pytest.raises(OfflineError) as e:
        pull(f"{GLM}@3")
    told = str(e.value)
    assert "or our mirrors; modelscope:" in told and "or our mirrors; and " in told, told
    assert ".;" not in told, told


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
    assert r.cached and r.notes[0].text == (
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
