"""The Ray dispatcher's claim step (calibrate/executors/ray_executor.py) against the real
registry, without a cluster: Ray's own task.options() runs, nothing is scheduled."""

from __future__ import annotations

import time

import pytest

from oscar_zoo.calibrate import jobspec
from oscar_zoo.calibrate.executors import ray_executor as R


@pytest.mark.parametrize("resources", [{"GPU": 1}, {"CPU": 4}, {"worker_node": -1}])
def test_a_job_ray_refuses_fails_with_rays_message_and_the_dispatcher_goes_on(
        jobs_api, monkeypatch, resources):
    ray = pytest.importorskip("ray")
    # A job stored before the submit check existed (the server runs in this process).
    monkeypatch.setattr(jobspec, "_check_ray_resources", lambda resources: None)
    job = jobs_api.submit(ray_resources=resources, max_attempts=3)
    flights: dict = {}
    R._claim_one(jobs_api.worker, "dispatch:test", ray.remote(R.run_task), flights,
                 cluster_gpus=1, wait=0)
    after = jobs_api.submitter.get(job["id"])
    assert flights == {}
    assert after["status"] == "failed" and after["attempts"] == 1, after
    assert "Ray refused the task" in after["error"] and "ValueError" in after["error"]


def test_a_force_cancelled_task_is_reported_only_once_ray_says_it_ended(jobs_api, monkeypatch):
    ray = pytest.importorskip("ray")
    job = jobs_api.submit(lease_seconds=30)
    lease = jobs_api.worker.claim("dispatch:test", None, ray=True)["lease"]["token"]
    jobs_api.submitter.cancel(job["id"])
    f = R.Flight(job["id"], lease, 30.0, 0.0, cancel_since=time.monotonic() - 10)   # ignored it
    flights = {"ref": f}
    assert R._beat(jobs_api.worker, "ref", f, flights, grace=1.0) is False   # force-cancel it
    still = jobs_api.submitter.get(job["id"])
    assert still["status"] == "running" and flights == {"ref": f}   # the task may still hold a GPU
    assert R._beat(jobs_api.worker, "ref", f, flights, grace=1.0) is True    # sent once

    def cancelled_task(ref):
        raise ray.exceptions.TaskCancelledError()

    monkeypatch.setattr(ray, "get", cancelled_task)
    R._landed(jobs_api.worker, "ref", flights.pop("ref"))
    after = jobs_api.submitter.get(job["id"])
    assert after["status"] == "cancelled"
