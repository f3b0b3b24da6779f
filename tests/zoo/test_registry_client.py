"""RegistryClient (zoo/registry_client.py): how a registry out of disk space (507) is told to
the client, StorageFull crossing a process boundary, and which unreachable reads suggest
OSCAR_ZOO_OFFLINE=1 (those the cache holds the answer to)."""

from __future__ import annotations

import errno
import pickle

import httpx
import pytest

from oscar_zoo.zoo.errors import (RemoteError, RemoteStorageFull, StorageFull, is_no_space,
                                  is_transient)
from oscar_zoo.zoo.registry_client import RegistryClient
from tests.utils.bundles import make_bundle


def test_a_registry_out_of_disk_space_is_storage_full_with_its_message_and_not_transient(
        tmp_path, monkeypatch):
    """A 507 was a plain RemoteError without a status, which is_transient takes for a damaged
    read: worth sending again. The registry's blob store is simulated full (a real full disk
    cannot be made in a test run in general: tests/utils/full_disk.py)."""
    from tests.utils.databases import fresh_database
    from tests.utils.full_disk import full_disk
    from tests.utils.registry_server import run_registry

    bundle = make_bundle(tmp_path / "b")
    with fresh_database("sqlite", tmp_path) as url, run_registry(url, tmp_path / "reg") as server, \
            RegistryClient(server.url, server.token("bundles:publish")) as client:
        with full_disk(monkeypatch, server.registry.blobs.root), \
                pytest.raises(StorageFull) as caught:
            client.publish(bundle.path)
        e = caught.value
        assert str(e).startswith(f"registry {server.url}: out of disk space in the registry's "
                                 "blob store (No space left on device) while storing a bundle "
                                 "file"), str(e)
        assert "the registry's operator frees space" in str(e)
        assert not is_transient(e) and e.status == 507
        # still a RemoteError, which what holds a job's lease waits out (a worker's heartbeats)
        assert isinstance(e, RemoteError)
        # the registry's disk is not ours: nothing here takes it for the local one
        assert e.errno is None and not is_no_space(e)
        assert client.publish(bundle.path)[1]       # room made: it goes through


def _answering(status: int, asked: list) -> RegistryClient:
    def answer(request):
        asked.append(request.url.path)
        return httpx.Response(status, json={"type": "about:blank", "title": "t", "status": status,
                                             "detail": "out of disk space in the registry's "
                                                       "database (database or disk is full)"})

    client = RegistryClient("http://registry.test")
    client._http = httpx.Client(base_url=client.endpoint, transport=httpx.MockTransport(answer))
    return client


def test_a_read_answered_507_is_not_asked_again_a_503_is(monkeypatch):
    """request() retried reads on any 5xx: a full disk stays full, and each try waited longer."""
    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", "2")
    asked: list = []
    with _answering(507, asked) as client, pytest.raises(RemoteStorageFull, match="database"):
        client.model("smollm2-135m")
    assert len(asked) == 1
    asked.clear()
    with _answering(503, asked) as client, pytest.raises(RemoteError) as caught:
        client.model("smollm2-135m")
    assert len(asked) == 3 and caught.value.status == 503 and is_transient(caught.value)


@pytest.mark.parametrize("error", [
    StorageFull("out of disk space in --out /o (No space left on device)", errno.ENOSPC, "/o"),
    StorageFull("out of disk space (Disk quota exceeded)", errno.EDQUOT),
    RemoteStorageFull("registry http://r: out of disk space in the registry's blob store")])
def test_storage_full_keeps_its_errno_and_path_through_pickle(error):
    """A StorageFull crosses process boundaries (a Ray task's exception, a child process):
    pickled as an OSError, it came back with errno None."""
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is type(error) and str(back) == str(error)
    assert (back.errno, back.path) == (error.errno, error.path)
    assert getattr(back, "status", None) == getattr(error, "status", None)


# --- "set OSCAR_ZOO_OFFLINE=1": only where the cache holds the answer to that read --------------

HINT = "set OSCAR_ZOO_OFFLINE=1 to read only the local cache"
DEAD = "http://127.0.0.1:9"     # the discard port: nothing listens there


def _hint_of(read) -> bool:
    from oscar_zoo.zoo.errors import OfflineError

    with pytest.raises(OfflineError, match="cannot reach the registry") as e:
        read()
    return HINT in str(e.value)


def _cache(model: str, digest: str, *refs: str) -> None:
    from oscar_zoo.zoo.cache import Cache

    cache = Cache()
    cache.snapshot_dir(model, digest).mkdir(parents=True)
    for ref in refs:
        cache.write_ref(model, ref, digest)


