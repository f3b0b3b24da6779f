"""Downloading one file into the blob store: resume, verify, retry, progress.

- A partial download lives at blobs/sha256/<sha>.incomplete (partial_key: another name for a
  file listed without a sha256) and is resumed with `Range: bytes=N-` by the next attempt or
  the next process (a 200 answer restarts it from zero).
- The finished file is checked against its sha256 (or, for small git-tracked hub files, the git
  blob sha1). A mismatch deletes the file and says so; a mismatch after a resume is retried once
  from scratch, since the stale part may be what was wrong.
- Connection errors, stalls (no byte for `http_timeout` seconds), 429 and 5xx are retried with
  exponential backoff, or after the server's Retry-After, up to `http_retries` times; other 4xx
  answers fail at once, mapped to our errors (401 Unauthorized, 403 Forbidden, 404
  BundleNotFound).
- One progress bar per file on stderr (size, rate, ETA) when stderr is a terminal.
"""

from __future__ import annotations

import email.utils
import hashlib
import logging
import math
import random
import shutil
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

from .. import settings
from ..cache import Cache
from ..errors import (BundleNotFound, Forbidden, IntegrityError, OfflineError, RemoteError,
                      StorageCorrupt, TRY_LATER, Unauthorized, is_no_space, is_transient)
from ..files import CHUNK, sha256_file

log = logging.getLogger("oscar_zoo.download")

RETRY_STATUS = TRY_LATER | {500, 502, 503, 504}
# The longest Retry-After a retry sits out. A server asking for more is throttling for minutes:
# a pull or mirror silently hanging that long looks dead, so retry_transient fails at once and
# the error says how long to wait (the raw download path still waits this long, then retries).
RETRY_AFTER_CAP = 30.0


@dataclass
class RemoteFile:
    name: str                          # file name in the bundle or repo (for messages)
    url: str | None = None
    sha256: str | None = None          # required unless git_sha1 is given
    size: int | None = None
    headers: dict = field(default_factory=dict, repr=False)  # may hold a token: never printed
    git_sha1: str | None = None        # hub listing of a small, non-LFS file
    # a hub client's own downloader (ModelScope): fetch(workdir, show_bar) -> the file, at
    # finished_file(); show_bar: whether the client may draw its own progress bar on stderr
    fetch: Callable[[Path, bool], Path] | None = None
    source: str = ""                   # "registry", "hf", ... for messages


class _Retry(Exception):
    def __init__(self, message: str, retry_after: float | None = None, status: int | None = None):
        super().__init__(message)
        self.retry_after = retry_after
        self.status = status


_local = threading.local()


def import_httpx():
    """httpx, without its command-line entry point: `httpx/__init__` imports `httpx._main`
    (rich, pygments) only to offer `httpx` as a CLI; a None entry in sys.modules makes that
    import fail, which httpx handles by defining a stub. Saves ~60% of httpx's import time,
    which is most of a warm pull's budget."""
    if "httpx" not in sys.modules:
        sys.modules.setdefault("httpx._main", None)
    import httpx

    return httpx


def ssl_context():
    """One TLS context per process: building one (loading the CA bundle) costs more than a
    warm pull's whole request, and every httpx.Client would build its own."""
    ctx = getattr(ssl_context, "ctx", None)
    if ctx is None:
        ctx = ssl_context.ctx = import_httpx().create_ssl_context()
    return ctx


def new_client(**kwargs):
    """An httpx.Client with our timeouts whose TLS context is built at its first https
    request: a registry on plain http (what `oscar-zoo serve` starts) never loads the CA
    bundle, ~35-50 ms of a warm pull's 0.3 s."""
    httpx = import_httpx()

    class LazyTLS(httpx.BaseTransport):
        def __init__(self):
            self._plain = httpx.HTTPTransport(verify=False)   # no certificates on http://
            self._tls = None
            self._lock = threading.Lock()

        def handle_request(self, request):
            if request.url.scheme != "https":
                return self._plain.handle_request(request)
            with self._lock:
                if self._tls is None:
                    self._tls = httpx.HTTPTransport(verify=ssl_context())
            return self._tls.handle_request(request)

        def close(self):
            self._plain.close()
            if self._tls is not None:
                self._tls.close()

    stall = float(settings.get("http_timeout"))
    return httpx.Client(transport=LazyTLS(), follow_redirects=True,
                        timeout=httpx.Timeout(stall, connect=min(stall, 10.0)), **kwargs)


def http_client():
    """One httpx client per thread (connection reuse; downloads run in a few threads)."""
    client = getattr(_local, "client", None)
    if client is None:
        client = _local.client = new_client()
    return client


