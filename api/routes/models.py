"""Browse models: list/search and detail. Detail is a separate router, included last."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from sqlalchemy.orm import Session

from ...registry_db import queries
from ...zoo.errors import ModelNotFound, NotFound
from .. import serialize
from ..deps import reading
from ..schemas import ModelDetail, ModelList

router = APIRouter(tags=["models"])
detail_router = APIRouter(tags=["models"])
NAME_DOC = ("catalog name, any alias, or hub id: `zai-org/GLM-4.7-FP8` (the slash may stay "
            "as is) or `zai-org--GLM-4.7-FP8`")


@router.get("/v1/models", response_model=ModelList, summary="List and search models")
def list_models(
    request: Request,
    q: str | None = Query(None, max_length=200,
                          description="glob over name and hub id (`qwen3-*`); a bare word "
                                      "matches anywhere"),
    architecture: str | None = Query(None, max_length=200, description="e.g. Qwen3ForCausalLM"),
    published: bool = Query(False, description="only models with a published version"),
    limit: int = Query(50, ge=1, le=queries.MAX_LIMIT),
    cursor: str | None = Query(None, max_length=500, description="next_cursor of the last page"),
):
    with reading(request) as session:
        page = queries.list_models(session, q, architecture, published, limit, cursor)
        stats = queries.model_stats(session, [m.id for m in page.items])
        return {"items": [serialize.model_item(m, stats[m.id]) for m in page.items],
                "next_cursor": page.next_cursor}


@detail_router.get("/v1/models/{name:path}", response_model=ModelDetail,
                   summary="Model detail", description=f"`name`: {NAME_DOC}.")
def model_detail(name: str, request: Request):
    with reading(request) as session:
        model = _detail_model(session, name)
        stats = queries.model_stats(session, [model.id])[model.id]
        versions = queries.list_versions(session, model, limit=20).items
        aliases = queries.aliases_of(session, [v.id for v in versions])
        return {**serialize.model_item(model, stats),
                "version_aliases": queries.alias_map(session, model),
                "versions": [serialize.version_summary(v, aliases[v.id]) for v in versions]}


def _detail_model(session: Session, name: str):
    """The model `name` names. This route takes every /v1/models/... path no other route took
    (a hub id holds a slash), so a mistyped sub-path of a known model (`.../version/1`,
    `.../versions/`) would read as an unknown model called `qwen3-8b/version/1`: say which
    model exists and which paths it has instead.

    Raises ModelNotFound, or NotFound for a path under a known model that no endpoint serves.
    """
    try:
        return queries.resolve_model(session, name)
    except ModelNotFound:
        parts = name.split("/")
        # a model's name has no slash and its hub id one: a hub id first, then a name
        for n in (n for n in (2, 1) if n < len(parts)):
            try:
                model = queries.resolve_model(session, "/".join(parts[:n]))
            except ModelNotFound:
                continue
            base = f"/v1/models/{model.name}"
            raise NotFound(f"no endpoint at /v1/models/{name}: {model.name} is a model; its paths "
                           f"are {base}/versions, {base}/versions/{{version or alias}}[/files/"
                           f"{{name}}|/layers/{{layer}}] and {base}/aliases (all of them at "
                           "/docs)") from None
        raise
