"""The registry service: `create_app()` builds the FastAPI app (JSON under /v1, OpenAPI at
/openapi.json, interactive docs at /docs). `oscar-zoo serve` runs it under uvicorn.

Other areas add their routers with `app.include_router(...)` (the web UI, api/ui, serves pages
at `/`; the jobs API adds /v1/jobs).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from sqlalchemy import text

from ..registry_db.registry import Registry, open_registry
from ..zoo import __version__
from . import errors, jobs_runtime, ui
from .limits import BodyLimit
from .routes import aliases, files, layers, models, publish, versions

DESCRIPTION = """OSCAR 2-bit KV-cache rotation bundles: browse models and versions, fetch one
layer or a layer range, download verified files, publish (token with `bundles:publish`).

Model names in paths may be a catalog name, an alias, or a hub id: `zai-org/GLM-4.7-FP8`
works as is (or as `zai-org--GLM-4.7-FP8`). Errors are `application/problem+json`."""


def create_app(database_url: str | None = None, data_dir: str | Path | None = None,
               registry: Registry | None = None) -> FastAPI:
    """The app over `registry`, or over one opened from database_url/data_dir (settings by
    default; an empty database is migrated and seeded from the catalog).

    Raises SchemaOutOfDate for a database that needs `oscar-zoo db upgrade`.
    """
    registry = registry or open_registry(database_url, data_dir)
    app = FastAPI(title="oscar-zoo registry", version=__version__, description=DESCRIPTION,
                  openapi_url="/openapi.json", docs_url="/docs", redoc_url=None)
    app.state.registry = registry
    errors.install(app)
    app.add_middleware(BodyLimit)
    # Order matters: names may hold a slash, so longer paths go before shorter ones and the
    # bare /v1/models/{name} detail comes last.
    for router in (files.router, layers.router, versions.router, publish.router,
                   aliases.router, models.router, models.detail_router):
        app.include_router(router)

    @app.get("/v1/health", tags=["service"], summary="Liveness and database reachability")
    def health():
        with registry.db.read() as session:
            session.execute(text("select 1"))
        return {"status": "ok", "version": __version__}

    jobs_runtime.install(app)  # /v1/jobs, /v1/workers; the lease sweeper and the executor
    ui.install(app)  # last: the web UI's pages, / among them
    return app