def backoff(attempt: int, retry_after: float | None = None, base: float = 0.25,
            most: float = 8.0) -> float:
    """Seconds before retry number `attempt` (from 0): what the server asked for, up to
    RETRY_AFTER_CAP; else exponential from `base` up to `most`, jittered so that threads
    refused together do not come back together."""
    if retry_after is not None:
        return min(max(retry_after, 0.0), RETRY_AFTER_CAP)
    return min(base * (2 ** attempt), most) * (0.75 + random.random() / 2)


def duration(seconds: float) -> str:
    """A wait as people say it: 40 s, 10 min, 3.0 h."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def asks_too_long(retry_after: float | None) -> bool:
    return retry_after is not None and retry_after > RETRY_AFTER_CAP


def retry_after_seconds(value) -> float | None:
    """A Retry-After value as seconds from now: delta-seconds or an HTTP-date (RFC 9110
    10.2.3; a date already past is 0). None when absent or unreadable: the caller's own backoff
    applies then."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):  # modelscope-hub's float() takes "nan" and "inf"
        return max(float(value), 0.0) if math.isfinite(value) else None
    text = str(value).strip()
    if text.isdigit():
        return float(text)
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # RFC 9110 dates are GMT; "-0000" parses as naive
        when = when.replace(tzinfo=timezone.utc)
    return max((when - datetime.now(timezone.utc)).total_seconds(), 0.0)


def retry_transient(call: Callable, retries: int,
                    wait: Callable[[int, float | None], float] = backoff, loud: bool = False):
    """call() again after wait(attempt, retry_after) seconds while it fails with an error that
    may heal (errors.is_transient: connection errors, TRY_LATER and 5xx), at most `retries` times.
    retry_after: the seconds the server asked for (the error's `.retry_after`, from a
    Retry-After header), or None. An error asking for more than RETRY_AFTER_CAP is raised at
    once: the caller's message can then say how long to wait, rather than hang that long.
    loud: each retry is a warning (stderr), for callers whose retries add up to minutes."""
    for attempt in range(retries + 1):
        try:
            return call()
        except (RemoteError, OfflineError) as e:
            asked = getattr(e, "retry_after", None)
            if attempt == retries or not is_transient(e) or asks_too_long(asked):
                raise
            delay = wait(attempt, asked)
            log.log(logging.WARNING if loud else logging.INFO, "%s; retry %d of %d in %s", e,
                    attempt + 1, retries, duration(delay))
            time.sleep(delay)


def fetch(remote: RemoteFile, cache: Cache, progress: bool = True,
          stop: threading.Event | None = None) -> str:
    """Make sure the file is in the blob store; return its sha256.

    Raises IntegrityError, Unauthorized, Forbidden, BundleNotFound, RemoteError, OfflineError.
    """
    if remote.sha256 and cache.has_blob(remote.sha256, remote.size):
        return remote.sha256  # cache hit: dedup across versions and models
    key = partial_key(remote)
    cache.ensure()
    with cache.lock(f"blob-{key}", f"the download of {remote.name}"):
        if remote.sha256 and cache.has_blob(remote.sha256, remote.size):
            return remote.sha256  # another process finished it while we waited
        partial = cache.incomplete(key)
        if remote.fetch is not None:
            return _fetch_with_hub_client(remote, cache, partial, key,
                                          progress and sys.stderr.isatty())
        fresh_retry_left = True
        while True:
            resumed = partial.exists() and partial.stat().st_size > 0
            download_to(remote, partial, progress, stop)
            try:
                return _verify_and_adopt(remote, cache, partial)
            except IntegrityError:
                if resumed and fresh_retry_left:
                    fresh_retry_left = False
                    _note(f"{remote.name}: the resumed download did not verify; fetching it again "
                          "from the start")
                    continue
                raise


def partial_key(remote: RemoteFile) -> str:
    """What names a file's partial download and its lock: its sha256, else its git blob id,
    else a digest of where it comes from. Files with no hash must not share one: a resume would
    append one file's bytes to another's, and one download would wait on the other's lock.
    The size is part of it so that a file changed at the same URL starts afresh."""
    if remote.sha256:
        return remote.sha256
    if remote.git_sha1:
        return f"git-{remote.git_sha1}"
    origin = "\n".join((remote.source, remote.url or remote.name, str(remote.size)))
    return "src-" + hashlib.sha256(origin.encode()).hexdigest()[:40]


def finished_file(workdir: Path) -> Path:
    """Where a hub client's fetch(workdir) leaves its finished file until we adopt it."""
    return workdir.with_name(workdir.name + ".done")


