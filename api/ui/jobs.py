"""Job pages: the list and one job with live progress.

Rows come from the jobs API's own queries and serializers (registry_db/jobs.py,
api/routes/jobs.py), so the page shows exactly `GET /v1/jobs` and `GET /v1/jobs/{id}`. The job
page subscribes to `GET /v1/jobs/{id}/events` with EventSource (static/app.js), whose events
carry that same JSON; without JavaScript it shows the state at load time and a refresh link.
"""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from ...registry_db import jobs as jobs_db
from ..deps import reading
from ..routes.jobs import _model_name, detail_of, job_summary, results_of, status_filter
from .pages import next_page
from .render import PageRoute, page

router = APIRouter(route_class=PageRoute, include_in_schema=False,
                   default_response_class=HTMLResponse)


@router.get("/jobs")
def job_list(request: Request, status: str | None = Query(None, max_length=20),
             model: str | None = Query(None, max_length=200),
             cursor: str | None = Query(None, max_length=500)):
    status = status_filter(status)      # the form's "any" sends status=
    with reading(request) as session:
        found = jobs_db.list_jobs(session, status, _model_name(session, model), 50, cursor)
        results = results_of(session, found.items)
        jobs = [job_summary(j, results.get(j.result_version_id)) for j in found.items]
    query = request.url.query
    return page(request, "jobs.html", {
        "jobs": jobs, "status": status or "", "model": model or "", "statuses": jobs_db.STATUSES,
        "more": next_page(request, found.next_cursor),
        "api": "/v1/jobs" + (f"?{query}" if query else "")})


@router.get("/jobs/{job_id}")
def job_page(request: Request, job_id: str):
    with reading(request) as session:
        job = detail_of(session, jobs_db.get(session, job_id))
    return page(request, "job.html", {
        "job": job, "terminal": job["status"] in jobs_db.TERMINAL,
        "events": f"/v1/jobs/{job['id']}/events", "api": f"/v1/jobs/{job['id']}"})
