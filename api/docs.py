"""The interactive API docs at /docs (Swagger UI), with its JavaScript, CSS and icon served by
this server under /docs/assets.

FastAPI's own /docs page loads them from a CDN, so on an offline or air-gapped host (serving
clusters often are) it renders blank. The files come from the fastapi-offline package, which
vendors swagger-ui-dist 5 (OpenAPI 3.1, as FastAPI writes it). /redoc stays off, as it was.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

DOCS = "/docs"
ASSETS = "/docs/assets"
OAUTH2_REDIRECT = "/docs/oauth2-redirect"   # FastAPI's default, kept where it was
# the package's own layout; tests/api/test_docs.py fails if an upgrade moves it
SWAGGER_UI = Path(fastapi_offline.__file__).with_name("static")


def install(app: FastAPI) -> None:
    """Serve /docs and its assets on `app`, made with docs_url=None (FastAPI's CDN page off)."""
    app.mount(ASSETS, StaticFiles(directory=SWAGGER_UI), name="docs-assets")

    async def swagger_ui(request: Request) -> HTMLResponse:
        # behind a proxy that strips a prefix, every URL the page loads needs it back
        root = request.scope.get("root_path", "").rstrip("/")
        return get_swagger_ui_html(
            openapi_url=root + app.openapi_url, title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{root}{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS}/favicon.png",
            oauth2_redirect_url=root + OAUTH2_REDIRECT,
            init_oauth=app.swagger_ui_init_oauth, swagger_ui_parameters=app.swagger_ui_parameters)

    async def oauth2_redirect(request: Request) -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    app.add_route(DOCS, swagger_ui, include_in_schema=False)
    app.add_route(OAUTH2_REDIRECT, oauth2_redirect, include_in_schema=False)
