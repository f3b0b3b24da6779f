"""The jobs API and the worker protocol over real HTTP, on SQLite and PostgreSQL, driven by the
real client (no model: bundles come from tests/utils/bundles.py)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import httpx
import pytest
from sqlalchemy import func, select

from oscar_zoo.registry_db.jobs import now_utc
from oscar_zoo.registry_db.models import BundleVersion, Job
from oscar_zoo.zoo.errors import (Conflict, Forbidden, InvalidInput, JobCancelled, LeaseLost,
                                  ModelNotFound, NotFound)
from oscar_zoo.zoo.jobs_client import JobsClient
from tests.utils.bundles import make_bundle

from .conftest import LEASE_S
from .serve import wait_for


def _count(server, table) -> int:
    with server.registry.db.read() as session:
        return session.scalar(select(func.count()).select_from(table))


def _wait(fn, timeout: float = 20.0):
    return wait_for(fn, timeout, every=0.1)


def _expire_lease(api, job_id: str) -> None:
    """The worker dies now. A 1-second lease instead raced the upload before it on a loaded CI
    box (PostgreSQL, 2 cores) and lost the result the test is about."""
    with api.server.registry.db.write() as session:
        session.get(Job, job_id).lease_expires_at = now_utc() - timedelta(seconds=1)


# --- submit ----------------------------------------------------------------------------------

def test_submit_fills_the_spec_and_is_idempotent_by_key(jobs_api):
    api = jobs_api
    job, created = api.submitter.submit({"model": "smollm2", "tokens": 4096}, idempotency_key="k1")
    assert created and job["status"] == "queued" and job["phase"] == "queued"
    assert job["model"] == "smollm2-135m" and job["attempts"] == 0 and job["result_version"] is None
    spec = job["spec"]
    # every default is explicit in the stored spec (it is copied into the bundle)
    assert spec["model"] == "smollm2-135m" and spec["tokens"] == 4096 and spec["seq_len"] == 2048
    assert (spec["sink_tokens"], spec["recent_tokens"], spec["group_size"], spec["gpus"]) == (64, 256, 64, 1)
    assert spec["lease_seconds"] == LEASE_S and spec["max_attempts"] == 3
    assert api.submitter.get(job["id"]) == job

    again, created = api.submitter.submit({"model": "smollm2", "tokens": 4096}, idempotency_key="k1")
    assert not created and again["id"] == job["id"]
    with pytest.raises(Conflict, match="different spec"):
        api.submitter.submit({"model": "smollm2", "tokens": 8192}, idempotency_key="k1")
    assert _count(api.server, Job) == 1
    # the key may also travel in the body
    body_key, created = api.submitter.submit({"model": "smollm2-135m", "idempotency_key": "k2"})
    assert created and api.submitter.submit({"model": "smollm2-135m", "idempotency_key": "k2"})[0]["id"] == body_key["id"]


def test_a_retry_with_its_key_is_the_same_job_after_a_server_default_changed(jobs_api,
                                                                             monkeypatch):
    body = {"model": "smollm2", "tokens": 4096, "validation": {"windows": 2}}
    first, created = jobs_api.submitter.submit(dict(body), idempotency_key="nightly-1")
    assert created
    monkeypatch.setenv("OSCAR_ZOO_JOB_LEASE_SECONDS", "120")
    monkeypatch.setenv("OSCAR_ZOO_JOB_MAX_ATTEMPTS", "5")
    again, created = jobs_api.submitter.submit(dict(body), idempotency_key="nightly-1")
    assert not created and again["id"] == first["id"]
    for changed in ({**body, "tokens": 8192}, {**body, "validation": {"windows": 3}},
                    {**body, "lease_seconds": 120}):
        with pytest.raises(Conflict, match="different spec"):
            jobs_api.submitter.submit(changed, idempotency_key="nightly-1")


def test_a_retry_that_leaves_out_a_field_the_first_request_set_is_another_request(jobs_api):
    """Only the retry's fields were compared: a nightly job asked for seed 7 without clip
    search, and a request for the defaults with the same key got that job back silently."""
    body = {"model": "smollm2", "tokens": 4096, "seed": 7, "clip_search": False,
            "validation": {"windows": 3}}
    first, created = jobs_api.submitter.submit(dict(body), idempotency_key="nightly-1")
    assert created
    with pytest.raises(Conflict, match=r"differs in clip_search, seed, validation\.windows\)"):
        jobs_api.submitter.submit({"model": "smollm2", "tokens": 4096},
                                  idempotency_key="nightly-1")
    with pytest.raises(Conflict, match=r"differs in seed\)"):
        jobs_api.submitter.submit({k: v for k, v in body.items() if k != "seed"},
                                  idempotency_key="nightly-1")
    # a field the first request set to its default may be left out: it is the same value
    plain, _ = jobs_api.submitter.submit({"model": "smollm2", "clip_search": True},
                                         idempotency_key="nightly-2")
    again, created = jobs_api.submitter.submit({"model": "smollm2"}, idempotency_key="nightly-2")
    assert not created and again["id"] == plain["id"]
    assert _count(jobs_api.server, Job) == 2


@pytest.mark.parametrize("spec, error, match", [
    ({"model": "smollm2-13"}, ModelNotFound, "smollm2-135m"),                  # suggestion
    ({"model": "qwen3-8b", "group_size": 48}, InvalidInput, "power of two"),
    ({"model": "qwen3-8b", "group_size": 16}, InvalidInput, "head_dim/4"),
    ({"model": "smollm2-135m", "seq_len": 256}, InvalidInput, "no INT2 keys"),
    ({"model": "smollm2-135m", "validation": {"context_len": 300}}, InvalidInput, "must exceed"),
    ({"model": "/models/llama.gguf"}, InvalidInput, "publish_as"),
    ({"model": "smollm2-135m", "aliases": ["latest"]}, InvalidInput, "latest"),
    ({"model": "smollm2-135m", "mirror": ["s3:bucket"]}, InvalidInput, "hf:ORG/REPO"),
    ({"model": "smollm2-135m", "tokenz": 5}, InvalidInput, "tokenz"),
    ({"model": "smollm2-135m", "tokens": 0}, InvalidInput, "tokens"),
    ({"model": "smollm2-135m", "seed": 2**64}, InvalidInput, "seed"),   # failed after both passes
    ({"model": "smollm2-135m", "data": ["hf:org/text"], "validation": {"data": ["hf:org/text"]}},
     InvalidInput, "also calibration data"),                           # failed after calibrating
    # a jobs:submit token made the workers read any file of the host
    ({"model": "/etc/models/x.gguf", "publish_as": "smollm2-135m"}, Forbidden, "OSCAR_ZOO_JOB_PATHS"),
    ({"model": "smollm2-135m", "data": ["/etc/passwd.txt"]}, Forbidden, "outside the directories"),
    ({"model": "smollm2-135m", "validation": {"data": ["/../../../../etc/x.jsonl"]}}, Forbidden,
     "outside the directories"),
    # relative paths were checked against the server's directory and read from the runner's
    ({"model": "smollm2-135m", "validation": {"data": ["../../../../etc/x.jsonl"]}}, InvalidInput,
     "relative path"),
    ({"model": "./models/x.gguf", "publish_as": "smollm2-135m"}, InvalidInput, "relative path"),
    ({"model": "smollm2-135m", "data": ["data/calib.txt"]}, InvalidInput, "absolute path"),
    # datasets.load_dataset reads a local directory by the same argument as a dataset id
    ({"model": "smollm2-135m", "data": ["hf:../../srv/x"]}, Forbidden, "not a Hugging Face dataset id"),
    ({"model": "smollm2-135m", "data": ["hf:/srv/x@train"]}, Forbidden, "not a Hugging Face dataset id"),
    ({"model": "smollm2-135m", "validation": {"data": ["hf:org/../../x:cfg"]}}, Forbidden,
     "not a Hugging Face dataset id"),
])
def test_bad_specs_are_refused_up_front_and_store_nothing(jobs_api, spec, error, match):
    with pytest.raises(error, match=match):
        jobs_api.submitter.submit(spec)
    assert _count(jobs_api.server, Job) == 0


def test_a_hub_id_whose_name_the_registry_gives_another_model_is_refused_at_submit(jobs_api):
    """`otherorg/qwen3-8b` goes under its repo part, `qwen3-8b`, which is Qwen/Qwen3-8B's: the
    job was queued, calibrated, and only its result refused (publish.model_for)."""
    r = httpx.post(f"{jobs_api.server.url}/v1/jobs", json={"model": "otherorg/qwen3-8b"},
                   headers=jobs_api.submitter.registry.auth_headers)
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
    detail = r.json()["detail"]
    assert "published as model 'qwen3-8b'" in detail, detail
    assert "the registry knows qwen3-8b as Qwen/Qwen3-8B" in detail, detail   # as model_for says
    assert "submit 'Qwen/Qwen3-8B'" in detail and "cannot hold a second model" in detail, detail
    with pytest.raises(InvalidInput, match="knows qwen3-8b as Qwen/Qwen3-8B"):
        jobs_api.submitter.submit({"model": "OtherOrg/Qwen3-8B", "publish": False})
    assert _count(jobs_api.server, Job) == 0
    # the model's own hub id, any case, and a hub id whose name is free are taken
    assert jobs_api.submitter.submit({"model": "qwen/qwen3-8b"})[0]["model"] == "qwen3-8b"
    assert jobs_api.submitter.submit({"model": "otherorg/qwen3-8b-ft"})[0]["model"] == "qwen3-8b-ft"


def test_a_hub_id_clashing_with_an_uploaded_model_is_refused_at_submit(jobs_api, tmp_path):
    """The same for a model the registry knows from an upload, not from the catalog."""
    from oscar_zoo.zoo.bundle import Bundle, write
    from oscar_zoo.zoo.geometry import ModelGeometry
    from oscar_zoo.zoo.manifest import Geometry, ModelRef
    from tests.utils.bundles import make_manifest, make_tensors

    manifest = make_manifest("smollm2-135m").model_copy(update={
        "model": ModelRef(name="tiny-llama", hub_id="someone/Tiny-Llama", architecture="Llama"),
        "geometry": Geometry.of(ModelGeometry(4, 4, 2, 64))})
    write(Bundle(manifest, *make_tensors(manifest)), tmp_path / "b")
    jobs_api.server.registry.publish(tmp_path / "b", created_by="test")
    with pytest.raises(InvalidInput, match="knows tiny-llama as someone/Tiny-Llama.*submit "
                                           "'someone/Tiny-Llama'"):
        jobs_api.submitter.submit({"model": "other/tiny-llama"})
    assert _count(jobs_api.server, Job) == 0
    assert jobs_api.submitter.submit({"model": "someone/tiny-llama"})[1]


def test_a_path_inside_the_job_paths_is_taken_and_a_symlink_out_of_them_is_not(jobs_api, tmp_path):
    (tmp_path / "data.jsonl").write_text('{"text": "hello"}\n')
    (tmp_path / "etc").symlink_to("/etc")
    job = jobs_api.submit(data=[str(tmp_path / "data.jsonl")])
    assert job["spec"]["data"] == [str(tmp_path / "data.jsonl")]
    with pytest.raises(Forbidden, match="outside the directories"):
        jobs_api.submitter.submit({"model": "smollm2-135m", "data": [str(tmp_path / "etc" / "x.txt")]})


@pytest.mark.parametrize("registry_backend", ["sqlite"], indirect=True)
def test_a_hub_id_never_loads_a_directory_of_the_workers_host(jobs_api, tmp_path, monkeypatch):
    """`org/name` is a hub id, so check_paths let it through; but the runner took it for a
    directory relative to the worker's working directory first (and so would transformers):
    a jobs:submit token read a model of the host outside OSCAR_ZOO_JOB_PATHS, and the
    traceback, public at GET /v1/jobs/{id}, told which directories exist there."""
    from oscar_zoo.calibrate.executors.worker import Attempt

    host = tmp_path / "worker-cwd"
    (host / "localorg" / "secretmodel").mkdir(parents=True)
    (host / "localorg" / "secretmodel" / "config.json").write_text('{"model_type": "llama"}')
    monkeypatch.chdir(host)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")            # the hub, which it should ask, is not here
    job = jobs_api.submit(model="localorg/secretmodel", publish=False, max_attempts=1)
    claimed = jobs_api.worker.claim("w-cwd", 0)
    assert Attempt(jobs_api.worker, claimed["job"], claimed["lease"], "w-cwd",
                   threading.Event()).run() == "failed"
    error = jobs_api.submitter.get(job["id"])["error"]
    assert "secretmodel" in error and "found in directory" not in error, error
    assert "hub" in error.lower() or "offline" in error.lower(), error


def test_a_spec_moving_aliases_needs_a_token_that_may_move_them(jobs_api):
    """A jobs:submit token could point `recommended`, what `pull NAME` serves, at a bundle of its
    choosing (require_pass false), which the alias endpoint refuses it."""
    with JobsClient(jobs_api.server.url, jobs_api.server.token("jobs:submit", name="ci")) as ci:
        with pytest.raises(Forbidden, match="bundles:publish.*oscar-zoo alias"):
            ci.submit({"model": "smollm2-135m", "aliases": ["recommended"]})
        assert _count(jobs_api.server, Job) == 0
        job, created = ci.submit({"model": "smollm2-135m"})     # without aliases it may submit
        assert created and job["spec"]["aliases"] == []


def test_unknown_model_is_404_problem_with_suggestions(jobs_api):
    r = httpx.post(f"{jobs_api.server.url}/v1/jobs", json={"model": "qwen3-8"},
                   headers=jobs_api.submitter.registry.auth_headers)
    assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"
    assert "qwen3-8b" in r.json()["suggestions"]


def test_scopes(jobs_api):
    url = jobs_api.server.url
    with JobsClient(url, "") as anonymous, pytest.raises(Exception, match="needs a token"):
        anonymous.submit({"model": "smollm2-135m"})
    with pytest.raises(Forbidden, match="jobs:submit"):
        jobs_api.worker.submit({"model": "smollm2-135m"})
    with pytest.raises(Forbidden, match="jobs:work"):
        jobs_api.submitter.claim("w", 0)


# --- list ------------------------------------------------------------------------------------

def test_list_filters_and_pages_newest_first(jobs_api):
    ids = [jobs_api.submit(tokens=1000 + i)["id"] for i in range(4)]
    ids.append(jobs_api.submitter.submit({"model": "qwen3-8b"})[0]["id"])
    jobs_api.submitter.cancel(ids[0])
    seen, cursor = [], None
    while True:
        page = jobs_api.submitter.list(limit=2, cursor=cursor)
        assert len(page["items"]) <= 2
        seen += [j["id"] for j in page["items"]]
        cursor = page["next_cursor"]
        if not cursor:
            break
    assert seen == ids[::-1]
    item = page["items"][0]
    assert set(item) >= {"id", "status", "phase", "model", "progress", "attempts", "created_at",
                         "updated_at", "result_version"}
    assert [j["id"] for j in jobs_api.submitter.list(model="smollm2")["items"]] == ids[3::-1]
    assert [j["id"] for j in jobs_api.submitter.list(status="cancelled")["items"]] == [ids[0]]
    assert [j["id"] for j in jobs_api.submitter.list(model="Qwen/Qwen3-8B")["items"]] == [ids[4]]
    with pytest.raises(InvalidInput, match="cursor"):
        jobs_api.submitter.list(cursor="bm90IGEgY3Vyc29y")


def test_list_refuses_forged_cursors_and_nul_names_with_4xx(jobs_api):
    """Cursors the API never hands out, and NUL (PostgreSQL text cannot hold it), were 500s."""
    from oscar_zoo.registry_db.queries import encode_cursor

    forged = [["2026-11-22T00:00:00", "a"], ["2026-11-22T00:00:00+00:00", "a\x00"]]
    with jobs_api.server.client() as http:
        for cursor in forged:
            r = http.get("/v1/jobs", params={"cursor": encode_cursor(cursor)})
            assert r.status_code == 422 and "cursor" in r.json()["detail"], (cursor, r.text)
        r = http.get("/v1/jobs", params={"model": "smollm2\x00"})
        assert r.status_code == 422 and "NUL" in r.json()["detail"], r.text


# --- a job named by a prefix of its id -------------------------------------------------------

def _renamed(api, job: dict, new_id: str) -> str:
    """The job under an id of the test's choosing: random ids share no 8-character prefix."""
    with api.server.registry.db.write() as session:
        session.get(Job, job["id"]).id = new_id
    return new_id


