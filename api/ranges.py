"""Serving stored bytes over HTTP: ETag, If-None-Match, single byte ranges, HEAD.

Multi-range and malformed Range headers are ignored (the whole file is sent), as RFC 9110
allows; an unsatisfiable range is a 416 problem.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import AsyncIterator

import anyio
from fastapi import Request, Response
from fastapi.responses import StreamingResponse

from ..zoo.errors import RangeNotSatisfiable

CHUNK = 1 << 20
# at most 18 digits: no file is that large, and int() of over 4,300 digits raises; a longer
# range is not one we can serve, so the whole file is sent
_RANGE = re.compile(r"^bytes=(\d{0,18})-(\d{0,18})$")


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """[start, end) of a single-range header, None to send everything.

    Raises RangeNotSatisfiable for a range that starts past the end.
    """
    m = _RANGE.match((header or "").strip())
    if not m or (not m.group(1) and not m.group(2)) or size == 0:
        return None     # an empty file has no byte to point at: it is sent whole, as 200
    first, last = m.group(1), m.group(2)
    if not first:  # suffix: the last N bytes
        n = int(last)
        if n == 0:
            raise _unsatisfiable(size)
        return max(0, size - n), size
    start = int(first)
    end = size if not last else min(int(last) + 1, size)
    if last and int(last) < start:
        return None
    if start >= size:
        raise _unsatisfiable(size)
    return start, end


def _unsatisfiable(size: int) -> RangeNotSatisfiable:
    e = RangeNotSatisfiable(f"the file has {size} bytes; ask for a range inside 0-{max(size - 1, 0)}")
    e.size = size
    return e


def etag_matches(header: str | None, etag: str) -> bool:
    if not header:
        return False
    tags = [t.strip().removeprefix("W/") for t in header.split(",")]
    return "*" in tags or etag in tags


async def _read_file(path: Path, start: int, end: int) -> AsyncIterator[bytes]:
    f = await anyio.open_file(path, "rb")
    try:
        await f.seek(start)
        left = end - start
        while left > 0:
            chunk = await f.read(min(CHUNK, left))
            if not chunk:
                break
            left -= len(chunk)
            yield chunk
    finally:
        await f.aclose()


def file_response(request: Request, path: Path, size: int, sha256: str, media_type: str,
                  immutable: bool, filename: str | None = None) -> Response:
    etag = f'"{sha256}"'
    headers = {"ETag": etag, "Accept-Ranges": "bytes",
               # By number the bytes never change; through an alias they may: revalidate.
               "Cache-Control": "public, max-age=31536000, immutable" if immutable else "no-cache",
               # stored bytes are data: no type sniffing, no scripts even if a browser renders them
               "X-Content-Type-Options": "nosniff", "Content-Security-Policy": "sandbox"}
    if filename:
        headers["Content-Disposition"] = f'attachment; filename="{filename}"'
    if etag_matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers=headers)
    if_range = request.headers.get("if-range")
    # a client whose partial copy is of other bytes gets everything, whatever its Range says
    fresh = if_range is None or if_range.strip() == etag
    rng = parse_range(request.headers.get("range"), size) if fresh else None
    start, end = rng if rng else (0, size)
    headers["Content-Length"] = str(end - start)
    status = 200
    if rng:
        status = 206
        headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
    if request.method == "HEAD":
        return Response(status_code=status, headers=headers, media_type=media_type)
    return StreamingResponse(_read_file(path, start, end), status_code=status, headers=headers,
                             media_type=media_type)
