"""The registry service: `create_app()` builds the FastAPI app (JSON under /v1, OpenAPI at
/openapi.json, interactive docs at /docs, which work offline: docs.py). `oscar-zoo serve` runs
it under uvicorn.

Other areas add their routers with `app.include_router(...)` (the web UI, api/ui, serves pages
at `/`; the jobs API adds /v1/jobs). Every GET route and page answers HEAD too (HeadAsGet).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from sqlalchemy import text
from starlette.routing import Match, Router

from ..registry_db.registry import Registry, open_registry
from ..zoo import __version__, settings
from . import auth, docs, errors, jobs_runtime, ui
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

    Raises SettingError, naming each, for settings the service reads with invalid values, and
    SchemaOutOfDate for a database that needs `oscar-zoo db upgrade`.
    """
    settings.check(settings.SERVICE)   # before the database is opened (or migrated)
    registry = registry or open_registry(database_url, data_dir)
    app = FastAPI(title="oscar-zoo registry", version=__version__, description=DESCRIPTION,
                  openapi_url="/openapi.json", docs_url=None, redoc_url=None)
    docs.install(app)   # FastAPI's /docs less its CDN; first, as FastAPI's is: no page shadows it
    app.state.registry = registry
    app.add_middleware(BodyLimit)
    app.add_middleware(HeadAsGet, router=app.router)
    errors.install(app)     # added last, its middleware is outermost: errors in those answered too
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

    app.get("/v1/whoami", tags=["service"], summary="Who the bearer token is: actor and scopes")(
        auth.whoami)
    jobs_runtime.install(app)  # /v1/jobs, /v1/workers; the lease sweeper and the executor
    ui.install(app)  # last: the web UI's pages, / among them
    return app


class _HeadDone(Exception):
    """Raised into a streaming GET once a HEAD's headers are out: its body is never sent."""


class HeadAsGet:
    """HEAD on any GET route (RFC 9110 9.3.2): FastAPI's routes answer GET only, so a HEAD
    that no route takes itself runs as GET and goes out with the GET's headers (Content-Length,
    ETag) and no body. Routes with their own HEAD (file downloads: no file read) and /static
    are left alone; the OpenAPI schema is untouched, as no route is added."""

    def __init__(self, app, router: Router):
        self.app, self.router = app, router

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "HEAD" or self._has_head(scope):
            return await self.app(scope, receive, send)
        done = False

        async def headers_only(message):
            nonlocal done
            if message["type"] != "http.response.body":
                return await send(message)
            if not done:
                done = True
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            if message.get("more_body"):
                raise _HeadDone  # stop a stream (a file, job events) instead of reading it all

        try:
            # a copy: the server keeps seeing HEAD, and sends no body itself
            await self.app({**scope, "method": "GET"}, receive, headers_only)
        except _HeadDone:
            pass

    def _has_head(self, scope) -> bool:
        return any(route.matches(scope)[0] == Match.FULL for route in self.router.routes)
