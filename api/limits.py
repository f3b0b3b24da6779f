"""Request size limits, enforced before the body is read: a declared Content-Length over the
limit is refused at once (413), and a chunked body is cut off when it passes the limit.

Uploads (multipart, to the two upload routes) may be as large as the `max_upload_bytes`
setting; any other body 1 MiB. The route decides, not the Content-Type: FastAPI reads a JSON
route's body before its token is checked.
Before answering 413 the rest of the body is read and dropped (up to DRAIN_LIMIT), because a
client still sending when the server closes sees a reset instead of the clear 413.

Only a route's body is limited: a request that no route takes (an unknown path, a method the
path does not answer) gets routing's 404 or 405, not a 413 for a body nothing would read. Its
body is drained all the same, for the reason above.
"""

from __future__ import annotations

import re

from fastapi import HTTPException
from starlette.routing import Match

from ..zoo import settings
from ..zoo.errors import PayloadTooLarge
from .errors import problem

OTHER_BODY_LIMIT = 1 << 20
DRAIN_LIMIT = 64 << 20
UPLOAD_ROUTES = re.compile(r"^/v1/(models/.+/versions|jobs/[^/]+/result)$")


class BodyLimit:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        is_upload = scope["method"] == "POST" and bool(UPLOAD_ROUTES.match(scope["path"]))
        limit = settings.get("max_upload_bytes") if is_upload else OTHER_BODY_LIMIT
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            if declared.isdigit() and int(declared) <= limit + DRAIN_LIMIT:
                await _drain(receive, 0)
            if not _routed(scope):      # routing answers 404/405, reading no body
                return await self.app(scope, receive, send)
            response = problem(413, PayloadTooLarge.title, _message(limit, is_upload),
                               scope.get("path"), headers={"Connection": "close"})
            return await response(scope, receive, send)
        seen = 0

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    if message.get("more_body"):
                        await _drain(receive, seen - limit)
                    # FastAPI's HTTPException: FastAPI turns any other error in reading a
                    # JSON body into 400 "error parsing the body"
                    raise HTTPException(413, _message(limit, is_upload))
            return message

        return await self.app(scope, limited_receive, send)


def _routed(scope) -> bool:
    """A route takes this method and path (the 413 is its answer). Asked only of a body over
    the limit: routing matches again after this, and most requests need not pay twice."""
    app = scope.get("app")      # Starlette puts itself here before its middleware runs
    if app is None:
        return True
    return any(route.matches(scope)[0] == Match.FULL for route in app.router.routes)


async def _drain(receive, already: int) -> None:
    """Read and drop the rest of the body, up to DRAIN_LIMIT bytes."""
    while already <= DRAIN_LIMIT:
        message = await receive()
        if message["type"] != "http.request":
            return
        already += len(message.get("body", b""))
        if not message.get("more_body"):
            return


def _message(limit: int, is_upload: bool) -> str:
    what = "uploads" if is_upload else "request bodies"
    hint = " (raise OSCAR_ZOO_MAX_UPLOAD_BYTES on the server)" if is_upload else ""
    return f"{what} are limited to {limit:,} bytes{hint}"
