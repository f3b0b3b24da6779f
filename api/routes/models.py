"""Browse models: list/search and detail. Detail is a separate router, included last."""

from __future__ import annotations

from fastapi import APIRouter, Query, Request

from ...registry_db import queries
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
        model = queries.resolve_model(session, name)
        stats = queries.model_stats(session, [model.id])[model.id]
        versions = queries.list_versions(session, model, limit=20).items
        aliases = queries.aliases_of(session, [v.id for v in versions])
        return {**serialize.model_item(model, stats),
                "version_aliases": queries.alias_map(session, model),
                "versions": [serialize.version_summary(v, aliases[v.id]) for v in versions]}
