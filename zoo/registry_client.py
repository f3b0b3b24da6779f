"""HTTP client of the oscar-zoo registry API (`/v1`), used by pull, list, show, publish, mirror.

    client = RegistryClient()                  # OSCAR_ZOO_ENDPOINT, token from env or `login`
    client.version("glm-4.7-fp8", "recommended")
    client.publish("bundle_dir/")              # needs a token with scope bundles:publish

Model names may be catalog names, aliases or hub ids (`zai-org/GLM-4.7-FP8`; the slash is
passed as is, the API's routes take `{name:path}`). Errors come back as application/problem+json
and are raised as our domain errors (zoo.errors), with the server's explanation. Idempotent
reads are retried on connection errors and 5xx other than 507 (a full disk); writes are not
retried. A read the local cache could answer offline says so when the registry cannot be
reached (`cache_hint`).
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import quote, urlsplit

from . import settings
from .errors import (Conflict, ConfigError, Forbidden, InvalidInput, JobCancelled, ModelNotFound,
                     NotFound, OfflineError, PayloadTooLarge, RemoteError, RemoteStorageFull,
                     TRY_LATER, Unauthorized, VersionNotFound)

TOKEN_FILE = "token"
# Where a registry's tokens come from, for a client of it: not `oscar-zoo tokens create` run
# here, which writes to this host's own database (zoo/cli/registry_cmds.py refuses that while
# OSCAR_ZOO_ENDPOINT points elsewhere)
TOKEN_ORIGIN = ("a registry's tokens are created on its host, by its admin, with "
                "`oscar-zoo tokens create`")
OFFLINE_HINT = ", or set OSCAR_ZOO_OFFLINE=1 to read only the local cache, without trying the registry"


def stored_token_path() -> Path:
    return Path(settings.get("config_dir")) / TOKEN_FILE


def current_token() -> str | None:
    """OSCAR_ZOO_TOKEN, else the token `oscar-zoo login` stored."""
    token = _clean(settings.get("token"))
    if token:
        return token
    try:
        return stored_token_path().read_text().strip() or None
    except OSError:
        return None


def _clean(token: str | None) -> str | None:
    # a token set from a secret file keeps its trailing newline (a Kubernetes secret in the
    # environment, a CI variable read from a file): sent so, the header is illegal, and every
    # request, public reads too, failed as "cannot reach the registry"
    return (token or "").strip() or None


# A registry token's shape (registry_db.tokens makes them so): the registry refuses any other
# before a lookup, and `login` before storing it, with the same words
TOKEN_SHAPE = re.compile(r"ozk_[A-Za-z0-9_-]{43}")
MALFORMED_TOKEN = "malformed token: registry tokens look like ozk_ followed by 43 characters"


def store_token(token: str) -> Path:
    """Write the token to the user config dir, readable by the user only (0600)."""
    path = stored_token_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    # a new file of our own (O_EXCL, mode 0600 from the start), not a fixed temp name: opening
    # one that was already there followed a symlink planted at it, wrote the token through it and
    # then moved the link into place, and two logins at once wrote into the same file
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        try:
            os.write(fd, (token.strip() + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def remove_stored_token() -> Path | None:
    """Delete the token `oscar-zoo login` stored: its path, or None where none was stored.
    OSCAR_ZOO_TOKEN is the caller's to report: a process cannot unset its shell's variable."""
    path = stored_token_path()
    try:
        path.unlink()
    except FileNotFoundError:
        return None
    return path


def check_endpoint(endpoint: str, name: str = "OSCAR_ZOO_ENDPOINT") -> None:
    """Raise ConfigError unless `endpoint` is an http(s) URL with a host: without its scheme
    (127.0.0.1:8000) httpx refused it as UnsupportedProtocol, told as a network problem."""
    try:
        parts = urlsplit(endpoint)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # read for its check: a port that is no number
    except ValueError:
        ok = False
    if ok:
        return
    if "://" not in endpoint:   # the usual slip: host:port alone; shown with any password masked
        shown = settings.redact_url(f"http://{endpoint}").removeprefix("http://")
        raise ConfigError(f"{name} must start with http:// or https://, got {shown!r}: use "
                          f"http://{shown}")
    raise ConfigError(f"{name} must be an http:// or https:// URL with a host, got "
                      f"{settings.redact_url(endpoint)!r} (e.g. http://127.0.0.1:8000)")


# --- names in URL paths ------------------------------------------------------------------------
# Checked before a URL is built, by the registry's own rules: httpx resolves dot segments, so a
# name such as ../../x left the model's routes (`publish --name ../../etc/passwd` met the upload
# size limit, `pull ../../x` "no endpoint at /x"), and a name the registry can never hold is
# better refused here, saying why, than answered by whatever route it lands on.

def _model_name_rule() -> str:
    from .catalog import PLAIN_NAME_RULE

    return (f"a model is named by a plain name, {PLAIN_NAME_RULE}, or by a hub id ORG/REPO "
            "(e.g. Qwen/Qwen3-8B)")


def _name(name: str) -> str:
    """A model's name as a URL path: a name (any case), an `org--repo`, or a hub id (whose
    slash stays: the routes take `{name:path}`); the registry's resolve_model reads the same."""
    from .catalog import MODEL_NAME, is_hub_id

    name = name.strip()
    if not (MODEL_NAME.fullmatch(name.lower()) or is_hub_id(name)
            or is_hub_id(name.replace("--", "/"))):
        from .catalog import suggest

        # not found, as the registry would answer, so that pull's hints (and other sources) apply
        # its own sentence: NotFound appends "Did you mean: ...?" after a space
        raise ModelNotFound(f"model name {name!r} is not valid: {_model_name_rule()}.",
                            suggestions=suggest(name))
    return quote(name, safe="/")


