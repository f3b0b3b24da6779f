"""The one place errors become HTTP: RFC 9457 `application/problem+json`, never a stack trace.

Domain errors (zoo.errors.OscarZooError) carry their status and title; FastAPI's validation
errors and Starlette's HTTP errors (unknown route, wrong method) get the same shape, except an
unknown page a browser asks for, off /v1/: a small HTML 404 (api/ui's error page). A value the
database refuses (sqlalchemy DataError: too long for its column, a NUL on PostgreSQL) is the
request's fault too, where a check upstream missed it: 422, not 500.
"""

from __future__ import annotations

import logging
from http import HTTPStatus

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DataError
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..zoo.errors import (NotFound, OscarZooError, PayloadTooLarge, RangeNotSatisfiable,
                          StorageFull, Unauthorized, UnsupportedMediaType)

PROBLEM = "application/problem+json"
log = logging.getLogger("oscar_zoo.api")


class ProblemResponse(JSONResponse):
    media_type = PROBLEM


def problem(status: int, title: str, detail: str, instance: str | None = None,
            headers: dict[str, str] | None = None, **extra) -> ProblemResponse:
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail}
    if instance:
        body["instance"] = instance
    body.update({k: v for k, v in extra.items() if v is not None})
    return ProblemResponse(body, status_code=status, headers=headers)


async def domain_error(request: Request, exc: OscarZooError) -> ProblemResponse:
    headers = {}
    if isinstance(exc, Unauthorized):
        headers["WWW-Authenticate"] = 'Bearer realm="oscar-zoo"'
    if isinstance(exc, RangeNotSatisfiable) and getattr(exc, "size", None) is not None:
        headers["Content-Range"] = f"bytes */{exc.size}"
    if exc.http_status >= 500:
        # the answer names no server path; the operator's log says which directory is full
        where = f" [{exc.path}]" if isinstance(exc, StorageFull) and exc.path else ""
        log.error("%s on %s %s: %s%s", type(exc).__name__, request.method, request.url.path, exc,
                  where)
    suggestions = exc.suggestions if isinstance(exc, NotFound) and exc.suggestions else None
    return problem(exc.http_status, exc.title, str(exc), request.url.path, headers or None,
                   suggestions=suggestions, **extensions_of(exc))


# the standard members, and the names problem() and domain_error take for themselves
_MEMBERS = frozenset({"type", "title", "status", "detail", "instance", "headers", "suggestions"})


def extensions_of(exc: OscarZooError) -> dict:
    """RFC 9457 extension members an error carries (`exc.extensions`, set where it is raised):
    facts a client acts on without parsing the detail, such as the scope a token lacks. None
    may replace a standard member, which the status and title of the error decide."""
    extensions = getattr(exc, "extensions", None) or {}
    return {k: v for k, v in extensions.items() if k not in _MEMBERS}


JSON_BODY = "send Content-Type: application/json with a JSON object"


async def validation_error(request: Request, exc: RequestValidationError) -> ProblemResponse:
    errors = [{"loc": [str(p) for p in e.get("loc", ())], "msg": e.get("msg", "")}
              for e in exc.errors()[:20]]
    first = errors[0] if errors else {"loc": [], "msg": "invalid request"}
    where = ".".join(first["loc"]) or "request"
    detail = _not_a_json_object(request, exc.errors()) or f"{where}: {first['msg']}"
    return problem(422, "Invalid request", detail, request.url.path, errors=errors)


def _not_a_json_object(request: Request, errors) -> str | None:
    """The body as a whole was no JSON object, or None. FastAPI says "Input should be a valid
    dictionary or object to extract fields from" for a body it did not read as JSON (curl's -d
    sends application/x-www-form-urlencoded) and for a JSON array or string alike, which tells
    no one to set the Content-Type."""
    for e in errors:
        loc, kind = tuple(e.get("loc", ())), e.get("type")
        if kind == "json_invalid" and loc[:1] == ("body",):
            why = (e.get("ctx") or {}).get("error")
            return f"body: not valid JSON{f' ({why})' if why else ''}: {JSON_BODY}"
        if loc != ("body",):
            continue
        if kind == "missing":
            return f"body: empty: {JSON_BODY}"
        if kind in ("model_attributes_type", "dict_type"):
            if isinstance(e.get("input"), bytes):   # left unparsed: not sent as JSON
                sent = request.headers.get("content-type") or "no Content-Type"
                return (f"body: not read as JSON, as it came with {sent}: {JSON_BODY} "
                        "(curl: -H 'Content-Type: application/json' -d '{...}')")
            return f"body: a JSON {_json_kind(e.get('input'))}, not an object: {JSON_BODY}"
    return None


