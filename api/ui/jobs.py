"""Job pages: the list and one job with live progress.

Rows come from the jobs API's own queries and serializers (registry_db/jobs.py,
api/routes/jobs.py), so the page shows exactly `GET /v1/jobs` and `GET /v1/jobs/{id}`. The job
page subscribes to `GET /v1/jobs/{id}/events` with EventSource (static/app.js), whose events
carry that same JSON; without JavaScript it shows the state at load time and a refresh link.
Both link a job's model to its page (whose recent jobs, pages.recent_jobs, link back here) and
the version a job published to that version's page.
"""

from __future__ import annotations

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse
from sqlalchemy.orm import Session

from ...registry_db import jobs as jobs_db
from ...registry_db import ui_queries
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
        pages = model_pages(session, jobs)
    query = request.url.query
    return page(request, "jobs.html", {
        "jobs": jobs, "model_pages": pages, "status": status or "", "model": model or "",
        "statuses": jobs_db.STATUSES, "more": next_page(request, found.next_cursor),
        "api": "/v1/jobs" + (f"?{query}" if query else "")})


@router.get("/jobs/{job_id}")
def job_page(request: Request, job_id: str):
    with reading(request) as session:
        row = jobs_db.resolve(session, job_id)   # whole, or a unique prefix as the CLI shows
        job = detail_of(session, row)
        hardware = ui_queries.calibrated_on(session, row.result_version_id)
        pages = model_pages(session, [job])
    return page(request, "job.html", {
        "job": job, "model_page": pages.get(job["id"]), "worker": worker_of(job),
        "terminal": job["status"] in jobs_db.TERMINAL, "hardware": hardware,
        "events": f"/v1/jobs/{job['id']}/events", "api": f"/v1/jobs/{job['id']}"})


def model_pages(session: Session, jobs: list[dict]) -> dict[str, str]:
    """job id -> the name of the model page its model links to: the name it was filed under,
    else its published version's model. Jobs from before migration 0002 name no model; a job
    submitted by a hub id nobody had published is filed under a name that is no model's, even
    once the version it made names one; neither name a model: no link, not a 404."""
    names = {j["id"]: (j["model"], j["result_model"]) for j in jobs}
    known = ui_queries.known_models(session, [n for pair in names.values() for n in pair])
    found = {job_id: next((n for n in pair if n in known), None) for job_id, pair in names.items()}
    return {job_id: name for job_id, name in found.items() if name}


def worker_of(job: dict) -> str:
    """Who runs (ran) the job: the lease holder while it runs, else the worker its last progress
    report named (the lease is gone once a job ends). static/app.js's workerOf does the same."""
    if job["lease"] and job["lease"]["holder"]:
        return job["lease"]["holder"]
    worker = job["progress"].get("worker")
    if not isinstance(worker, dict):
        return "–"
    name, host = str(worker.get("id") or ""), str(worker.get("host") or "")
    if name and host and host not in name:
        return f"{name} on {host}"
    return name or host or "–"
