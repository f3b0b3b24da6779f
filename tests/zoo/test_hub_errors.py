"""How the hubs' and the downloader's errors read (zoo/sources/hubs.py, zoo/sources/download.py):
ModelScope's long urllib3 chains kept readable, and no OSCAR_ZOO_OFFLINE hint: pull, their reader,
falls back to the cache by itself, and offline mode serves no mirror's reads."""

from __future__ import annotations

import httpx
import modelscope_hub.errors as ms
import pytest

from oscar_zoo.zoo.errors import OfflineError, RemoteError
from oscar_zoo.zoo.sources.download import RemoteFile, _final_error
from oscar_zoo.zoo.sources.hubs import HFHub, MSHub, _first_line

HINT = "OSCAR_ZOO_OFFLINE=1"
# what modelscope-hub raised on a machine without DNS (the walkthrough's message; NetworkError
# puts its code, [E1020], in front)
MS_DNS = ("Connection failed: _DownloadHTTPSConnectionPool(host='www.modelscope.cn', "
          "port=443): Max retries exceeded with url: /api/v1/models/togethercomputer/"
          "OSCAR-RotationZoo/repo/files?Revision=master&Recursive=True (Caused by "
          "NameResolutionError(\"_DownloadHTTPSConnection(host='www.modelscope.cn', port=443): "
          "Failed to resolve 'www.modelscope.cn' ([Errno -2] Name or service not known)\"))")


def _raised(hub, error: Exception, **kwargs) -> str:
    with pytest.raises((OfflineError, RemoteError)) as e, \
            hub.errors("togethercomputer/OSCAR-RotationZoo", "master", **kwargs):
        raise error
    return str(e.value)


def _cache_something(cache_root) -> None:
    (cache_root / "models" / "smollm2-135m" / "snapshots" / ("a" * 64)).mkdir(parents=True)


def test_a_modelscope_network_error_names_its_cause_whole():
    """It was cut at 300 characters, mid-word inside the pool's repr:
    ...NameResolutionError("_DownloadHTTPSConnection(host='www.modelscope.cn', p); check ..."""
    told = _raised(MSHub(), ms.NetworkError(MS_DNS))
    assert told == ("modelscope:togethercomputer/OSCAR-RotationZoo@master: cannot reach "
                    "https://www.modelscope.cn ([E1020] Connection failed: NameResolutionError: "
                    "Failed to resolve 'www.modelscope.cn' ([Errno -2] Name or service not "
                    "known)); check your network")


@pytest.mark.parametrize("message, reason", [
    ("HTTPSConnectionPool(host='h.cn', port=443): Max retries exceeded with url: /a (Caused by "
     "NewConnectionError('<urllib3.connection.HTTPSConnection object at 0x7f>: Failed to "
     "establish a new connection: [Errno 111] Connection refused'))",
     "NewConnectionError: Failed to establish a new connection: [Errno 111] Connection refused"),
    ("HTTPSConnectionPool(host='h.cn', port=443): Max retries exceeded with url: /a (Caused by "
     "ConnectTimeoutError(<urllib3.connection.HTTPSConnection object at 0x7f>, 'Connection to "
     "h.cn timed out. (connect timeout=10)'))",
     "ConnectTimeoutError: Connection to h.cn timed out. (connect timeout=10)"),
])
def test_urllib3_chains_keep_the_cause_and_its_reason(message, reason):
    assert _first_line(Exception(message)) == reason


def test_a_long_message_is_cut_at_a_word_with_an_ellipsis():
    words = " ".join(f"word{i}" for i in range(100))
    told = _first_line(Exception(words))
    assert len(told) <= 300 and told.endswith("...")
    assert all(w in words.split() for w in told.removesuffix("...").split())
    assert _first_line(Exception("short\nsecond line")) == "short"


@pytest.mark.parametrize("hub, error", [(MSHub(), ms.NetworkError(MS_DNS)),
                                        (HFHub(), httpx.ConnectError("refused"))])
def test_no_hub_error_suggests_offline_mode(hub, error, cache_root):
    """A hub is read by pull, which falls back to the cache by itself, and by the mirror,
    whose reads offline mode does not serve: "set OSCAR_ZOO_OFFLINE=1" helps neither, whatever
    the cache holds."""
    _cache_something(cache_root)
    told = _raised(hub, error)
    assert "cannot reach" in told and HINT not in told


@pytest.mark.parametrize("hub, revision", [(HFHub(), "main"), (MSHub(), "master")])
def test_a_hub_listing_that_cannot_connect_does_not_suggest_the_cache(hub, revision, cache_root,
                                                                      monkeypatch):
    """The real clients against a port nothing listens on, with something cached."""
    _cache_something(cache_root)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", "0")
    for read in (lambda: hub.listing("org/repo", ["bundle.json"], revision),
                 lambda: hub.tags("org/repo")):
        with pytest.raises(OfflineError) as e:
            read()
        assert "cannot reach http://127.0.0.1:9" in str(e.value) and HINT not in str(e.value)


def test_a_download_that_cannot_connect_does_not_suggest_the_cache(cache_root):
    """A file is downloaded because the cache lacks it."""
    _cache_something(cache_root)
    remote = RemoteFile(name="rotations.safetensors", url="http://127.0.0.1:9/f", source="hf")
    e = _final_error(remote, httpx.ConnectError("refused"), 3)
    assert isinstance(e, OfflineError) and "cannot connect" in str(e)
    assert HINT not in str(e)
