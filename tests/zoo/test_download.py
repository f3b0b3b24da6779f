"""Transfers: Range resume (within a run and across processes), sha256 checks that delete a
corrupt download, stall detection, retries with backoff. Against the loopback hub emulator."""

from __future__ import annotations

import hashlib

import pytest

from oscar_zoo.zoo.cache import Cache
from oscar_zoo.zoo.errors import IntegrityError, RemoteError
from oscar_zoo.zoo.pull import pull
from oscar_zoo.zoo.sources.download import RemoteFile, fetch, partial_key, retry_after_seconds
from oscar_zoo.zoo.sources.hubs import FileMeta, HFHub, MSHub

from .conftest import GLM_FILES, GLM_FOLDER

K_PATH = f"{GLM_FOLDER}/{GLM_FILES[0]}"
HF_REPO = "oscar-zoo/plain-files"


def k_sha(zoo_files) -> str:
    return hashlib.sha256(zoo_files[K_PATH]).hexdigest()


def test_a_cut_connection_is_resumed_with_range(hf_only, hub, zoo_files, capsys):
    hub.truncate(GLM_FILES[0], after=1_000_000)
    r = pull("glm-4.7-fp8")
    assert (r.path / "bundle.json").exists()
    ranges = [rng for path, rng in hub.ranges if GLM_FILES[0] in path]
    assert ranges == ["bytes=1000000-"]  # continued, not restarted
    assert Cache().has_blob(k_sha(zoo_files), len(zoo_files[K_PATH]))
    assert "retrying" in capsys.readouterr().err


def test_a_partial_left_by_a_killed_process_is_resumed(hf_only, hub, zoo_files):
    cache = Cache()
    cache.ensure()
    data = zoo_files[K_PATH]
    cache.incomplete(k_sha(zoo_files)).write_bytes(data[:777_777])  # what a crash leaves
    pull("glm-4.7-fp8")
    assert [rng for path, rng in hub.ranges if GLM_FILES[0] in path] == ["bytes=777777-"]
    assert cache.blob(k_sha(zoo_files)).read_bytes() == data
    assert not cache.incomplete(k_sha(zoo_files)).exists()


def test_a_bad_partial_is_detected_and_fetched_again_from_zero(hf_only, hub, zoo_files, capsys):
    cache = Cache()
    cache.ensure()
    cache.incomplete(k_sha(zoo_files)).write_bytes(b"\x00" * 5000)  # not the file's first bytes
    pull("glm-4.7-fp8")
    assert cache.blob(k_sha(zoo_files)).read_bytes() == zoo_files[K_PATH]
    assert "did not verify" in capsys.readouterr().err


def test_corrupt_bytes_on_the_wire_are_deleted_and_reported(hf_only, hub, zoo_files):
    hub.corrupt(GLM_FILES[0], times=1)
    cache = Cache()
    with pytest.raises(IntegrityError, match="sha256 .* does not match .* deleted"):
        pull("glm-4.7-fp8")
    assert not cache.has_blob(k_sha(zoo_files))
    assert not cache.incomplete(k_sha(zoo_files)).exists()
    assert not list((cache.root / "models").glob("*/snapshots/*"))
    assert pull("glm-4.7-fp8").source == "hf"  # the next run fetches it cleanly


def test_a_stalled_transfer_is_abandoned_and_resumed(hf_only, hub, zoo_files, monkeypatch, capsys):
    monkeypatch.setenv("OSCAR_ZOO_HTTP_TIMEOUT", "0.5")
    hub.truncate(GLM_FILES[0], after=2_000_000, stall=4.0)
    import time

    t0 = time.monotonic()
    pull("glm-4.7-fp8")
    assert time.monotonic() - t0 < 4.0  # did not wait for the stalled server
    assert "stalled" in capsys.readouterr().err
    assert [rng for path, rng in hub.ranges if GLM_FILES[0] in path] == ["bytes=2000000-"]
    assert Cache().blob(k_sha(zoo_files)).read_bytes() == zoo_files[K_PATH]


def test_one_file_failing_stops_the_others_and_keeps_their_partial_files(hf_only, hub, zoo_files,
                                                                         monkeypatch):
    """The two .pt files download side by side. K arrives corrupt; V, stalled mid-way, would
    be retried to the end before the pull reported K. It stops instead (one request, no
    retry), and what it got stays as a partial for the next pull to resume."""
    monkeypatch.setenv("OSCAR_ZOO_HTTP_TIMEOUT", "1")
    hub.corrupt(GLM_FILES[0], times=None)
    hub.truncate(GLM_FILES[1], after=1_000_000, stall=3.0)
    with pytest.raises(IntegrityError, match="sha256"):
        pull("glm-4.7-fp8")
    v_sha = hashlib.sha256(zoo_files[f"{GLM_FOLDER}/{GLM_FILES[1]}"]).hexdigest()
    assert len(hub.requests("GET", GLM_FILES[1])) == 1
    cache = Cache()
    assert not cache.has_blob(v_sha)
    assert cache.incomplete(v_sha).stat().st_size == 1_000_000