def test_a_unique_prefix_of_8_or_more_characters_names_the_job(jobs_api):
    api = jobs_api
    job = _renamed(api, api.submit(), "0123456f-aaaa-4aaa-8aaa-aaaaaaaaaaaa")
    # the neighbours on either side of the range the prefix asks for
    below = _renamed(api, api.submit(), "0123456e-ffff-4fff-bfff-ffffffffffff")
    above = _renamed(api, api.submit(), "01234570-0000-4000-8000-000000000000")
    nine = _renamed(api, api.submit(), "01234569-0000-4000-8000-000000000000")
    after_nine = _renamed(api, api.submit(), "0123456a-0000-4000-8000-000000000000")
    for ref in ("0123456f", "0123456f-", "0123456f-aa", "0123456F-AAAA", job):
        assert api.submitter.get(ref)["id"] == job, ref
    assert api.submitter.get("01234569")["id"] == nine
    assert api.submitter.get("0123456a")["id"] == after_nine
    assert api.submitter.get("0123456e")["id"] == below and api.submitter.get("01234570")["id"] == above
    for ref in ("0123456", "01234571", "0123456f-b", "0123456f-aaaa-4aaa-8aaa-aaaaaaaaaaab",
                "0123-456f", "0123456f--"):
        with pytest.raises(NotFound, match="first 8 or more characters"):
            api.submitter.get(ref)
    events = list(api.submitter.events(api.submitter.cancel("0123456f-a")["id"][:8]))
    assert [(e["id"], e["status"]) for e in events] == [(job, "cancelled")]
    # the worker side takes whole ids only: its ids come from its claim
    claimed = api.worker.claim("w", 0)
    assert claimed["job"]["id"] == below         # the oldest job queued
    with pytest.raises(NotFound, match="given whole"):
        api.worker.heartbeat(below[:8], claimed["lease"]["token"])
    assert api.worker.heartbeat(below, claimed["lease"]["token"])["status"] == "running"