def _fetch_with_hub_client(remote: RemoteFile, cache: Cache, partial: Path, key: str,
                           show_bar: bool) -> str:
    workdir = partial.parent / f"{key}.hub"
    finished = finished_file(workdir)
    if finished.is_file():  # a run killed between the hub client's download and our adopt
        finished.replace(partial)
        try:
            return _verify_and_adopt(remote, cache, partial)
        except IntegrityError:
            _note(f"{remote.name}: the copy a killed run left did not verify; fetching it again")
    try:
        got = remote.fetch(workdir, show_bar)
    except OSError as e:
        if is_no_space(e):  # as _dropped_on_full_disk: the hub client's part is in its workdir
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    partial.unlink(missing_ok=True)
    got.replace(partial)
    return _verify_and_adopt(remote, cache, partial)


def _verify_and_adopt(remote: RemoteFile, cache: Cache, partial: Path) -> str:
    size = partial.stat().st_size
    problem = None
    if remote.size is not None and size != remote.size:
        problem = f"got {size} bytes, expected {remote.size}"
    digest = sha256_file(partial)
    if problem is None and remote.sha256 and digest != remote.sha256:
        problem = f"sha256 {digest[:12]}... does not match the expected {remote.sha256[:12]}..."
    if problem is None and not remote.sha256 and remote.git_sha1:
        got = _git_sha1(partial)
        if got != remote.git_sha1:
            problem = f"git blob id {got[:12]}... does not match the listing's {remote.git_sha1[:12]}..."
    if problem:
        partial.unlink(missing_ok=True)
        raise IntegrityError(
            f"{remote.name} from {remote.source or 'the server'}: {problem}. The corrupt download "
            "was deleted; run the command again to fetch it anew.")
    cache.adopt(partial, digest)
    return digest


def _git_sha1(path: Path) -> str:
    h = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


class Stopped(Exception):
    """A download given up because `stop` was set (another file of the pull failed, or Ctrl-C);
    its partial file stays for the next pull to resume, unless the failure was a full disk."""


class StopSignal(threading.Event):
    """`stop` for the downloads of one pull. `full_disk`, set before the signal, says a sibling
    ran out of disk space: their partial files go too, rather than hold room the user must now
    free for a resume that would not fit."""

    full_disk = False


def download_to(remote: RemoteFile, partial: Path, progress: bool = True,
                stop: threading.Event | None = None) -> None:
    """Download (resuming) into `partial` without verifying it: the caller checks the bytes.
    Setting `stop` ends it at the next chunk (Stopped). On a full disk (this download's, or a
    sibling's by StopSignal.full_disk) `partial` is deleted: the next pull starts it afresh."""
    with _dropped_on_full_disk(partial, stop):
        _download_with_retries(remote, partial, progress, stop)


def _download_with_retries(remote: RemoteFile, partial: Path, progress: bool,
                           stop: threading.Event | None) -> None:
    httpx = import_httpx()

    retries = int(settings.get("http_retries"))
    attempt = 0
    while True:
        try:
            _attempt(remote, partial, progress, stop)
            return
        except (httpx.TransportError, _Retry) as e:
            if attempt >= retries:
                raise _final_error(remote, e, retries) from None
            wait = backoff(attempt, getattr(e, "retry_after", None))
            _note(f"{remote.name}: {_describe(e)}; retrying in {wait:.1f} s "
                  f"({attempt + 1}/{retries})")
            if stop is not None and stop.wait(wait):
                raise Stopped(remote.name) from None
            if stop is None:
                time.sleep(wait)
            attempt += 1


def _attempt(remote: RemoteFile, partial: Path, progress: bool, stop: threading.Event | None) -> None:
    have = partial.stat().st_size if partial.exists() else 0
    if remote.size is not None and have > remote.size:
        partial.unlink()
        have = 0
    if remote.size is not None and have == remote.size:
        partial.touch()  # an empty file needs no request; the caller still checks its sha256
        return  # complete already (a crash between download and verify)
    headers = dict(remote.headers)
    if have:
        headers["Range"] = f"bytes={have}-"
    with http_client().stream("GET", remote.url, headers=headers) as r:
        if r.status_code == 416:  # our partial is at or past the end: start over
            partial.unlink(missing_ok=True)
            raise _Retry("the server refused to resume (416)", retry_after=0)
        _check_status(remote, r)
        append = r.status_code == 206 and have > 0 and _range_start(r) == have
        total = remote.size or _content_total(r, have if append else 0)
        with open(partial, "ab" if append else "wb") as f, \
                _bar(remote.name, total, have if append else 0, progress) as bar:
            for chunk in r.iter_bytes():  # write as it arrives: a stall loses nothing received
                f.write(chunk)
                bar(len(chunk))
                if stop is not None and stop.is_set():
                    raise Stopped(remote.name)
    if remote.size is not None and partial.stat().st_size < remote.size:
        raise _Retry(f"connection closed after {partial.stat().st_size} of {remote.size} bytes")


