"""Bad job and worker requests: a 4xx with a clear message, and nothing stored that would make
a later read of the job fail."""

from __future__ import annotations

import pytest


@pytest.fixture
def jobs_http(registry_server):
    """(submitter client, worker client) on the real registry."""
    with registry_server.client(registry_server.token("jobs:submit", name="owner")) as sub, \
            registry_server.client(registry_server.token("jobs:work", name="gpu")) as work:
        yield sub, work


def _json(client, path: str, body: str):
    # raw text: httpx (like the json module's strict mode) would not send NaN itself
    return client.post(path, content=body, headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("body", [
    '{"lease": "%s", "phase": "pass1", "timings": {"loading": NaN}}',
    '{"lease": "%s", "phase": "pass1", "timings": {"loading": Infinity}}',
    '{"lease": "%s", "phase": "pass1", "progress": {"done": 1, "rate": NaN}}',
], ids=["nan-timing", "inf-timing", "nan-progress"])
def test_progress_with_nan_is_refused_and_the_job_stays_readable(jobs_http, body):
    """Stored, NaN timings made GET /v1/jobs/{id} answer 500 for good (not JSON)."""
    sub, work = jobs_http
    job = sub.post("/v1/jobs", json={"model": "smollm2-135m"}).json()["id"]
    claim = work.post("/v1/workers/claim", json={"worker": "w1", "gpus": 1})
    lease = claim.json()["lease"]["token"]
    r = _json(work, f"/v1/jobs/{job}/progress", body % lease)
    assert r.status_code == 422, r.text
    assert "finite number" in r.json()["detail"] or "progress.rate is nan" in r.json()["detail"]
    assert sub.get(f"/v1/jobs/{job}").status_code == 200
    r = _json(work, f"/v1/jobs/{job}/complete", '{"lease": "%s", "timings": {"total": NaN}}' % lease)
    assert r.status_code == 422, r.text
    assert sub.get(f"/v1/jobs/{job}").json()["status"] == "running"


@pytest.mark.parametrize("body, says", [
    ('{"model": "smollm2-135m", "ray_resources": {"tpu": NaN}}',
     "ray_resources.tpu: Input should be a finite number"),
    ('{"model": "smollm2-135m", "validation": {"tolerance": Infinity}}',
     "validation.tolerance: Input should be a finite number"),
], ids=["nan-ray-resource", "inf-tolerance"])
def test_a_spec_with_nan_is_refused(jobs_http, body, says):
    """The job was stored, then its submit, every read of it and every claim answered 500."""
    sub, work = jobs_http
    r = _json(sub, "/v1/jobs", body)
    assert r.status_code == 422, r.text
    assert says in r.json()["detail"]
    assert sub.get("/v1/jobs").json()["items"] == []
    assert work.post("/v1/workers/claim", json={"worker": "w1", "ray": True}).status_code == 204


@pytest.mark.parametrize("resources, match", [
    ({"GPU": 1}, "`gpus` field"),
    ({"CPU": 4}, "may not name 'CPU'"),
    ({"memory": 1e9}, "may not name 'memory'"),
    ({"worker_node": -1}, "not an amount Ray accepts"),
    ({"worker_node": 1.5}, "whole number"),
    ({"worker_node": 0.00001}, "0.0001"),
])
def test_ray_resources_ray_would_refuse_are_refused_at_submit(jobs_http, resources, match):
    """Accepted, they made Ray's task.options() raise inside the dispatcher, which died."""
    sub, _ = jobs_http
    r = sub.post("/v1/jobs", json={"model": "smollm2-135m", "ray_resources": resources})
    assert r.status_code == 422 and match in r.json()["detail"], r.text
    assert sub.get("/v1/jobs").json()["items"] == []


def test_custom_ray_resources_are_accepted(jobs_http):
    sub, _ = jobs_http
    r = sub.post("/v1/jobs", json={"model": "smollm2-135m",
                                  "ray_resources": {"worker_node": 1, "shared": 0.5, "slots": 2}})
    assert r.status_code == 201, r.text


@pytest.mark.parametrize("alias", ["prod\n", "latest\n"])
def test_an_alias_the_registry_cannot_hold_is_refused_at_submit(jobs_http, alias):
    """The spec's alias check let `prod\\n` through (`$` matches before a final newline): the job
    was queued and calibrated, and its result upload then answered 422 at the alias move, so
    the calibrated bundle could never be recorded."""
    sub, work = jobs_http
    r = sub.post("/v1/jobs", json={"model": "smollm2-135m", "aliases": [alias]})
    assert r.status_code == 422, r.text
    assert repr(alias) in r.json()["detail"] and "lower-case" in r.json()["detail"]
    assert sub.get("/v1/jobs").json()["items"] == []


def test_a_mirror_target_with_a_trailing_newline_is_refused_at_submit(jobs_http):
    sub, _ = jobs_http
    r = sub.post("/v1/jobs", json={"model": "smollm2-135m", "mirror": ["hf:org/repo\n"]})
    assert r.status_code == 422, r.text
    assert "hf:ORG/REPO" in r.json()["detail"]


JSON_HINT = "send Content-Type: application/json with a JSON object"


@pytest.mark.parametrize("content, headers, says", [
    # docs/jobs.md's curl example as it was: -d without a Content-Type sends form data
    ('{"model": "qwen3-8b", "gpus": 1}', {"Content-Type": "application/x-www-form-urlencoded"},
     "not read as JSON, as it came with application/x-www-form-urlencoded"),
    ('{"model": oops}', {"Content-Type": "application/x-www-form-urlencoded"},
     "not read as JSON"),
    ('{"model": "qwen3-8b"}', {}, "not read as JSON, as it came with no Content-Type"),
    ('{"model": oops}', {"Content-Type": "application/json"}, "body: not valid JSON (Expecting"),
    ('["qwen3-8b"]', {"Content-Type": "application/json"}, "body: a JSON array, not an object"),
    ('"qwen3-8b"', {"Content-Type": "application/json"}, "body: a JSON string, not an object"),
    ("", {"Content-Type": "application/json"}, "body: empty"),
], ids=["form", "form-malformed", "no-type", "malformed", "array", "string", "empty"])
def test_a_body_that_is_no_json_object_says_to_send_one(jobs_http, content, headers, says):
    """The answer was "body: Input should be a valid dictionary or object to extract fields
    from", which does not say that the Content-Type was what is missing."""
    sub, _ = jobs_http
    r = sub.post("/v1/jobs", content=content, headers=headers)
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
    detail = r.json()["detail"]
    assert says in detail and JSON_HINT in detail, detail
    assert sub.get("/v1/jobs").json()["items"] == []


def test_a_json_object_with_a_bad_field_still_names_the_field(jobs_http):
    sub, _ = jobs_http
    r = sub.post("/v1/jobs", json={"model": "smollm2-135m", "gpus": "many"})
    assert r.status_code == 422 and r.json()["detail"].startswith("body.gpus: ")
    assert JSON_HINT not in r.json()["detail"]


def test_the_jobs_guide_sends_its_example_as_json():
    from pathlib import Path

    guide = (Path(__file__).parents[2] / "docs" / "jobs.md").read_text()
    example = guide[guide.index("curl -X POST $REGISTRY/v1/jobs"):]
    example = example[:example.index("}'") + 2]
    assert "-H 'Content-Type: application/json'" in example