def test_a_prefix_of_several_jobs_ids_is_refused_naming_them(jobs_api):
    api = jobs_api
    a = _renamed(api, api.submit(), "deadbeef-0000-4000-8000-00000000000a")
    b = _renamed(api, api.submit(), "deadbeef-0000-4000-8000-00000000000b")
    c = _renamed(api, api.submit(), "deadbeef-0001-4000-8000-000000000000")
    with pytest.raises(Conflict, match="more of the id's characters") as refused:
        api.submitter.get("deadbeef")
    assert all(i in str(refused.value) for i in (a, b, c))
    with pytest.raises(Conflict) as refused:
        api.submitter.cancel("deadbeef-0000")
    assert a in str(refused.value) and b in str(refused.value) and c not in str(refused.value)
    assert {api.submitter.get(i)["status"] for i in (a, b)} == {"queued"}     # none was cancelled
    r = httpx.get(f"{api.server.url}/v1/jobs/DEADBEEF/events")
    assert r.status_code == 409 and r.headers["content-type"] == "application/problem+json"
    assert api.submitter.get("deadbeef-0001")["id"] == c and api.submitter.get(a)["id"] == a
    # a few are named, not all
    many = [_renamed(api, api.submit(), f"deadbeef-0000-4000-8000-00000000001{i}") for i in range(5)]
    with pytest.raises(Conflict, match=r", \.\.\.\); give more") as refused:
        api.submitter.get("deadbeef-0000")
    assert sum(i in str(refused.value) for i in [a, b, *many]) == 5


