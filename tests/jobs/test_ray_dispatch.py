"""The Ray dispatcher's claim step (calibrate/executors/ray_executor.py) against the real
registry, without a cluster: Ray's own task.options() runs, nothing is scheduled."""

from __future__ import annotations

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