def test_the_offline_hint_is_for_the_model_asked_for(monkeypatch):
    """It was said whenever the cache held any bundle: with only another model cached, offline
    mode would fail the same read again."""
    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", "0")
    client = RegistryClient(DEAD)
    assert not _hint_of(lambda: client.model("smollm2-135m"))          # nothing cached
    _cache("glm-4.7-fp8", "a" * 64, "v1", "latest")
    assert not _hint_of(lambda: client.model("smollm2-135m"))          # another model cached
    assert not _hint_of(lambda: list(client.versions("smollm2-135m")))
    assert _hint_of(lambda: client.model("glm-4.7-fp8"))
    assert _hint_of(lambda: client.model("zai-org/GLM-4.7-FP8"))      # its hub id: one model
    assert _hint_of(lambda: list(client.versions("glm-4.7-fp8")))
    # a caller that falls back to the cache by itself (pull) asks for none
    assert not _hint_of(lambda: client.model("glm-4.7-fp8", cache_hint=False))


def test_the_offline_hint_for_a_version_is_for_that_version(monkeypatch):
    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", "0")
    client = RegistryClient(DEAD)
    from oscar_zoo.zoo.cache import Cache

    _cache("smollm2-135m", "b" * 64, "v2", "latest")
    Cache().write_ref("smollm2-135m", "v1", "c" * 64)   # a ref whose bundle is gone: serves nothing
    assert _hint_of(lambda: client.version("smollm2-135m", 2))
    assert _hint_of(lambda: client.version("smollm2-135m", "latest"))
    assert _hint_of(lambda: client.version("smollm2", "2"))            # an alias of the model
    assert not _hint_of(lambda: client.version("smollm2-135m", 1))
    assert not _hint_of(lambda: client.version("smollm2-135m", 3))
    assert not _hint_of(lambda: client.version("smollm2-135m", "recommended"))
    assert not _hint_of(lambda: client.version("smollm2-135m", 2, cache_hint=False))


def test_the_offline_hint_for_a_listing_is_for_what_offline_list_would_show(monkeypatch):
    """Offline, `list` shows the catalog's models with what the cache holds of them, and
    nothing for --validated (validation comes from the registry alone)."""
    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", "0")
    client = RegistryClient(DEAD)
    assert not _hint_of(lambda: list(client.models()))
    _cache("glm-4.7-fp8", "a" * 64, "latest")
    assert _hint_of(lambda: list(client.models()))
    assert _hint_of(lambda: list(client.models(q="glm-*")))
    assert _hint_of(lambda: list(client.models(q="zai-org/*")))          # by hub id, as list
    assert not _hint_of(lambda: list(client.models(q="qwen3-*")))
    assert not _hint_of(lambda: list(client.models(published=True)))


def test_reads_only_the_registry_answers_never_suggest_the_cache(monkeypatch):
    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", "0")
    _cache("smollm2-135m", "b" * 64, "v1", "latest")
    client = RegistryClient(DEAD)
    assert not _hint_of(lambda: client.aliases("smollm2-135m"))
    assert not _hint_of(lambda: client.mirrors("smollm2-135m", 1))
    assert not _hint_of(client.whoami)


# --- a 401, told once, without sending a remote registry's user to `tokens create` here ---------

def _refusing(detail: str, token: str | None, asked: list | None = None) -> RegistryClient:
    """A client whose registry answers every request 401 with `detail`, as the API does."""
    def answer(request):
        if asked is not None:
            asked.append(request.url.path)
        return httpx.Response(401, json={"type": "about:blank", "title": "Unauthorized",
                                         "status": 401, "detail": detail})

    client = RegistryClient("http://registry.test", token)
    client._http = httpx.Client(base_url=client.endpoint, transport=httpx.MockTransport(answer))
    return client


NO_TOKEN = ("this endpoint needs a token: send 'Authorization: Bearer ozk_...' (create one with "
            "`oscar-zoo tokens create --scope ...`)")
REVOKED = "unknown or revoked token; create a new one with `oscar-zoo tokens create`"


def test_a_401_without_a_token_says_what_to_do_once():
    """The registry's advice (send an Authorization header, create a token) and the client's
    (run login) were both printed: the same thing twice, in two vocabularies."""
    from oscar_zoo.zoo.errors import Unauthorized

    with _refusing(NO_TOKEN, token=None) as client, pytest.raises(Unauthorized) as e:
        client.whoami()
    said = str(e.value)
    assert said.startswith("registry http://registry.test: this needs a token; "), said
    assert "Authorization" not in said and "send" not in said
    assert said.count("needs a token") == 1 and said.count("oscar-zoo login") == 1
    assert said.count("tokens create") == 1 and "on its host" in said