# --- the worker protocol ---------------------------------------------------------------------

def test_claim_heartbeat_progress_complete(jobs_api):
    api = jobs_api
    job = api.submit(lease_seconds=30)
    claimed = api.worker.claim("w1", 0)
    assert claimed is not None
    assert api.worker.claim("w2", 0) is None                         # nothing else queued
    running = api.submitter.get(job["id"])
    assert running["status"] == "running" and running["attempts"] == 1
    assert running["lease"]["holder"] == "w1" and "token" not in running["lease"]
    lease = claimed["lease"]["token"]          # only there: the database keeps its hash
    first_expiry = running["lease"]["expires_at"]
    time.sleep(0.05)
    state = api.worker.heartbeat(job["id"], lease)
    assert state["cancel_requested"] is False and state["lease_expires_at"] > first_expiry
    api.worker.progress(job["id"], lease, "pass1", {"done": 12, "total": 30, "layer": 11})
    got = api.submitter.get(job["id"])
    assert got["phase"] == "pass1" and got["progress"]["layer"] == 11 and got["progress"]["done"] == 12
    with pytest.raises(InvalidInput, match="phase"):
        api.worker.progress(job["id"], lease, "thinking", {})
    done = api.worker.complete(job["id"], lease, {"pass1": 1.5}, {"tokens_per_pass": 512})
    assert done["status"] == "succeeded" and done["timings"] == {"pass1": 1.5}
    assert done["lease"] is None and done["finished_at"]
    with pytest.raises(LeaseLost):                                   # the lease ended with the job
        api.worker.heartbeat(job["id"], lease)