@contextmanager
def _dropped_on_full_disk(partial: Path, stop: threading.Event | None) -> Iterator[None]:
    """Delete the partial file when its disk (or quota) is full. A resume needs the room it
    takes, which is what the user must now free (`oscar-zoo prune` spares a partial download
    for an hour, as one may be in progress)."""
    try:
        yield
    except Stopped:
        if getattr(stop, "full_disk", False):
            partial.unlink(missing_ok=True)
        raise
    except OSError as e:
        if is_no_space(e):
            partial.unlink(missing_ok=True)
        raise


def _check_status(remote: RemoteFile, r) -> None:
    code = r.status_code
    if code < 400:
        return
    r.read()
    where = f"{remote.name} from {remote.source or r.request.url.host}"
    problem = _problem(r)
    said = f": {problem['detail'][:500]}" if isinstance(problem.get("detail"), str) and \
        problem["detail"] else ""
    # the registry's blob is missing or corrupt (StorageCorrupt): a 500 that asking again
    # cannot heal, so its message is shown at once rather than after every retry's backoff
    if code in RETRY_STATUS and problem.get("title") != StorageCorrupt.title:
        raise _Retry(f"{code} {r.reason_phrase}{said}",
                     retry_after=retry_after_seconds(r.headers.get("Retry-After")), status=code)
    if code == 401:
        raise Unauthorized(f"{where}: 401 Unauthorized; {_auth_hint(remote.source)}")
    if code == 403:
        raise Forbidden(f"{where}: 403 Forbidden; {_auth_hint(remote.source)}")
    if code == 404:
        raise BundleNotFound(f"{where}: 404 Not Found at {_public(r.request.url)}")
    raise _with_status(RemoteError(f"{where}: {code} {r.reason_phrase}{said}"), code)


def _problem(r) -> dict:
    """An RFC 9457 problem answer (the registry's errors say what to do), else {}: a hub's or a
    proxy's HTML page is not worth quoting."""
    if "json" not in r.headers.get("Content-Type", ""):
        return {}
    try:
        body = r.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def _with_status(error: RemoteError, status: int | None) -> RemoteError:
    """The HTTP status on the error, as the registry client and the hubs' errors carry it:
    pull falls back to a cached copy on a server's failure (5xx), not on its refusal (4xx)."""
    error.status = status
    return error


def _auth_hint(source: str) -> str:
    return {"registry": "run `oscar-zoo login` or set OSCAR_ZOO_TOKEN",
            "hf": "set HF_TOKEN to a token that can read the repo",
            "modelscope": "set MODELSCOPE_API_TOKEN to a token that can read the repo"}.get(
        source, "check your token")


def _public(url) -> str:
    return str(url.copy_with(query=None))


def _range_start(r) -> int | None:
    value = r.headers.get("Content-Range", "")  # bytes START-END/TOTAL
    try:
        return int(value.split()[1].split("-")[0])
    except (IndexError, ValueError):
        return None


def _content_total(r, already: int) -> int | None:
    length = r.headers.get("Content-Length")
    return already + int(length) if length and length.isdigit() else None


def _describe(e: Exception) -> str:
    httpx = import_httpx()

    if isinstance(e, httpx.TimeoutException):
        return "stalled (no data within OSCAR_ZOO_HTTP_TIMEOUT)"
    if isinstance(e, httpx.ConnectError):
        return "cannot connect"
    if isinstance(e, httpx.TransportError):
        return f"connection error ({type(e).__name__})"
    return str(e)


def _final_error(remote: RemoteFile, e: Exception, retries: int) -> Exception:
    httpx = import_httpx()

    where = f"{remote.name} from {remote.source or 'the server'}"
    if isinstance(e, httpx.ConnectError):
        # no OSCAR_ZOO_OFFLINE hint: a file is downloaded because the cache lacks it
        return OfflineError(f"{where}: cannot connect ({e}); check your network")
    return _with_status(RemoteError(f"{where}: {_describe(e)} after {retries} retries; the "
                                    "partial download is kept and the next run resumes it"),
                        getattr(e, "status", None))


def _note(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class _bar:
    """tqdm on stderr when it is a terminal, otherwise nothing."""

    def __init__(self, name: str, total: int | None, initial: int, enabled: bool):
        self.tqdm = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.tqdm = tqdm(total=total, initial=initial, unit="B", unit_scale=True,
                             unit_divisor=1024, desc=name, file=sys.stderr, leave=False,
                             dynamic_ncols=True, mininterval=0.2)

    def __enter__(self):
        return self.update

    def update(self, n: int) -> None:
        if self.tqdm is not None:
            self.tqdm.update(n)

    def __exit__(self, *exc):
        if self.tqdm is not None:
            self.tqdm.close()