def _ref(ref: str | int) -> str:
    """A version number or an alias (any case: the registry looks aliases up in lower case), as
    pull's NAME@REF reads them (sources.base.ALIAS_REF)."""
    from .catalog import ALIAS_RULE, VERSION_REF
    from .sources.base import ALIAS_REF

    text = str(ref).strip()
    if not (VERSION_REF.fullmatch(text.lower()) or ALIAS_REF.fullmatch(text.lower())):
        raise InvalidInput(f"{text!r} is neither a version number nor an alias: give a number "
                           f"(e.g. 3) or an alias; for an alias, {ALIAS_RULE}")
    return quote(text, safe="")


def _alias(alias: str, stored: bool = False) -> str:
    """An alias to set or remove: exactly as the registry stores it (it does not lower-case
    these, so `Prod` is refused there too). stored: one to remove, which may predate the rule
    against v<N> and rotationzoo* names (catalog.STORED_ALIAS)."""
    from .catalog import ALIAS_NAME, ALIAS_RULE, STORED_ALIAS

    alias = (alias or "").strip()
    if not (STORED_ALIAS if stored else ALIAS_NAME).fullmatch(alias):
        raise InvalidInput(f"alias {alias!r} is not valid: {ALIAS_RULE}")
    return quote(alias, safe="")


# --- what the cache could answer offline ---------------------------------------------------------
# Each mirrors how offline mode serves that read (zoo/pull.py from_cache, the `show` and `list`
# commands), so "set OSCAR_ZOO_OFFLINE=1" is said only where it would give an answer: with
# another model cached, offline mode would only fail the same read again.

def _hint(wanted: bool, holds: Callable, *args) -> Callable[[], bool] | None:
    """The `cached` check of a read: holds(cache, *args), asked only on a connection error."""
    return partial(_cache_holds, holds, *args) if wanted else None


def _cache_holds(holds: Callable, *args) -> bool:
    from .cache import Cache

    try:
        return holds(Cache(), *args)
    except (OSError, ValueError):   # a cache dir that cannot be read, a bad OSCAR_ZOO_CACHE,
        return False                # a name no cache dir can have


