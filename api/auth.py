"""Writes need `Authorization: Bearer ozk_...` with a scope; reads are public.

    @router.post(..., dependencies=...)  or  actor: str = Depends(require("bundles:publish"))

The dependency returns the actor name recorded in created_by and the audit log. Tokens are
never logged: uvicorn's access log holds the request line only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ..registry_db.tokens import actor_of, authenticate, identify
from ..zoo.errors import Unauthorized

bearer = HTTPBearer(auto_error=False, description="A registry token: `oscar-zoo tokens create`")


def token_of(request: Request,
             credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> str | None:
    """The request's bearer token; None without an Authorization header. HTTPBearer reads
    any other scheme (`Token X`, `Basic ...`, a bare token) as no header at all, and the caller
    was told to send a token it had sent. Raises Unauthorized, never echoing the header."""
    if credentials is not None:
        return credentials.credentials
    sent = request.headers.get("authorization", "").strip()
    if sent and sent.split()[0].lower() != "bearer":
        raise Unauthorized("the Authorization header must use the Bearer scheme: send "
                           "'Authorization: Bearer ozk_...' (not 'Token', 'Basic' or the bare "
                           "token)")
    return None


@dataclass(frozen=True)
class Caller:
    """The token a request came with: its actor name (created_by, the audit log), its id (who
    owns a job: a revoked token's name may be reused) and its scopes."""
    actor: str
    token_id: int
    scopes: tuple[str, ...]

    @property
    def admin(self) -> bool:
        return "admin" in self.scopes

    def holds(self, scope: str) -> bool:
        return scope in self.scopes or self.admin


def caller(scope: str) -> Callable[..., Caller]:
    """require(scope), keeping the token's id and scopes besides its actor name."""
    def dependency(request: Request, token: str | None = Depends(token_of)) -> Caller:
        with request.app.state.registry.db.read() as session:
            row = authenticate(session, token, scope)
            return Caller(actor_of(row), row.id, tuple(row.scopes))

    dependency.__name__ = f"caller_{scope.replace(':', '_')}"
    return dependency


def require(scope: str) -> Callable[..., str]:
    def dependency(who: Caller = Depends(caller(scope))) -> str:
        return who.actor

    dependency.__name__ = f"require_{scope.replace(':', '_')}"
    return dependency


def whoami(request: Request, token: str | None = Depends(token_of)) -> dict:
    """GET /v1/whoami: the token's actor name and scopes (`oscar-zoo login` checks a token so)."""
    with request.app.state.registry.db.read() as session:
        row = identify(session, token)
        return {"actor": actor_of(row), "scopes": list(row.scopes)}