def test_a_long_poll_claim_outlasts_a_short_http_timeout(jobs_api, monkeypatch):
    """With OSCAR_ZOO_HTTP_TIMEOUT below the long poll, the client gave up on a claim whose
    answer leased a job that arrived meanwhile: the job sat `running` for a whole lease."""
    monkeypatch.setenv("OSCAR_ZOO_HTTP_TIMEOUT", "1")
    submitted = []
    threading.Timer(1.5, lambda: submitted.append(jobs_api.submit(lease_seconds=30))).start()
    with JobsClient(jobs_api.server.url, jobs_api.server.token("jobs:work")) as worker:
        claimed = worker.claim("w1", 0, wait=4)
    assert claimed is not None and claimed["job"]["id"] == submitted[0]["id"]


def test_claim_respects_gpus_and_ray_resources(jobs_api):
    api = jobs_api
    big = api.submitter.submit({"model": "glm-4.7-fp8"})[0]           # catalog: 8 GPUs
    ray_only = api.submit(ray_resources={"worker_node": 1})
    assert big["gpus"] == 8
    assert api.worker.claim("cpu", 0) is None                        # CPU runs 1-GPU jobs only
    assert api.worker.claim("one-gpu", 1) is None
    assert api.worker.claim("eight", 8)["job"]["id"] == big["id"]
    assert api.worker.claim("eight", 8) is None                      # Ray-only job left
    assert api.worker.claim("dispatch:ray", None, ray=True)["job"]["id"] == ray_only["id"]


def test_a_queued_job_says_why_no_worker_seen_lately_can_run_it(jobs_api, monkeypatch):
    from oscar_zoo.registry_db import workers as workers_db

    api = jobs_api
    big = api.submitter.submit({"model": "glm-4.7-fp8"})[0]           # catalog: 8 GPUs
    assert "no worker has asked for work" in big["waiting"]            # told at submit
    assert api.worker.claim("two", 2) is None
    why = api.submitter.get(big["id"])["waiting"]
    assert "needs 8 GPUs" in why and "largest worker seen" in why and "has 2" in why
    ray_only = api.submit(ray_resources={"worker_node": 1})
    assert "no Ray dispatcher" in api.submitter.get(ray_only["id"])["waiting"]
    small = api.submit(lease_seconds=30)      # held across the sleeps below
    assert small["waiting"] is None                                    # "two" can run it
    assert api.worker.claim("dispatch:ray", None, ray=True)["job"]["id"] == big["id"]
    assert api.submitter.get(ray_only["id"])["waiting"] is None        # a dispatcher is about
    monkeypatch.setattr(workers_db, "SEEN_S", 0.5)
    time.sleep(0.6)                                                    # every worker goes quiet
    assert "no worker has asked" in api.submitter.get(small["id"])["waiting"]
    claimed = api.worker.claim("four", 4)
    assert claimed["job"]["id"] == small["id"]
    time.sleep(0.6)                                                    # busy: it does not claim
    assert "no worker has asked" in api.submitter.get(ray_only["id"])["waiting"]
    api.worker.heartbeat(small["id"], claimed["lease"]["token"])       # but it beats
    assert "no Ray dispatcher" in api.submitter.get(ray_only["id"])["waiting"]
    # a Ray dispatcher at its cap does not claim; its task holds the lease, it beats for it
    time.sleep(0.6)
    api.worker.heartbeat(small["id"], claimed["lease"]["token"], worker="dispatch:ray")
    assert api.submitter.get(ray_only["id"])["waiting"] is None


def test_expired_lease_is_requeued_by_the_service_then_fenced_then_failed(jobs_api):
    api = jobs_api
    job = api.submit(lease_seconds=1, max_attempts=2)
    first = api.worker.claim("doomed", 0)["lease"]["token"]
    # no heartbeat: the server's own sweeper requeues it
    requeued = _wait(lambda: (j := api.submitter.get(job["id"]))["status"] == "queued" and j)
    assert "attempt 1 lost: doomed stopped heartbeating" in requeued["error"]
    assert requeued["progress"]["requeued"]
    second = api.worker.claim("next", 0)["lease"]["token"]
    # the first worker wakes up: every call is fenced, whatever it says
    for call in (lambda: api.worker.heartbeat(job["id"], first),
                 lambda: api.worker.progress(job["id"], first, "pass2", {}),
                 lambda: api.worker.complete(job["id"], first),
                 lambda: api.worker.fail(job["id"], first, "boom")):
        with pytest.raises(LeaseLost, match="no longer yours"):
            call()
    assert api.submitter.get(job["id"])["attempts"] == 2
    assert second != first
    failed = _wait(lambda: (j := api.submitter.get(job["id"]))["status"] == "failed" and j)
    assert "gave up after 2 attempts" in failed["error"] and failed["attempts"] == 2