def _cache_name(cache, name: str) -> str:
    """The model's directory name in the cache, as pull names it (pull.cached_name): the
    catalog's name for any of its aliases and hub ids, else the cache's (a model only the
    registry knows, by its name or its hub id)."""
    from .catalog import find
    from .pull import cached_name

    return cached_name(cache, find(name), name.strip())


def _holds_model(cache, name: str) -> bool:
    return next(cache.held(_cache_name(cache, name)), None) is not None


def _holds_version(cache, name: str, ref: str | int) -> bool:
    """The ref's bundle is cached, whole or in --layers parts (what offline pull and show read:
    refs/v3, refs/recommended)."""
    from .sources.base import parse_spec

    model = _cache_name(cache, name)
    held = {h.digest for h in cache.held(model)}
    return any(cache.read_ref(model, r) in held for r in parse_spec(f"{name}@{ref}")[1].cache_refs())


def _holds_listed(cache, q: str | None) -> bool:
    """A model offline `list` shows as cached: a catalog model (list offline knows no other)
    matching the glob, by name or hub id, with a bundle in the cache."""
    from .catalog import listed

    return any(next(cache.held(e.name), None) is not None for e in listed(q))


# paths that never answer 404 from a registry: a 404 there is from another server
_SERVED_BY_EVERY_REGISTRY = ("/v1/models", "/v1/jobs", "/v1/whoami")


# a problem's standard members (RFC 9457); the others are its extensions
_PROBLEM_MEMBERS = frozenset({"type", "title", "status", "detail", "instance"})