def _json_kind(value) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    return "number" if isinstance(value, (int, float)) else "null"


def quality(accept: str, media: str) -> float:
    """The q an Accept header gives `media`: that of its most specific matching range."""
    ranks = {media: 2, f"{media.split('/')[0]}/*": 1, "*/*": 0}
    best, rank = 0.0, -1
    for part in accept.lower().split(","):
        kind, *params = [p.strip() for p in part.split(";")]
        if ranks.get(kind, -1) > rank:
            q = next((p[2:] for p in params if p.startswith("q=")), "1")
            try:
                best, rank = float(q), ranks[kind]
            except ValueError:
                continue
    return best


def wants_page(request: Request) -> bool:
    """A browser off the JSON API: Accept ranks text/html above JSON (`*/*` alone, as curl and
    httpx send, ranks them equal and keeps problem+json)."""
    accept = request.headers.get("accept", "")
    path = request.url.path
    return (path != "/v1" and not path.startswith("/v1/")
            and quality(accept, "text/html") > quality(accept, "application/json"))


# Statuses that one domain error answers, titled as it is when Starlette's HTTPException gives
# one: api/limits.py must raise that (FastAPI makes any other error while it reads a body a 400),
# and a client telling 413s apart by title saw "Request Entity Too Large" for a chunked body
_DOMAIN_TITLES = {e.http_status: e.title
                  for e in (PayloadTooLarge, UnsupportedMediaType, RangeNotSatisfiable)}


def http_title(status: int) -> str:
    if status in _DOMAIN_TITLES:
        return _DOMAIN_TITLES[status]
    return HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else "Error"


async def http_error(request: Request, exc: StarletteHTTPException):
    status = exc.status_code
    title = http_title(status)
    detail = exc.detail if isinstance(exc.detail, str) else title
    if status == 404 and detail == "Not Found":
        if wants_page(request):
            from .ui.render import page   # here: the UI imports the API, not the other way round
            return page(request, "error.html", {"title": title, "status": 404, "suggestions": [],
                                                "detail": f"No page at {request.url.path}."}, 404)
        detail = f"no endpoint at {request.url.path}; the API is described at /docs"
    return problem(status, title, detail, request.url.path, getattr(exc, "headers", None))


async def data_error(request: Request, exc: DataError) -> ProblemResponse:
    # logged: each one is a check missing before the write, to add where the value comes in
    log.warning("database refused a value on %s %s: %s", request.method, request.url.path,
                exc.orig)
    return problem(422, "Invalid input", "a value in the request cannot be stored (too long, out "
                   "of range, or holding a NUL character); shorten or clean it and retry", request.url.path)


class UnexpectedErrors:
    """Any other exception: logged, answered with a 500 problem, and the connection kept.
    Starlette's handler for Exception answers and then re-raises, and uvicorn then resets the
    keep-alive connection under the client's next request. A domain error raised by a
    middleware (a bad setting it reads per request), outside FastAPI's handlers, gets the
    problem domain_error gives it in a route."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracked(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception as exc:
            if started:     # half a response is out: only dropping the connection tells the client
                raise
            if isinstance(exc, OscarZooError):
                response = await domain_error(Request(scope), exc)
            else:
                log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
                response = problem(500, "Internal error", "the registry hit an unexpected error; "
                                   "it has been logged on the server", scope.get("path"))
            await response(scope, receive, send)


def install(app: FastAPI) -> None:
    """Call after adding the app's other middleware: UnexpectedErrors must wrap them too."""
    app.add_exception_handler(OscarZooError, domain_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(DataError, data_error)
    app.add_middleware(UnexpectedErrors)