def test_fail_retries_then_gives_up_and_release_keeps_the_attempt(jobs_api):
    api = jobs_api
    job = api.submit(lease_seconds=30, max_attempts=2)
    lease = api.worker.claim("w", 0)["lease"]["token"]
    api.worker.release(job["id"], lease)                             # shutdown: no attempt spent
    assert api.submitter.get(job["id"])["attempts"] == 0
    lease = api.worker.claim("w", 0)["lease"]["token"]
    after = api.worker.fail(job["id"], lease, "RuntimeError: CUDA error: ECC", retryable=True)
    assert after["status"] == "queued" and "will be retried" in after["error"]
    lease = api.worker.claim("w", 0)["lease"]["token"]
    final = api.worker.fail(job["id"], lease, "RuntimeError: CUDA error: ECC", retryable=True)
    assert final["status"] == "failed" and "after 2 attempts" in final["error"]
    other = api.submit(lease_seconds=30)
    lease = api.worker.claim("w", 0)["lease"]["token"]
    assert api.worker.fail(other["id"], lease, "ValueError: bad data", retryable=False)["status"] == "failed"


def test_cancel_queued_at_once_running_through_the_worker(jobs_api):
    api = jobs_api
    queued = api.submit()
    assert api.submitter.cancel(queued["id"])["status"] == "cancelled"
    assert api.worker.claim("w", 0) is None
    running = api.submit(lease_seconds=30)
    lease = api.worker.claim("w", 0)["lease"]["token"]
    asked = api.submitter.cancel(running["id"])
    assert asked["status"] == "running" and asked["cancel_requested"]
    assert api.worker.heartbeat(running["id"], lease)["cancel_requested"] is True
    assert api.worker.progress(running["id"], lease, "pass1", {})["cancel_requested"] is True
    done = api.worker.fail(running["id"], lease, "cancelled", cancelled=True)
    assert done["status"] == "cancelled" and done["lease"] is None
    finished = api.submit(lease_seconds=30)
    lease = api.worker.claim("w", 0)["lease"]["token"]
    api.worker.complete(finished["id"], lease)
    with pytest.raises(Conflict, match="already succeeded"):
        api.submitter.cancel(finished["id"])


def test_a_result_upload_on_a_full_disk_is_a_507_naming_the_job_and_keeps_the_lease(
        jobs_api, tmp_path, monkeypatch):
    """The registry's disk full under a job's result upload was a bare 500. Now 507 says whose
    result could not be stored and how to make room; nothing is recorded, the worker keeps its
    lease, and the same upload goes through once there is room. The disk is simulated (why not
    a real one: tests/utils/full_disk.py)."""
    from oscar_zoo.zoo.errors import StorageFull, is_transient
    from tests.utils.full_disk import full_disk

    api = jobs_api
    job = api.submit(lease_seconds=60)
    lease = api.worker.claim("w1", 0)["lease"]["token"]
    make_bundle(tmp_path / "a", seed=1)
    staging = api.server.data_dir / "staging"
    with full_disk(monkeypatch, staging, free=0), pytest.raises(StorageFull) as failed:
        api.worker.upload_result(job["id"], lease, tmp_path / "a", "published")
    message = str(failed.value)     # the client's StorageFull for a 507: the registry's message
    assert message.startswith(f"registry {api.server.url}: out of disk space in the registry's "
                              "data dir (No space left on device)")
    assert not is_transient(failed.value)
    assert f"while staging job {job['id']}'s result" in message and "`oscar-zoo db gc`" in message
    assert _count(api.server, BundleVersion) == 0 and list(staging.iterdir()) == []
    assert api.submitter.get(job["id"])["status"] == "running"
    version, created = api.worker.upload_result(job["id"], lease, tmp_path / "a", "published")
    assert created and version["source_job"] == job["id"]


def test_one_version_per_job_even_when_a_retry_uploads_other_bytes(jobs_api, tmp_path):
    api = jobs_api
    job = api.submit(lease_seconds=60, aliases=["recommended"])
    first = api.worker.claim("w1", 0)["lease"]["token"]
    make_bundle(tmp_path / "a", seed=1)
    version, created = api.worker.upload_result(job["id"], first, tmp_path / "a", "published")
    assert created and version["version"] == 1 and version["source_job"] == job["id"]
    assert sorted(version["aliases"]) == ["latest", "recommended"]   # the spec's alias moved
    again, created = api.worker.upload_result(job["id"], first, tmp_path / "a", "published")
    assert not created and again["version"] == 1
    # the worker dies before completing; the retry runs again and makes different bytes
    _expire_lease(api, job["id"])
    _wait(lambda: api.submitter.get(job["id"])["status"] == "queued")
    claimed = api.worker.claim("w2", 0)
    assert claimed["job"]["result_version"] == 1                     # the retry can skip to the end
    make_bundle(tmp_path / "b", seed=2)
    retry, created = api.worker.upload_result(job["id"], claimed["lease"]["token"], tmp_path / "b",
                                              "published")
    assert not created and retry["version"] == 1 and retry["digest"] == version["digest"]
    with pytest.raises(LeaseLost):
        api.worker.upload_result(job["id"], first, tmp_path / "b", "published")
    assert _count(api.server, BundleVersion) == 1
    aliases = api.submitter.registry.aliases("smollm2-135m")
    assert {a["alias"]: a["version"] for a in aliases["items"]} == {"latest": 1, "recommended": 1}
    assert any("calibration job" in (h["reason"] or "") for h in aliases["history"])


