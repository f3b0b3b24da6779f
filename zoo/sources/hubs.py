"""Thin adapters over the real hub clients: list files with their hashes, locate downloads.

`huggingface_hub` answers metadata (commit of a revision, LFS sha256 of each path); the bytes
then come through our resumable, verifying downloader from the Hub's `resolve` URL (the client's
own download has no cross-process resume and does not hash what it stores, hubs.md 1.4).
`modelscope-hub` does both through `HubApi` (its download_file resumes and checks sha256).
Both endpoints and tokens are read from the environment at call time (HF_ENDPOINT, HF_TOKEN,
MODELSCOPE_ENDPOINT, MODELSCOPE_API_TOKEN), and every client error becomes one of ours.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from urllib.parse import quote

from .. import settings
from ..errors import (BundleNotFound, Conflict, Forbidden, IntegrityError, NotFound, OfflineError,
                      RemoteError, Unauthorized, VersionNotFound)
from .download import RemoteFile, duration, finished_file, retry_after_seconds, retry_transient

HF_DEFAULT_ENDPOINT = "https://huggingface.co"
MS_DEFAULT_ENDPOINT = "https://www.modelscope.cn"


@dataclass(frozen=True)
class FileMeta:
    path: str
    size: int
    sha256: str | None
    git_sha1: str | None = None


@dataclass
class Listing:
    repo: str
    revision: str            # what was asked for (main, a tag, ...)
    commit: str | None       # the commit it resolved to (HF); ModelScope lists by name only
    date: str | None         # commit date, ISO 8601, when the hub says
    files: dict[str, FileMeta]


def _retrying(call):
    """Metadata calls: retry connection errors, 408/429 and 5xx a few times (downloads retry on
    their own); a 400 would only be refused again."""
    return retry_transient(call, min(int(settings.get("http_retries")), 3))


# --- Hugging Face ------------------------------------------------------------------------------

class HFHub:
    kind = "hf"
    label = "Hugging Face Hub"

    @property
    def endpoint(self) -> str:
        return (os.environ.get("HF_ENDPOINT") or HF_DEFAULT_ENDPOINT).rstrip("/")

    @property
    def token(self) -> str | None:
        return os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN") or None

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def api(self):
        from huggingface_hub import HfApi

        return HfApi(endpoint=self.endpoint, token=self.token or False)

    def listing(self, repo: str, paths: list[str], revision: str = "main") -> Listing:
        """Commit of `revision` and metadata of the given paths at that commit (missing: absent)."""
        def call():
            with self.errors(repo, revision):
                api = self.api()
                info = api.repo_info(repo, revision=revision)
                found = api.get_paths_info(repo, paths, revision=info.sha) if paths else []
                date = info.last_modified.isoformat().replace("+00:00", "Z") \
                    if getattr(info, "last_modified", None) else None
                files = {}
                for f in found:
                    if getattr(f, "size", None) is None:
                        continue  # a folder
                    lfs = getattr(f, "lfs", None)
                    files[f.path] = FileMeta(f.path, f.size, lfs.sha256 if lfs else None, f.blob_id)
                return Listing(repo, revision, info.sha, date, files)
        return _retrying(call)

    def head_listing(self, repo: str, paths: list[str], revision: str = "main") -> Listing | None:
        """Commit and LFS sha256 of `paths` from a HEAD on each resolve URL (the check
        hf_hub_download makes), without importing HfApi (~0.2 s, most of a warm pull). None
        unless every answer is a plain 200 or 302 carrying X-Repo-Commit, one commit for all,
        and X-Linked-Etag: the caller then lists through HfApi, which also words the errors.
        No commit date: a conversion that needs it asks for the full listing."""
        from .download import http_client, import_httpx

        httpx = import_httpx()
        files, commits = {}, set()
        try:
            for path in paths:
                r = http_client().head(self.resolve_url(repo, path, revision),
                                       headers=self.auth_headers, follow_redirects=False)
                sha, size = r.headers.get("X-Linked-Etag"), r.headers.get("X-Linked-Size")
                if r.status_code not in (200, 302) or not sha or not size:
                    return None
                commits.add(r.headers.get("X-Repo-Commit"))
                files[path] = FileMeta(path, int(size), sha.removeprefix("W/").strip('"'),
                                       (r.headers.get("ETag") or "").strip('"') or None)
        except (httpx.TransportError, ValueError):  # the HfApi path retries and reports it
            return None
        if len(commits) != 1 or None in commits:
            return None
        return Listing(repo, revision, commits.pop(), None, files)

    def tags(self, repo: str) -> dict[str, str]:
        def call():
            with self.errors(repo, None):
                refs = self.api().list_repo_refs(repo)
                return {t.name: t.target_commit for t in refs.tags}
        return _retrying(call)

    def remote(self, repo: str, meta: FileMeta, commit: str, name: str | None = None) -> RemoteFile:
        return RemoteFile(name=name or meta.path.rsplit("/", 1)[-1],
                          url=self.resolve_url(repo, meta.path, commit),
                          sha256=meta.sha256, size=meta.size, git_sha1=meta.git_sha1,
                          headers=self.auth_headers, source="hf")

    def resolve_url(self, repo: str, path: str, revision: str) -> str:
        # Built here, not with hf_hub_url: that one only swaps in `endpoint` when its template,
        # frozen when huggingface_hub is first imported, starts with the current ENDPOINT, so an
        # HF_ENDPOINT set after that import would silently download from huggingface.co.
        return f"{self.endpoint}/{repo}/resolve/{quote(revision, safe='')}/{quote(path)}"

    @contextmanager
    def errors(self, repo: str, revision: str | None) -> Iterator[None]:
        """The client's errors as ours. A connection error never suggests OSCAR_ZOO_OFFLINE=1:
        a hub is read by pull, which falls back to the cache by itself, and by the mirror,
        whose listings and uploads offline mode does not serve."""
        from huggingface_hub import errors as hf

        where = f"hf:{repo}" + (f"@{revision}" if revision else "")
        try:
            yield
        except hf.OfflineModeIsEnabled:
            raise OfflineError(f"{where}: HF_HUB_OFFLINE is set, so the Hub is not contacted") from None
        except hf.RevisionNotFoundError:
            raise VersionNotFound(f"{where}: no such revision on the {self.label}") from None
        except hf.GatedRepoError:
            raise Forbidden(f"{where}: the repo is gated; accept its terms and set HF_TOKEN") from None
        except hf.RepositoryNotFoundError as e:
            if _status(e) == 401 and self.token:
                raise Unauthorized(f"{where}: 401 Unauthorized; HF_TOKEN was refused") from None
            raise NotFound(f"{where}: repository not found on the {self.label} ({self.endpoint})"
                           + ("" if self.token else "; if it is private, set HF_TOKEN")) from None
        except hf.EntryNotFoundError:
            raise BundleNotFound(f"{where}: file not found") from None
        except hf.HfHubHTTPError as e:
            raise _http_error(where, _status(e), _hf_text(e), "HF_TOKEN",
                              _retry_after(e)) from None
        except Exception as e:
            if _is_connection_error(e):
                raise OfflineError(f"{where}: cannot reach {self.endpoint} ({type(e).__name__}); "
                                   "check your network") from None
            raise


# --- ModelScope --------------------------------------------------------------------------------

class MSHub:
    kind = "modelscope"
    label = "ModelScope"

    def __init__(self):
        self._reached = False      # the endpoint answered once: no more probes (_check_reachable)

    @property
    def endpoint(self) -> str:
        return (os.environ.get("MODELSCOPE_ENDPOINT") or MS_DEFAULT_ENDPOINT).rstrip("/")

    @property
    def token(self) -> str | None:
        return os.environ.get("MODELSCOPE_API_TOKEN") or None

    def api(self):
        from modelscope_hub import HubApi

        return HubApi(endpoint=self.endpoint, token=self.token)

    # modelscope-hub retries failed requests itself (with backoff), so no _retrying here; only
    # an endpoint that cannot be connected to at all is found first (_check_reachable).
    def listing(self, repo: str, paths: list[str] | None, revision: str = "master") -> Listing:
        self._check_reachable(repo, revision)
        with self.errors(repo, revision):
            entries = self.api().list_repo_files(repo, "model", revision=revision, recursive=True)
        want = None if paths is None else set(paths)
        files = {e.path: FileMeta(e.path, int(e.size or 0), e.sha256)
                 for e in entries if e.type != "tree" and (want is None or e.path in want)}
        return Listing(repo, revision, None, None, files)

    def tags(self, repo: str) -> dict[str, str]:
        self._check_reachable(repo, None)
        with self.errors(repo, None):
            revs = self.api().list_repo_revisions(repo, "model")
        return {r.get("Revision"): r.get("CommitId") or r.get("Revision") for r in revs
                if r.get("Revision") not in ("master", "main")}

    def remote(self, repo: str, meta: FileMeta, revision: str, name: str | None = None) -> RemoteFile:
        def fetch(workdir: Path, show_bar: bool) -> Path:
            with self.errors(repo, revision), _client_bars(show_bar):
                got = self.api().download_file(repo, "model", meta.path, revision=revision,
                                                local_dir=workdir, expected_sha256=meta.sha256,
                                                file_size=meta.size)
            out = finished_file(workdir)
            Path(got).replace(out)
            shutil.rmtree(workdir, ignore_errors=True)
            return out

        # The url is never requested here (fetch downloads): it names the file, which the
        # partial download's key needs when the listing gave no sha256 (download.partial_key).
        return RemoteFile(name=name or meta.path.rsplit("/", 1)[-1], sha256=meta.sha256,
                          size=meta.size, fetch=fetch, source="modelscope",
                          url=self.file_url(repo, meta.path, revision))

    def _check_reachable(self, repo: str, revision: str | None) -> None:
        """Raise OfflineError when the endpoint cannot be connected to (no network, no DNS,
        nothing listening), after the few quick retries the HF source makes (_retrying).
        modelscope-hub retries a refused connection itself, 1 + 2 + 4 s on a listing, for a
        host that is not there: a pull with no network took 7 s longer for nothing. One HEAD
        of the endpoint's root; any HTTP answer counts as reached (the library then asks, and
        keeps its retries for a hub that answers badly)."""
        if self._reached:
            return
        from .download import http_client, import_httpx

        httpx = import_httpx()
        where = f"modelscope:{repo}" + (f"@{revision}" if revision else "")

        def probe():
            try:
                http_client().head(f"{self.endpoint}/", follow_redirects=False)
            except (httpx.ConnectError, httpx.ConnectTimeout) as e:
                raise OfflineError(f"{where}: cannot reach {self.endpoint} ({type(e).__name__}); "
                                   "check your network") from None
            except httpx.TransportError:
                pass    # connected, then something else failed: the library's to retry and report

        _retrying(probe)
        self._reached = True

    def file_url(self, repo: str, path: str, revision: str) -> str:
        return (f"{self.endpoint}/api/v1/models/{repo}/repo?Revision={quote(revision, safe='')}"
                f"&FilePath={quote(path, safe='')}")

    @contextmanager
    def errors(self, repo: str, revision: str | None) -> Iterator[None]:
        """As HFHub.errors."""
        import modelscope_hub.errors as ms

        where = f"modelscope:{repo}" + (f"@{revision}" if revision else "")
        try:
            with _client_log_hushed():
                yield
        except ms.AuthenticationError:
            raise Unauthorized(f"{where}: 401 Unauthorized; set MODELSCOPE_API_TOKEN to a valid "
                               "token") from None
        except (ms.PermissionDeniedError, ms.PermissionError):
            raise Forbidden(f"{where}: 403 Forbidden; MODELSCOPE_API_TOKEN has no access") from None
        except ms.NotExistError as e:
            raise NotFound(f"{where}: not found on {self.label} ({_first_line(e)})") from None
        except ms.FileIntegrityError as e:
            raise IntegrityError(f"{where}: {_first_line(e)}; the download was discarded") from None
        except ms.NetworkError as e:
            raise OfflineError(f"{where}: cannot reach {self.endpoint} ({_first_line(e)}); check "
                               "your network") from None
        except ms.APIError as e:
            raise _http_error(where, getattr(e, "status_code", None), _first_line(e),
                              "MODELSCOPE_API_TOKEN", _retry_after(e)) from None
        except ms.HubError as e:
            raise RemoteError(f"{where}: {_first_line(e)}") from None


_log_lock = threading.Lock()
_log_hushed = [0, None]     # calls running with modelscope-hub's log hushed; the level before


@contextmanager
def _client_log_hushed() -> Iterator[None]:
    """modelscope-hub logs its own retries and failures ("2026-... | WARNING | modelscope_hub
    .legacy_api | ... retry in 1s (1/4)") to stderr, through a handler of its own: pull and
    the mirror report each failure themselves, once, in their words. Its warnings are hushed
    (errors still pass) while any of our calls runs, unless MODELSCOPE_LOG_LEVEL asks for them."""
    if os.environ.get("MODELSCOPE_LOG_LEVEL"):
        yield
        return
    import logging

    from modelscope_hub.utils.logger import get_logger

    logger = get_logger()   # configured (handler, level) before we set its level, not after
    with _log_lock:
        if _log_hushed[0] == 0:
            _log_hushed[1] = logger.level
            logger.setLevel(logging.ERROR)
        _log_hushed[0] += 1
    try:
        yield
    finally:
        with _log_lock:
            _log_hushed[0] -= 1
            if _log_hushed[0] == 0:
                logger.setLevel(_log_hushed[1])


_bars_lock = threading.Lock()
_bars_hushed = 0     # downloads running with modelscope-hub's bars off (pull fetches in threads)


@contextmanager
def _client_bars(show: bool) -> Iterator[None]:
    """modelscope-hub draws a tqdm bar per file on stderr, terminal or not (`pull -q`, logs),
    and download_file takes no switch for it: its module's tqdm is swapped for a disabled one
    while any download that should show none runs."""
    global _bars_hushed
    if show:
        yield
        return
    from modelscope_hub import _download as ms_download

    with _bars_lock:
        if _bars_hushed == 0:
            real = ms_download.tqdm
            ms_download.tqdm = lambda *a, **k: real(*a, **{**k, "disable": True})
            ms_download.tqdm.real = real
        _bars_hushed += 1
    try:
        yield
    finally:
        with _bars_lock:
            _bars_hushed -= 1
            if _bars_hushed == 0:
                ms_download.tqdm = ms_download.tqdm.real


# --- shared ------------------------------------------------------------------------------------

def _status(e) -> int | None:
    response = getattr(e, "response", None)
    return getattr(response, "status_code", None) or getattr(e, "status_code", None)


def _retry_after(e) -> float | None:
    """The seconds a hub asked to wait before a retry (Retry-After), where its client keeps it.

    huggingface_hub: HfHubHTTPError.response is the whole response, headers included.
    modelscope-hub: its errors keep no headers, except where its downloader attaches
    `.response`. A 429 (RateLimitError) carries `.retry_after`, read from delta-seconds only
    (an HTTP-date is dropped unless the download path parsed it); a 503 (ServerError) from its
    API keeps nothing of the header, so that one retries on our own backoff.
    """
    headers = getattr(getattr(e, "response", None), "headers", None)
    if headers is not None and headers.get("Retry-After") is not None:
        return retry_after_seconds(headers.get("Retry-After"))
    return retry_after_seconds(getattr(e, "retry_after", None))


def _http_error(where: str, status: int | None, text: str, token_env: str,
                retry_after: float | None = None) -> Exception:
    if status == 401:
        return Unauthorized(f"{where}: 401 Unauthorized; set {token_env} to a valid token")
    if status == 403:
        return Forbidden(f"{where}: 403 Forbidden; {token_env} has no access")
    if status == 404:
        return NotFound(f"{where}: 404 Not Found")
    if status in (409, 412):  # a tag that exists, or a branch that moved (parent_commit)
        return Conflict(f"{where}: {status} ({text[:400]})")
    asked = f"; the hub asked to wait {duration(retry_after)} before another request" \
        if retry_after is not None else ""
    error = RemoteError(f"{where}: {status or 'error'} from the hub ({text[:400]}){asked}")
    error.status = status   # callers retry 408/429/5xx only (zoo/mirror/runner.py)
    error.retry_after = retry_after   # download.retry_transient waits that long, or gives up
    return error


def _hf_text(e) -> str:
    """The client's summary line plus the server's own reason (huggingface_hub puts that on
    the lines after it): "Bad request" alone does not say what to fix."""
    lines = [ln.strip() for ln in str(e).strip().splitlines() if ln.strip()]
    first = lines[0].rstrip(":") if lines else type(e).__name__
    reason = (getattr(e, "server_message", None) or " ".join(lines[1:])).strip()
    reason = " ".join(reason.split())
    return f"{first}: {reason}" if reason and reason not in first else first


def _first_line(e: Exception, limit: int = 300) -> str:
    """The first line of e's message, kept readable: a urllib3 chain ("Connection failed:
    ...Pool(host=..., port=443): Max retries exceeded with url: ... (Caused by
    NameResolutionError("...: Failed to resolve 'host' (...)"))") as its first words and the
    cause's class and reason; anything still over `limit` cut at a word, with "...".
    Cut at a fixed length it broke off mid-word inside the pool's repr."""
    line = (str(e).strip().splitlines() or [type(e).__name__])[0]
    caused = _CAUSED_BY.search(line)
    if caused:
        head = line[:caused.start()].split(": ", 1)[0].strip()
        head = "" if "(" in head else head      # a pool's repr: the message names the host
        inner = caused.group("args")
        reason = next((inner.split(sep, 1)[1] for sep in (">: ", "): ", ">, ") if sep in inner),
                      inner).strip().strip("'\"")
        line = ": ".join(part for part in (head, caused.group("cls"), reason) if part)
    if len(line) <= limit:
        return line
    cut = line[:limit - 3].rsplit(" ", 1)[0].rstrip(" ,;:([{")
    return f"{cut}..."


_CAUSED_BY = re.compile(r"\(Caused by (?P<cls>\w+)\((?P<args>.*)\)\)\s*$")


def _is_connection_error(e: Exception) -> bool:
    names = {c.__name__ for c in type(e).__mro__}
    return bool(names & {"ConnectError", "ConnectTimeout", "ConnectionError", "NetworkError",
                         "RemoteProtocolError", "ReadTimeout", "TimeoutException"})


def hub(kind: str):
    return {"hf": HFHub, "modelscope": MSHub}[kind]()
