"""Request-scoped access to the registry.

Endpoints open their read session themselves (`with reading(request) as session:`) instead of
taking it as a generator dependency: FastAPI runs such a dependency's setup and teardown in two
extra threadpool hops per request, a third of the per-request overhead of a metadata call.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from fastapi import Request
from sqlalchemy.orm import Session


def reading(request: Request) -> AbstractContextManager[Session]:
    return request.app.state.registry.db.read()
