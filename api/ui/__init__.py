"""The browsing web UI: server-rendered pages (Jinja2), inline-SVG charts, no external assets.

    /                                   models: search by name, filter by architecture, validated;
                                        ?sort= name, published, versions or loss (sorting.py)
    /models/{name}                      geometry, versions (?sort= version, created, size, loss),
                                        aliases, validation, pull + SGLang recipe, recent jobs
    /models/{name}/versions/{n}         one version: validation, files, spectra, errors, clips,
                                        each layer (JSON links, numbers, a range download)
    /jobs, /jobs/{id}                   calibration jobs, linked to their model and the version
                                        they published; a job's page follows its event stream
    /static/...                         style.css and app.js (a few KB, works offline)

Pages read through the JSON API's queries and serializers; see views.py and figures.py.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles

from . import jobs, pages
from .render import HERE


def install(app: FastAPI) -> None:
    """Add the pages and their static files to `app` (after the API routers: `/` is the home
    page, and the page routes must not shadow an API path)."""
    app.include_router(pages.router)
    app.include_router(jobs.router)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="ui-static")
