"""Aliases of a model's versions: current targets and the full history of moves."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request
from sqlalchemy.orm import Session

from ...registry_db import queries
from ...registry_db.aliases import check_alias_name, move_alias
from ...zoo.errors import AliasNotFound
from .. import serialize
from ..auth import require
from ..deps import reading
from ..schemas import AliasList, AliasRequest

router = APIRouter(tags=["aliases"])


def alias_body(session: Session, model, alias: str | None = None, limit: int = 50,
               cursor: str | None = None) -> dict:
    current = [a for a in queries.current_aliases(session, model) if alias in (None, a.name)]
    page = queries.alias_history(session, model, alias, limit, cursor)
    return {"model": model.name, "items": [serialize.alias_info(a) for a in current],
            "history": [serialize.alias_event(*item) for item in page.items],
            "next_cursor": page.next_cursor}


@router.get("/v1/models/{name:path}/aliases", response_model=AliasList,
            summary="Current aliases and their history")
def list_aliases(name: str, request: Request,
                 limit: int = Query(50, ge=1, le=queries.MAX_LIMIT),
                 cursor: str | None = Query(None, max_length=500)):
    with reading(request) as session:
        return alias_body(session, queries.resolve_model(session, name), None, limit, cursor)


@router.get("/v1/models/{name:path}/aliases/{alias}", response_model=AliasList,
            summary="One alias: where it points and every move")
def get_alias(name: str, alias: str, request: Request,
              limit: int = Query(50, ge=1, le=queries.MAX_LIMIT),
              cursor: str | None = Query(None, max_length=500)):
    with reading(request) as session:
        model = queries.resolve_model(session, name)
        return alias_body(session, model, check_alias_name(alias, stored=True), limit, cursor)


@router.put("/v1/models/{name:path}/aliases/{alias}", response_model=AliasList,
            summary="Point an alias at a published version (history is kept)")
def set_alias(name: str, alias: str, body: AliasRequest, request: Request,
              actor: str = Depends(require("bundles:publish"))):
    with request.app.state.registry.db.write() as session:
        model = queries.resolve_model(session, name)
        version = queries.resolve_version(session, model, body.version)
        move_alias(session, model, check_alias_name(alias), version, actor, body.reason)
        return alias_body(session, model, alias)


@router.delete("/v1/models/{name:path}/aliases/{alias}", response_model=AliasList,
               summary="Remove an alias (its history is kept)")
def remove_alias(name: str, alias: str, request: Request,
                 reason: str | None = Query(None, max_length=2000, pattern=r"^[^\x00]*$"),
                 actor: str = Depends(require("bundles:publish"))):
    with request.app.state.registry.db.write() as session:
        model = queries.resolve_model(session, name)
        if not move_alias(session, model, check_alias_name(alias, stored=True), None, actor, reason):
            current = ", ".join(a.name for a in queries.current_aliases(session, model)) or "none"
            raise AliasNotFound(f"{model.name} has no alias {alias!r} to remove; its aliases: {current}")
        return alias_body(session, model, alias)