class RegistryClient:
    def __init__(self, endpoint: str | None = None, token: str | None = None):
        self.endpoint = (endpoint or settings.get("endpoint") or "").rstrip("/")
        # what the messages call it: `worker --registry URL` passes its own
        self.endpoint_name = "OSCAR_ZOO_ENDPOINT" if not endpoint else "the registry URL"
        self.where = settings.redact_url(self.endpoint)  # for messages: never its password
        self.token = _clean(token) if token is not None else current_token()
        # where a refused token came from decides how to replace it (`oscar-zoo worker` passes
        # OSCAR_ZOO_TOKEN's value in itself)
        self.token_from_env = self.token is not None and self.token == _clean(settings.get("token"))
        self._http = None

    @property
    def configured(self) -> bool:
        return bool(self.endpoint)

    def http(self):
        if not self.endpoint:
            raise ConfigError("no registry configured: set OSCAR_ZOO_ENDPOINT (e.g. "
                              "http://127.0.0.1:8000) or use the hub sources")
        if self._http is None:
            check_endpoint(self.endpoint, self.endpoint_name)
            from .sources.download import new_client

            self._http = new_client(base_url=self.endpoint, headers=self.auth_headers)
        return self._http

    def close(self) -> None:
        if self._http is not None:
            self._http.close()
            self._http = None

    def __enter__(self) -> "RegistryClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def auth_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def url(self, path: str) -> str:
        return path if path.startswith(("http://", "https://")) else f"{self.endpoint}{path}"

    # --- requests ----------------------------------------------------------------------------

    def request(self, method: str, path: str, *, retry: bool | None = None,
                cached: Callable[[], bool] | None = None, **kwargs):
        """cached: for a read that offline mode answers from the local cache, whether the cache
        holds the answer to this one; asked only when the registry cannot be reached, whose
        error then says that OSCAR_ZOO_OFFLINE=1 serves it. None: nothing to suggest (whoami,
        jobs and writes, which only the registry answers)."""
        from .sources.download import import_httpx

        httpx = import_httpx()

        retry = method in ("GET", "HEAD") if retry is None else retry
        attempts = 1 + (min(int(settings.get("http_retries")), 3) if retry else 0)
        for attempt in range(attempts):
            try:
                r = self.http().request(method, path, **kwargs)
            except httpx.TransportError as e:
                if attempt + 1 < attempts:
                    time.sleep(min(0.25 * 2 ** attempt, 4.0))
                    continue
                raise OfflineError(
                    f"cannot reach the registry at {self.where} ({type(e).__name__}); check "
                    f"{self.endpoint_name} and your network"
                    f"{OFFLINE_HINT if cached is not None and cached() else ''}") from None
            # 507: the registry's disk is full, and stays so until its operator makes room
            if r.status_code >= 500 and r.status_code != 507 and attempt + 1 < attempts:
                time.sleep(min(0.25 * 2 ** attempt, 4.0))
                continue
            if r.status_code >= 400:
                raise self.error_of(r)
            return r
        raise AssertionError("unreachable")

    def get_json(self, path: str, *, cached: Callable[[], bool] | None = None, **params) -> Any:
        params = {k: v for k, v in params.items() if v is not None}
        return self.json_of(self.request("GET", path, params=params or None, cached=cached))

    def json_of(self, r) -> Any:
        """The body as JSON; a web page (a proxy's or a login portal's, or an endpoint that is
        not the registry) is a RemoteError naming the endpoint, so pull moves on to the hubs."""
        try:
            return r.json()
        except ValueError:
            kind = r.headers.get("Content-Type", "no content type").split(";")[0]
            raise RemoteError(f"registry {self.where}: {r.request.url.path} answered "
                              f"{r.status_code} with {kind}, not JSON; is OSCAR_ZOO_ENDPOINT the "
                              "oscar-zoo registry's base URL?") from None

    def error_of(self, r) -> Exception:
        """The domain error (zoo.errors) for a refused response r, as request() raises it;
        for callers that read a response themselves (a job's event stream)."""
        try:
            body = r.json()
        except ValueError:
            body = {}
        detail = body.get("detail") if isinstance(body, dict) else None
        if not isinstance(detail, str):
            detail = f"{r.status_code} {r.reason_phrase}"
        title = body.get("title", "") if isinstance(body, dict) else ""
        where = f"registry {self.where}"
        code = r.status_code
        if code == 404:
            cls = {"Model not found": ModelNotFound, "Version not found": VersionNotFound,
                   "Alias not found": VersionNotFound}.get(title, NotFound)
            err = cls(f"{where}: {detail}{self._not_a_registry(r)}")
            err.suggestions = list(body.get("suggestions") or []) if isinstance(body, dict) else []
            return err
        if code == 401:
            return Unauthorized(f"{where}: {self._refusal(detail)}")
        if code == 403:
            return Forbidden(f"{where}: {self._lacking(body) or detail}")
        if code == 409:
            cls = JobCancelled if title == JobCancelled.title else Conflict
            return cls(f"{where}: {detail}")
        if code == 413:
            return PayloadTooLarge(f"{where}: {detail}")
        # TRY_LATER says nothing of the request itself: RemoteErrors with their status, which
        # pull may stand a cached copy in for, as for a 5xx
        if 400 <= code < 500 and code not in TRY_LATER:
            err = InvalidInput(f"{where}: {detail}")
            # the members beside the standard ones (api/errors.py extensions_of): facts a command
            # acts on without parsing the detail, such as publish's bundle_model
            err.extensions = ({k: v for k, v in body.items() if k not in _PROBLEM_MEMBERS}
                              if isinstance(body, dict) else {})
            return err
        if code == 507:     # the detail says what the registry was writing and how to make room
            return RemoteStorageFull(f"{where}: {detail}")
        said = f"{code} {title or r.reason_phrase}"
        # a proxy's page carries no detail: "503 Service Unavailable" once, not twice
        err = RemoteError(f"{where}: {said}" + (f": {detail}" if detail != said else ""))
        err.status = code   # what is_transient and pull's cache fallback decide by
        if code in TRY_LATER or code == 503:    # how long it asks to be left alone, for the worker
            from .sources.download import retry_after_seconds

            err.retry_after = retry_after_seconds(r.headers.get("Retry-After"))
        return err

    def _not_a_registry(self, r) -> str:
        """For a 404 of a path every oscar-zoo registry serves (the API root, a listing), the
        likely cause: the endpoint is another server (`python -m http.server`, a web site) or
        the registry's URL with a path too many or too few. A model's, a version's or a job's
        404 is the registry's answer about that name, and says nothing of the endpoint."""
        from urllib.parse import urlsplit

        try:
            path = r.request.url.path.rstrip("/")
        except RuntimeError:    # a response built by hand, with no request
            return ""
        # the path below the endpoint's own (a registry behind a proxy at /zoo): `endswith`
        # took /v1/models/v1 (a model named v1) for the API root
        base = urlsplit(self.endpoint).path.rstrip("/")
        if not path.startswith(base) or path[len(base):] not in _SERVED_BY_EVERY_REGISTRY:
            return ""
        return (f"; every oscar-zoo registry serves {r.request.url.path}, so {self.endpoint_name} "
                f"({self.where}) may not point at one: set it to the registry's base URL (e.g. "
                "http://127.0.0.1:8000, without /v1)")

    def _refusal(self, detail: str) -> str:
        """A 401 told once: why (the registry's reason), then what to do here. The registry's
        detail ends in advice for whoever calls its API on its own host (send an Authorization
        header, run `oscar-zoo tokens create`); said beside ours it was advice twice, and
        `tokens create` run here makes a token in this host's database, which the registry
        refuses again."""
        # its reasons say "what; how to fix"; with no token sent, the reason can only be that
        reason = detail.split("; ", 1)[0] if self.token else "this needs a token"
        if self.token_from_env:     # it overrides the stored one: `login` would change nothing
            fix = ("the token in OSCAR_ZOO_TOKEN was refused: set it to a live token, or unset "
                   "it to use the one `oscar-zoo login` stores")
        elif self.token:
            fix = "run `oscar-zoo login` again with a live token"
        else:
            fix = "run `oscar-zoo login`, or set OSCAR_ZOO_TOKEN"
        return f"{reason}; {fix} ({TOKEN_ORIGIN})"

    def _lacking(self, body: Any) -> str | None:
        """A 403 for a scope the token lacks (the registry's `required_scope`), told as what to
        ask for and from whom; None for any other 403 (another token's job, a path outside the
        job dirs), whose detail says why. The registry's own advice, `tokens create`, is its
        host operator's command: run here, it makes a token in this host's database."""
        scope = body.get("required_scope") if isinstance(body, dict) else None
        if not isinstance(scope, str) or not scope:
            return None
        held = body.get("token_scopes")
        has = (f" (its scopes: {', '.join(map(str, held))})" if isinstance(held, list) and held
               else "")
        then = ("then set OSCAR_ZOO_TOKEN to it (it overrides the token `oscar-zoo login` "
                "stores)" if self.token_from_env else "then `oscar-zoo login` with it")
        return (f"the token lacks scope {scope}{has}; ask the registry's operator for a token "
                f"with {scope} (on the registry host: `oscar-zoo tokens create --scope {scope} "
                f"...`), {then}")

    # --- reads -------------------------------------------------------------------------------

    # cache_hint=False: a caller for whom OSCAR_ZOO_OFFLINE=1 would not help, though the cache
    # holds the answer: pull, which falls back to the cache by itself, or a read ahead of a write

    def model(self, name: str, *, cache_hint: bool = True) -> dict:
        return self.get_json(f"/v1/models/{_name(name)}",
                             cached=_hint(cache_hint, _holds_model, name))

    def version(self, name: str, ref: str | int, *, cache_hint: bool = True) -> dict:
        """Version detail: {model, version, status, digest, manifest, files[{name, sha256, size,
        url}], aliases, ...}. `ref` is a number or an alias."""
        return self.get_json(f"/v1/models/{_name(name)}/versions/{_ref(ref)}",
                             cached=_hint(cache_hint, _holds_version, name, ref))

    def versions(self, name: str, status: str | None = None, *,
                 cache_hint: bool = True) -> Iterator[dict]:
        yield from self._pages(f"/v1/models/{_name(name)}/versions", status=status,
                               cached=_hint(cache_hint, _holds_model, name))

    def whoami(self) -> dict:
        """{actor, scopes} of this client's token; Unauthorized when it has none or it is refused."""
        r = self.request("GET", "/v1/whoami")
        return self.json_of(r)

    def models(self, q: str | None = None, published: bool = False, *,
               cache_hint: bool = True) -> Iterator[dict]:
        # offline, `list --validated` keeps nothing: validation comes from the registry alone
        yield from self._pages("/v1/models", q=q, published="true" if published else None,
                               cached=_hint(cache_hint and not published, _holds_listed, q))

    def _pages(self, path: str, *, cached: Callable[[], bool] | None = None,
               **params) -> Iterator[dict]:
        cursor = None
        while True:
            body = self.get_json(path, cursor=cursor, limit=200, cached=cached, **params)
            yield from body.get("items", [])
            cursor = body.get("next_cursor")
            if not cursor:
                return

    def aliases(self, name: str) -> dict:
        return self.get_json(f"/v1/models/{_name(name)}/aliases")

    def mirrors(self, name: str, ref: str | int) -> list[dict]:
        return self.get_json(f"/v1/models/{_name(name)}/versions/{_ref(ref)}/mirrors")["items"]

    def file_url(self, model: str, version: int, filename: str) -> str:
        return self.url(f"/v1/models/{_name(model)}/versions/{version}/files/{quote(filename)}")

    def layers_url(self, model: str, version: int, spec: str) -> str:
        return self.url(f"/v1/models/{_name(model)}/versions/{version}/layers.safetensors"
                        f"?layers={quote(spec, safe=',-')}")

    # --- writes ------------------------------------------------------------------------------

    def publish(self, bundle_dir: str | Path, name: str | None = None, status: str | None = None,
                source_job: str | None = None) -> tuple[dict, bool]:
        """Upload a bundle directory as a new version; returns (version detail, created).

        The registry verifies it like `oscar-zoo inspect`; publishing identical content again
        returns the existing version with created=False.
        """
        import json

        from .manifest import MANIFEST

        bundle_dir = Path(bundle_dir)
        manifest = json.loads((bundle_dir / MANIFEST).read_text())
        name = name or manifest["model"]["name"]
        names = [MANIFEST] + [f["name"] for f in manifest.get("files", [])]
        data = {k: v for k, v in (("status", status), ("source_job", source_job)) if v}
        path = f"/v1/models/{_name(name)}/versions"     # a bad name before any file is opened
        handles = [open(bundle_dir / n, "rb") for n in names]
        try:
            files = [(n, (n, h, "application/octet-stream")) for n, h in zip(names, handles)]
            r = self.request("POST", path, files=files, data=data, retry=False)
        finally:
            for h in handles:
                h.close()
        return self.json_of(r), r.status_code == 201

    def set_alias(self, name: str, alias: str, version: int, reason: str | None = None) -> dict:
        body = {"version": version, **({"reason": reason} if reason else {})}
        return self.request("PUT", f"/v1/models/{_name(name)}/aliases/{_alias(alias)}",
                            json=body).json()

    def remove_alias(self, name: str, alias: str, reason: str | None = None) -> dict:
        return self.request("DELETE", f"/v1/models/{_name(name)}/aliases/{_alias(alias, stored=True)}",
                            params={"reason": reason} if reason else None).json()

    def yank(self, name: str, ref: str | int, reason: str) -> dict:
        return self.request("POST", f"/v1/models/{_name(name)}/versions/{_ref(ref)}/yank",
                            json={"reason": reason}).json()

    def promote(self, name: str, ref: str | int) -> dict:
        return self.request("POST", f"/v1/models/{_name(name)}/versions/{_ref(ref)}/publish").json()
