"""Versions of a model: list, detail, yank, promote a draft, mirror records."""

from __future__ import annotations

from typing import Literal

from fastapi import APIRouter, Depends, Query, Request
from sqlalchemy.orm import Session

from ...registry_db import queries
from ...registry_db.mirrors import mirror_published, mirror_yank_in_background
from ...registry_db.publish import promote_draft, yank_version
from .. import serialize
from ..auth import require
from ..deps import reading
from ..schemas import MirrorList, VersionDetail, VersionList, YankRequest

router = APIRouter(tags=["versions"])
REF_DOC = "version number, or an alias: `latest`, `recommended`, or one of your own"


def version_body(session: Session, version) -> dict:
    return serialize.version_detail(version, queries.aliases_of(session, [version.id])[version.id])


@router.get("/v1/models/{name:path}/versions", response_model=VersionList,
            summary="Versions of a model, newest first")
def list_versions(name: str, request: Request,
                  status: Literal["draft", "published", "yanked"] | None = Query(None),
                  limit: int = Query(50, ge=1, le=queries.MAX_LIMIT),
                  cursor: str | None = Query(None, max_length=500)):
    with reading(request) as session:
        model = queries.resolve_model(session, name)
        page = queries.list_versions(session, model, status, limit, cursor)
        aliases = queries.aliases_of(session, [v.id for v in page.items])
        return {"items": [serialize.version_summary(v, aliases[v.id]) for v in page.items],
                "next_cursor": page.next_cursor}


@router.get("/v1/models/{name:path}/versions/{ref}", response_model=VersionDetail,
            summary="Version detail: manifest, validation, files",
            description=f"`ref`: {REF_DOC}.")
def version_detail(name: str, ref: str, request: Request):
    with reading(request) as session:
        model = queries.resolve_model(session, name)
        return version_body(session, queries.resolve_version(session, model, ref))


@router.post("/v1/models/{name:path}/versions/{ref}/yank", response_model=VersionDetail,
             summary="Yank a version (it stays downloadable by number; never deleted)")
def yank(name: str, ref: str, body: YankRequest, request: Request,
         actor: str = Depends(require("bundles:publish"))):
    with request.app.state.registry.db.write() as session:
        model = queries.resolve_model(session, name)
        version = queries.resolve_version(session, model, ref)
        yank_version(session, version, body.reason, actor)
        out = version_body(session, version)
    # after the commit, in the background: the hubs holding it learn of the yank, never
    # holding it up
    mirror_yank_in_background(request.app.state.registry, out["model"], out["version"])
    return out


@router.post("/v1/models/{name:path}/versions/{ref}/publish", response_model=VersionDetail,
             summary="Publish a draft version")
def promote(name: str, ref: str, request: Request,
            actor: str = Depends(require("bundles:publish"))):
    with request.app.state.registry.db.write() as session:
        model = queries.resolve_model(session, name)
        version = queries.resolve_version(session, model, ref)
        promote_draft(session, version, actor)
        out = version_body(session, version)
    # like a publish: to the configured targets (and its job's), in the background
    mirror_published(request.app.state.registry, out["model"], out["version"])
    return out


@router.get("/v1/models/{name:path}/versions/{ref}/mirrors", response_model=MirrorList,
            summary="Where this version is mirrored (Hugging Face Hub, ModelScope)")
def mirrors(name: str, ref: str, request: Request):
    with reading(request) as session:
        model = queries.resolve_model(session, name)
        version = queries.resolve_version(session, model, ref)
        return {"items": [serialize.mirror(r) for r in queries.mirrors(session, version)]}