def test_a_full_disk_stops_the_others_and_drops_their_partial_files_too(hf_only, hub, zoo_files,
                                                                       monkeypatch):
    """As above, but K's write finds the disk full: V's partial would hold room the user must
    now free for a resume that cannot fit, and the error says nothing half-written is kept.
    The full disk is K's partial file alone, simulated (tests/utils/full_disk.py)."""
    from oscar_zoo.zoo.errors import StorageFull
    from tests.utils.full_disk import full_disk

    monkeypatch.setenv("OSCAR_ZOO_HTTP_TIMEOUT", "1")
    hub.truncate(GLM_FILES[1], after=1_000_000, stall=3.0)
    cache = Cache()
    v_sha = hashlib.sha256(zoo_files[f"{GLM_FOLDER}/{GLM_FILES[1]}"]).hexdigest()
    with full_disk(monkeypatch, cache.incomplete(k_sha(zoo_files)), free=0), \
            pytest.raises(StorageFull, match="nothing half-written was kept"):
        pull("glm-4.7-fp8")
    assert len(hub.requests("GET", GLM_FILES[1])) == 1
    assert not cache.incomplete(k_sha(zoo_files)).exists()
    assert not cache.incomplete(v_sha).exists() and not cache.has_blob(v_sha)


def test_files_listed_without_a_hash_get_partial_files_of_their_own(hub, monkeypatch):
    """Neither a sha256 nor a git blob id (a hub listing that gave none): two such files used to
    share one partial file and one lock, so the second resumed from the first one's bytes."""
    monkeypatch.setenv("OSCAR_ZOO_HTTP_RETRIES", "0")
    files = {"a/x.bin": bytes(range(256)) * 40, "b/y.bin": bytes(reversed(range(256))) * 40}
    hub.seed("hf", HF_REPO, files)
    remotes = [RemoteFile(path.rsplit("/", 1)[1], url=HFHub().resolve_url(HF_REPO, path, "main"),
                          size=len(data), source="hf") for path, data in files.items()]
    assert len({partial_key(r) for r in remotes}) == 2
    assert partial_key(remotes[0]) == partial_key(RemoteFile(**vars(remotes[0])))  # stable
    cache = Cache()
    for remote, cut in zip(remotes, (1000, 3000)):
        hub.truncate(remote.name, after=cut)
        with pytest.raises(RemoteError, match="partial download is kept"):
            fetch(remote, cache, progress=False)
    partials = [cache.incomplete(partial_key(r)) for r in remotes]
    for partial, data, cut in zip(partials, files.values(), (1000, 3000)):
        assert partial.read_bytes() == data[:cut]   # each kept its own bytes
    for remote, data in zip(remotes, files.values()):
        assert cache.blob(fetch(remote, cache, progress=False)).read_bytes() == data
    assert sorted(hub.ranges) == sorted(
        [(remotes[0].url.removeprefix(hub.url), "bytes=1000-"),
         (remotes[1].url.removeprefix(hub.url), "bytes=3000-")])


def test_modelscope_files_without_a_sha256_are_told_apart_by_repo_and_path():
    """modelscope-hub downloads them itself (no url of ours to fetch), and a README.md is in
    every folder: the name alone would not tell them apart."""
    ms = MSHub()
    keys = {partial_key(ms.remote(repo, FileMeta(path, 5, None), "master"))
            for repo in ("org/a", "org/b") for path in ("README.md", "x/README.md")}
    assert len(keys) == 4


def test_retry_after_is_read_as_seconds_or_as_a_date():
    import email.utils
    import time

    assert retry_after_seconds("120") == 120.0
    assert retry_after_seconds(7) == 7.0          # modelscope-hub hands over a number
    in_a_minute = retry_after_seconds(email.utils.formatdate(time.time() + 60, usegmt=True))
    assert 55 <= in_a_minute <= 60
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT") == 0.0   # already past
    for unreadable in (None, "", "soon", "-5", float("nan"), float("inf")):
        assert retry_after_seconds(unreadable) is None


# --- TLS -----------------------------------------------------------------------------------------

@pytest.fixture
def tls_server(tmp_path):
    """An https server on loopback with a fresh self-signed certificate (Debian's openssl)."""
    import http.server
    import shutil
    import ssl
    import subprocess
    import threading

    if shutil.which("openssl") is None:
        pytest.skip("openssl is not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)

    class Hello(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"https://127.0.0.1:{server.server_address[1]}", cert
    server.shutdown()


def test_https_is_verified_and_plain_http_builds_no_tls(tls_server, hub, monkeypatch):
    import httpx

    from oscar_zoo.zoo.sources import download

    url, cert = tls_server
    client = download.new_client()
    assert client.get(f"{hub.url}/api/models/none").status_code == 404   # plain http works
    assert client._transport._tls is None          # and never loaded a CA bundle
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        client.get(url)                            # an untrusted certificate is refused
    client.close()
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))  # trusted: the same request goes through
    monkeypatch.setattr(download.ssl_context, "ctx", None, raising=False)
    with download.new_client() as trusting:
        assert trusting.get(url).text == "ok"
