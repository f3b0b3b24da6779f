"""Templates and the page route class: HTML errors for browsers, and render time on every page.

Pages raise the same domain errors as the JSON API (ModelNotFound, VersionNotFound, ...); the
page route turns them into an HTML page with the same status, title and suggestions that
api/errors.py puts into problem+json; any other exception is logged and answered with an HTML
500 page (not the API's JSON problem, which a browser shows as raw text). Each page reports its
server time in `Server-Timing`.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from fastapi.templating import Jinja2Templates
from markupsafe import Markup, escape
from sqlalchemy.exc import DataError
from starlette.exceptions import HTTPException

from ...zoo import __version__
from ...zoo.cli.output import plural, window_note
from ...zoo.errors import NotFound, OscarZooError

HERE = Path(__file__).parent
log = logging.getLogger("oscar_zoo.api")
templates = Jinja2Templates(directory=str(HERE / "templates"))


def human_size(n: int | None) -> str:
    if n is None:
        return ""
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def short_time(iso: str | None) -> str:
    """2026-11-22T10:03:04.000Z -> 2026-11-22 10:03 UTC."""
    return f"{iso[:10]} {iso[11:16]} UTC" if iso else ""


def ticked(text: str | None) -> Markup:
    """Messages name commands in `backticks` (as the CLI prints them): escaped, then <code>."""
    parts = str(escape(text or "")).split("`")
    return Markup("".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts)))


templates.env.filters.update(size=human_size, when=short_time, ticked=ticked, plural=plural)
templates.env.globals.update(app_version=__version__, window_note=window_note)


def page(request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
    return templates.TemplateResponse(request, name, context, status_code=status)


def error_page(request: Request, exc: Exception) -> Response:
    if isinstance(exc, RequestValidationError):
        first = (exc.errors() or [{}])[0]
        where = ".".join(str(p) for p in first.get("loc", ()))
        status, title, detail, hints = 422, "Invalid request", f"{where}: {first.get('msg', '')}", []
    elif isinstance(exc, OscarZooError):
        status, title, detail = exc.http_status, exc.title, str(exc)
        hints = exc.suggestions if isinstance(exc, NotFound) else []
        if status >= 500:       # as api/errors.py logs them: an operator has something to fix
            log.error("%s on %s %s: %s", type(exc).__name__, request.method, request.url.path, exc)
    else:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        status, title, hints = 500, "Internal error", []
        detail = "The registry hit an unexpected error; it has been logged on the server."
    return page(request, "error.html", {"title": title, "detail": detail, "status": status,
                                        "suggestions": hints}, status)


class PageRoute(APIRoute):
    """An HTML page: errors render as HTML (a bug's as a logged 500); Server-Timing is set."""

    def get_route_handler(self) -> Callable:
        handler = super().get_route_handler()

        async def timed(request: Request) -> Response:
            start = time.perf_counter()
            try:
                response = await handler(request)
            except (HTTPException, DataError):
                raise               # api/errors.py's handlers answer these (404, 422)
            except Exception as exc:    # noqa: BLE001 - a page answers a browser in HTML
                response = error_page(request, exc)
            ms = (time.perf_counter() - start) * 1000
            response.headers["Server-Timing"] = f"render;dur={ms:.1f}"
            return response

        return timed