def test_a_result_after_a_cancel_is_refused_and_a_cancel_after_a_result_is_refused(jobs_api,
                                                                                     tmp_path):
    """One of the two wins. A cancel asked while the worker uploaded used to end the job
    `succeeded` (the version published, `recommended` moved) or, on Ray, `cancelled` beside
    that published version."""
    api = jobs_api
    make_bundle(tmp_path / "a", seed=1)
    cancelled = api.submit(lease_seconds=30, aliases=["recommended"])
    lease = api.worker.claim("w1", 0)["lease"]["token"]
    api.submitter.cancel(cancelled["id"])
    with pytest.raises(JobCancelled, match="nothing was published"):
        api.worker.upload_result(cancelled["id"], lease, tmp_path / "a", "published")
    assert _count(api.server, BundleVersion) == 0
    assert api.worker.fail(cancelled["id"], lease, "cancelled", cancelled=True)["status"] == "cancelled"

    finishing = api.submit(lease_seconds=30)
    lease = api.worker.claim("w1", 0)["lease"]["token"]
    version, _ = api.worker.upload_result(finishing["id"], lease, tmp_path / "a", "published")
    with pytest.raises(Conflict, match=f"oscar-zoo yank smollm2-135m@{version['version']}"):
        api.submitter.cancel(finishing["id"])
    assert api.worker.complete(finishing["id"], lease)["status"] == "succeeded"


def test_a_job_with_its_result_recorded_is_never_cancelled_beside_it(jobs_api, tmp_path):
    """Requeued after its result was recorded (the worker died before completing), the job
    still took a cancel and ended `cancelled` beside its published version; and a worker's
    fail(cancelled=True) after recording did the same."""
    api = jobs_api
    make_bundle(tmp_path / "b", seed=2)
    racing = api.submit(lease_seconds=30)
    lease = api.worker.claim("w2", 0)["lease"]["token"]
    api.worker.upload_result(racing["id"], lease, tmp_path / "b", "published")
    ended = api.worker.fail(racing["id"], lease, "cancelled", cancelled=True)
    assert ended["status"] == "succeeded" and ended["result"]["version"] is not None
    with pytest.raises(Conflict, match="and succeeded; .*oscar-zoo yank smollm2-135m@"):
        api.submitter.cancel(racing["id"])       # the version to withdraw, not 'nothing to cancel'

    make_bundle(tmp_path / "a", seed=1)
    requeued = api.submit(lease_seconds=60)
    lease = api.worker.claim("w1", 0)["lease"]["token"]
    api.worker.upload_result(requeued["id"], lease, tmp_path / "a", "published")
    _expire_lease(api, requeued["id"])
    _wait(lambda: api.submitter.get(requeued["id"])["status"] == "queued")
    with pytest.raises(Conflict, match="already recorded its result"):
        api.submitter.cancel(requeued["id"])


@pytest.mark.parametrize("status, ends", [("published", "succeeded"), ("draft", "failed")])
def test_a_last_attempt_lost_after_its_result_ends_with_that_result(jobs_api, tmp_path, status,
                                                                    ends):
    """max_attempts 1: the worker records the result (published, aliases moved) and dies
    before it completes. The job used to read failed ("gave up after 1 attempts") beside its
    published version: a user would submit it again. It ends as the worker would have ended it."""
    api = jobs_api
    job = api.submit(lease_seconds=60, max_attempts=1, aliases=["recommended"])
    lease = api.worker.claim("w1", 0)["lease"]["token"]
    make_bundle(tmp_path / "a", seed=1)
    version, _ = api.worker.upload_result(job["id"], lease, tmp_path / "a", status)
    _expire_lease(api, job["id"])
    _wait(lambda: api.submitter.get(job["id"])["status"] not in ("running", "queued"))
    final = api.submitter.get(job["id"])
    assert final["status"] == ends and final["result"]["version"] == version["version"]
    if ends == "succeeded":
        assert final["error"] is None
    else:
        assert "draft version 1" in final["error"] and "validation failed" in final["error"]


def test_a_refused_version_on_the_result_is_a_conflict_not_a_lost_lease(jobs_api, tmp_path):
    # The same bytes as a version since yanked: 409 YankedVersion, while the lease is fine.
    api = jobs_api
    first = api.submit(lease_seconds=30)
    lease = api.worker.claim("w1", 0)["lease"]["token"]
    make_bundle(tmp_path / "a", seed=1)
    api.worker.upload_result(first["id"], lease, tmp_path / "a", "published")
    api.worker.complete(first["id"], lease)
    with api.server.registry.db.write() as session:
        from oscar_zoo.registry_db.publish import yank_version

        yank_version(session, session.scalar(select(BundleVersion)), "broken", by="test")
    second = api.submit(lease_seconds=30)
    lease = api.worker.claim("w2", 0)["lease"]["token"]
    with pytest.raises(Conflict, match="yanked") as refused:
        api.worker.upload_result(second["id"], lease, tmp_path / "a", "published")
    assert not isinstance(refused.value, LeaseLost)
    api.worker.heartbeat(second["id"], lease)              # still ours
    with pytest.raises(LeaseLost):                         # a stale lease is still LeaseLost
        api.worker.upload_result(second["id"], "not-the-lease", tmp_path / "a", "published")