@pytest.mark.parametrize("from_env", [False, True])
def test_a_refused_token_is_not_sent_to_make_a_new_one_on_this_host(monkeypatch, from_env):
    """`unknown or revoked token; create a new one with oscar-zoo tokens create`: run on a
    client's host, that made a token in the client's own database, which the registry refused
    again."""
    from oscar_zoo.zoo.errors import Unauthorized

    token = "ozk_" + "B" * 43
    if from_env:
        monkeypatch.setenv("OSCAR_ZOO_TOKEN", token)
    with _refusing(REVOKED, token) as client, pytest.raises(Unauthorized) as e:
        client.whoami()
    said = str(e.value)
    assert said.startswith("registry http://registry.test: unknown or revoked token; "), said
    assert "create a new one" not in said and said.count("tokens create") == 1
    assert "created on its host, by its admin" in said
    fix = "token in OSCAR_ZOO_TOKEN was refused" if from_env else "run `oscar-zoo login` again"
    assert said.count(fix) == 1 and token not in said


def test_a_refusal_keeps_the_registrys_reason():
    from oscar_zoo.zoo.errors import Unauthorized

    expired = ("this token expired at 2026-01-01T00:00:00+00:00; create a new one with "
               "`oscar-zoo tokens create --scope ... --expires-in 90d` (or ask the registry's "
               "admin for one)")
    with _refusing(expired, "ozk_" + "C" * 43) as client, pytest.raises(Unauthorized) as e:
        client.whoami()
    assert "this token expired at 2026-01-01T00:00:00+00:00; run `oscar-zoo login` again" \
        in str(e.value)
    assert "--expires-in" not in str(e.value)


def test_a_403_for_anything_but_a_scope_keeps_the_registrys_reason():
    """Only a refusal naming `required_scope` is told as a scope to ask for: another token's
    job, a path outside the job dirs, say why in their detail."""
    from oscar_zoo.zoo.errors import Forbidden

    detail = ("job 1234 was submitted by token:owner (id 1); cancel it with that token or an "
              "admin token")

    def answer(request):
        return httpx.Response(403, json={"type": "about:blank", "title": "Forbidden",
                                         "status": 403, "detail": detail})

    client = RegistryClient("http://registry.test", "ozk_" + "D" * 43)
    client._http = httpx.Client(base_url=client.endpoint, transport=httpx.MockTransport(answer))
    with client, pytest.raises(Forbidden) as e:
        client.whoami()
    assert str(e.value) == f"registry http://registry.test: {detail}"


# --- names are checked before a URL is built from them -------------------------------------------

BAD_NAMES = ["../../etc/passwd", "../x", "a/../b", "..", "x/y/z", "a b", "a/..", "/x", ""]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_a_model_name_no_registry_can_hold_is_refused_before_any_request(name):
    """httpx resolves dot segments: `../../x` left the model routes for another endpoint, whose
    answer ("no endpoint at /x", a 405, the upload size limit) said nothing of the name. A
    ModelNotFound, as the registry's answer would be: pull then tries its other sources."""
    from oscar_zoo.zoo.errors import ModelNotFound

    asked: list = []
    with _refusing(NO_TOKEN, None, asked) as client:
        for read in (lambda: client.model(name), lambda: client.version(name, 1),
                     lambda: list(client.versions(name)), lambda: client.aliases(name),
                     lambda: client.set_alias(name, "prod", 1),
                     lambda: client.yank(name, 1, "why")):
            with pytest.raises(ModelNotFound) as e:
                read()
            assert f"model name {name.strip()!r} is not valid" in str(e.value)
            assert "hub id ORG/REPO" in str(e.value)
    assert asked == []


@pytest.mark.parametrize("name", ["glm-4.7-fp8", "GLM-4.7-FP8", "zai-org/GLM-4.7-FP8",
                                  "zai-org--GLM-4.7-FP8", "smollm2", "Qwen/Qwen3-8B",
                                  "o" * 90 + "--" + "r" * 90])
def test_the_names_the_registry_resolves_pass(name):
    """Catalog names, their aliases and hub ids, in any case, and `org--repo` (longer than a
    plain name may be: it names a hub id)."""
    from oscar_zoo.zoo.catalog import CATALOG

    asked: list = []
    with _refusing(NO_TOKEN, None, asked) as client, pytest.raises(Exception, match="401|token"):
        client.model(name)
    assert len(asked) == 1
    entries = CATALOG.values() if isinstance(CATALOG, dict) else CATALOG
    with _refusing(NO_TOKEN, None, asked) as client:
        for entry in entries:       # every name the catalog answers to
            for known in (entry.name, entry.hub_id, *entry.aliases):
                with pytest.raises(Exception, match="needs a token"):
                    client.model(known)


