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