def test_failed_validation_keeps_a_draft_and_moves_no_alias(jobs_api, tmp_path):
    api = jobs_api
    job = api.submit(lease_seconds=30, aliases=["recommended"])
    lease = api.worker.claim("w", 0)["lease"]["token"]
    make_bundle(tmp_path / "a", seed=3)
    version, _ = api.worker.upload_result(job["id"], lease, tmp_path / "a", "draft")
    assert version["status"] == "draft"
    done = api.worker.complete(job["id"], lease, error="validation failed; kept as draft version 1")
    assert done["status"] == "failed" and done["result"]["status"] == "draft"
    assert done["result_version"] == 1
    assert api.submitter.registry.aliases("smollm2-135m")["items"] == []


def test_a_retry_after_a_draft_upload_fails_the_job_with_the_reports_criterion(jobs_api, tmp_path):
    from oscar_zoo.calibrate.executors.worker import Attempt
    from tests.api.ui.seeding import make_validated_bundle

    api = jobs_api
    bundle = make_validated_bundle(tmp_path / "a", passed=False)
    job = api.submit(lease_seconds=60)
    first = api.worker.claim("w1", 0)["lease"]["token"]
    api.worker.upload_result(job["id"], first, bundle.path, "draft")
    _expire_lease(api, job["id"])
    # the worker dies before completing; the retry skips to the end with no report of its own
    _wait(lambda: api.submitter.get(job["id"])["status"] == "queued")
    claimed = api.worker.claim("w2", 0)
    outcome = Attempt(api.worker, claimed["job"], claimed["lease"], "w2", threading.Event()).run()
    done = api.submitter.get(job["id"])
    assert outcome == "failed" and done["status"] == "failed" and done["result_version"] == 1
    assert bundle.manifest.validation.criterion in done["error"] and "None" not in done["error"]


def test_events_stream_every_change_until_the_end(jobs_api):
    api = jobs_api
    job = api.submit(lease_seconds=30)
    seen: list[dict] = []
    reader = threading.Thread(target=lambda: seen.extend(api.submitter.events(job["id"])))
    reader.start()
    lease = api.worker.claim("w", 0)["lease"]["token"]
    for done in range(1, 4):
        api.worker.progress(job["id"], lease, "pass1", {"done": done, "total": 3, "layer": done - 1})
        time.sleep(0.5)
    api.worker.complete(job["id"], lease, {"pass1": 1.0})
    reader.join(15)
    assert not reader.is_alive()
    statuses = [e["status"] for e in seen]
    assert statuses[0] == "queued" and statuses[-1] == "succeeded"
    assert [e["progress"]["done"] for e in seen if e["phase"] == "pass1"] == [1, 2, 3]
    assert seen[-1] == api.submitter.get(job["id"])                 # the same JSON as GET
    with httpx.stream("GET", f"{api.server.url}/v1/jobs/{job['id']}/events") as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert lines[0] == "event: job" and lines[1].startswith("data: {")
    assert httpx.get(f"{api.server.url}/v1/jobs/nope/events").status_code == 404


def test_concurrent_claims_hand_each_job_to_one_worker(jobs_api):
    api = jobs_api
    ids = {api.submit(lease_seconds=60, seed=i)["id"] for i in range(12)}
    got: dict[str, list[str]] = {}
    lock = threading.Lock()

    def worker(n: int):
        with JobsClient(api.server.url, api.worker.registry.token) as client:
            while (claimed := client.claim(f"w{n}", 1)) is not None:
                with lock:
                    got.setdefault(claimed["job"]["id"], []).append(f"w{n}")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert set(got) == ids and all(len(w) == 1 for w in got.values()), got


def test_a_published_result_is_mirrored_to_the_spec_targets(jobs_api, tmp_path, monkeypatch):
    from tests.hub_emulator import HubEmulator, point_hf_client_at

    api = jobs_api
    with HubEmulator() as hub:
        hub.tokens = {"hf_test"}
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        monkeypatch.setenv("HF_TOKEN", "hf_test")
        point_hf_client_at(hub.url, monkeypatch)
        # the server names the repo (for another model's pushes): a job may ask for it; the
        # push uses the server's hub token, so a repo the server never named is refused
        monkeypatch.setenv("OSCAR_ZOO_MIRROR_TARGETS", "qwen3-*=hf:oscar-zoo/rotations")
        job = api.submit(lease_seconds=30, mirror=["hf:oscar-zoo/rotations", "hf:someone/else"])
        lease = api.worker.claim("w", 0)["lease"]["token"]
        make_bundle(tmp_path / "a", seed=4)
        api.worker.upload_result(job["id"], lease, tmp_path / "a", "published")

        def settled():
            ms = [m for m in api.submitter.registry.mirrors("smollm2-135m", 1) if m["status"] != "pending"]
            return ms if len(ms) == 2 else None
        mirrors = _wait(settled, timeout=60)
        assert sorted((m["target"], m["repo"], m["status"]) for m in mirrors) == [
            ("hf", "oscar-zoo/rotations", "done"), ("hf", "someone/else", "failed")], mirrors
        assert hub.repo("hf", "oscar-zoo/rotations").commits
        assert hub.repo("hf", "someone/else") is None