@pytest.mark.parametrize("ref", ["../x", "..", "a b", "x/y", "-1", "", "_x"])
def test_a_ref_that_is_neither_a_number_nor_an_alias_is_refused_before_any_request(ref):
    from oscar_zoo.zoo.errors import InvalidInput

    asked: list = []
    with _refusing(NO_TOKEN, None, asked) as client:
        for read in (lambda: client.version("smollm2", ref), lambda: client.yank("smollm2", ref, "w"),
                     lambda: client.promote("smollm2", ref), lambda: client.mirrors("smollm2", ref)):
            with pytest.raises(InvalidInput, match="neither a version number nor an alias"):
                read()
    assert asked == []


@pytest.mark.parametrize("alias", ["../x", "..", "Prod", "3", "a/b", "x" * 65])
def test_an_alias_to_move_is_checked_by_the_registrys_rule_in_its_words(alias):
    from oscar_zoo.registry_db.aliases import check_alias_name
    from oscar_zoo.zoo.errors import InvalidInput

    with pytest.raises(InvalidInput) as theirs:
        check_alias_name(alias)
    asked: list = []
    with _refusing(NO_TOKEN, None, asked) as client:
        for move in (lambda: client.set_alias("smollm2", alias, 1),
                     lambda: client.remove_alias("smollm2", alias)):
            with pytest.raises(InvalidInput) as ours:
                move()
            assert str(ours.value) == str(theirs.value)
    assert asked == []


@pytest.mark.parametrize("args, said", [
    (["publish", "{bundle}", "--name", "../../etc/passwd"], "model name '../../etc/passwd'"),
    (["pull", "../../x"], "unknown model '../../x'"),        # every source said not found
    (["show", "a/../b@1"], "model name 'a/../b'"),
    (["alias", "smollm2-135m@1", "../x"], "alias '../x'"),
    (["unalias", "smollm2-135m", "../x"], "alias '../x'"),
])
def test_the_cli_refuses_a_bad_name_itself(tmp_path, monkeypatch, args, said):
    """The walkthrough's commands: answered by the registry's upload size limit, "no endpoint
    at /x" and a 405. Here the registry is not even listening: the name is refused first."""
    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli

    monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", DEAD)
    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", "0")
    monkeypatch.setenv("OSCAR_ZOO_TOKEN", "ozk_" + "D" * 43)
    bundle = make_bundle(tmp_path / "b").path if "{bundle}" in args else None
    result = CliRunner().invoke(cli, [str(bundle) if a == "{bundle}" else a for a in args])
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(f"Error: {said}"), result.stderr
    assert "cannot reach" not in result.stderr


# --- a version whose blob the registry lost ------------------------------------------------------

def _pull_with_a_lost_blob(registry, tmp_path, monkeypatch, retries: int = 0):
    """`oscar-zoo pull` of a version whose rotations blob is gone from the registry's store."""
    import json

    from click.testing import CliRunner

    from oscar_zoo.zoo.cli.main import cli

    monkeypatch.setenv("OSCAR_ZOO_SOURCES", "registry")
    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", str(retries))
    bundle = make_bundle(tmp_path / "b")
    registry.publish_dir(bundle.path)
    files = json.loads((bundle.path / "bundle.json").read_text())["files"]
    sha = next(f["sha256"] for f in files if f["name"] == "rotations.safetensors")
    registry.registry.blobs.path(sha).unlink()
    return CliRunner().invoke(cli, ["pull", "smollm2-135m"])


def test_a_pull_of_a_lost_blob_fails_in_one_line_not_a_traceback(registry, tmp_path, monkeypatch):
    result = _pull_with_a_lost_blob(registry, tmp_path, monkeypatch)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output and result.stdout == ""
    assert "Error: could not pull smollm2-135m: rotations.safetensors from registry: 500" \
        in result.stderr, result.stderr


def test_a_pull_of_a_lost_blob_says_what_the_registry_said_without_retrying(registry, tmp_path,
                                                                             monkeypatch):
    """The registry's detail was dropped (a bare "500 Internal Server Error"), after retries
    that a lost blob cannot heal."""
    result = _pull_with_a_lost_blob(registry, tmp_path, monkeypatch, retries=3)
    assert "the registry's blob of file 'rotations.safetensors' of smollm2-135m version 1" \
        in result.stderr and "publish the bundle it belongs to again" in result.stderr, result.stderr
    assert "retr" not in result.stderr, result.stderr
