"""The Ray dispatcher's claim step (calibrate/executors/ray_executor.py) against the real
registry, without a cluster: Ray's own task.options() runs, nothing is scheduled."""

from __future__ import annotations

import time

import pytest

from oscar_zoo.calibrate import jobspec
from oscar_zoo.calibrate.executors import ray_executor as R
from oscar_zoo.calibrate.executors import worker as W
from oscar_zoo.zoo.errors import LeaseLost, OfflineError
from tests.utils.bundles import make_bundle


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


def test_a_task_that_raised_is_reported_retryable_not_failed_for_good(jobs_api, monkeypatch):
    ray = pytest.importorskip("ray")
    job = jobs_api.submit(max_attempts=3, lease_seconds=30)
    lease = jobs_api.worker.claim("dispatch:test", None, ray=True)["lease"]["token"]

    # Mocked: ray.get (no cluster here) raising what Ray raises for a task whose attach hit a
    # registry blip, or a Ray system error.
    def task_raised(ref):
        raise ray.exceptions.RayTaskError("run_task", "Traceback ...",
                                          OfflineError("cannot reach the registry"))

    monkeypatch.setattr(ray, "get", task_raised)
    R._landed(jobs_api.worker, "ref", R.Flight(job["id"], lease, 30.0, 0.0))
    after = jobs_api.submitter.get(job["id"])
    assert after["status"] == "queued" and after["attempts"] == 1, after   # tried again

    def system_error(ref):
        raise ray.exceptions.WorkerCrashedError()

    lease = jobs_api.worker.claim("dispatch:test", None, ray=True)["lease"]["token"]
    monkeypatch.setattr(ray, "get", system_error)
    R._landed(jobs_api.worker, "ref", R.Flight(job["id"], lease, 30.0, 0.0))
    assert jobs_api.submitter.get(job["id"])["status"] == "queued"


def test_the_task_retries_its_attach_through_a_registry_blip(jobs_api, monkeypatch):
    job = jobs_api.submit(lease_seconds=30)
    lease = jobs_api.worker.claim("dispatch:test", None, ray=True)["lease"]["token"]
    real, calls = jobs_api.worker.attach, []

    def blip_then_real(*args):   # mocked: the registry answers once with a connection error
        calls.append(args)
        if len(calls) == 1:
            raise OfflineError("cannot reach the registry")
        return real(*args)

    monkeypatch.setattr(jobs_api.worker, "attach", blip_then_real)
    attached = R._attach(jobs_api.worker, job["id"], lease, "ray-task:test", patience=10)
    assert attached["id"] == job["id"] and len(calls) == 2
    assert jobs_api.submitter.get(job["id"])["attempts"] == 1     # the blip spent no attempt
    with pytest.raises(OfflineError):                             # bounded
        monkeypatch.setattr(jobs_api.worker, "attach", lambda *a: (_ for _ in ()).throw(
            OfflineError("down")))
        R._attach(jobs_api.worker, job["id"], lease, "ray-task:test", patience=0)


def test_an_attach_whose_reply_was_lost_is_retried_without_spending_an_attempt(jobs_api,
                                                                              monkeypatch):
    job = jobs_api.submit(max_attempts=3, lease_seconds=30)
    lease = jobs_api.worker.claim("dispatch:test", None, ray=True)["lease"]["token"]
    real, calls, answers = jobs_api.worker.attach, [], []

    def landed_but_reply_lost(*args):   # mocked: the attach lands, its answer never comes back
        calls.append(args)
        answers.append(real(*args))
        if len(calls) == 1:
            raise OfflineError("cannot reach the registry (read timed out)")
        return answers[-1]

    monkeypatch.setattr(jobs_api.worker, "attach", landed_but_reply_lost)
    attached = R._attach(jobs_api.worker, job["id"], lease, "ray-task:h:1:node:f00", patience=10)
    assert len(calls) == 2 and attached["attempts"] == 1
    # the task token the lost reply carried, not one that fences it (the registry keeps only
    # its hash: the retry's is derived the same), and it holds the lease
    token = attached["lease"]["token"]
    assert token == answers[0]["lease"]["token"] != lease
    jobs_api.worker.progress(job["id"], token, "loading", {})
    after = jobs_api.submitter.get(job["id"])
    assert after["status"] == "running" and after["attempts"] == 1, after
    assert after["lease"]["holder"] == "ray-task:h:1:node:f00"


class TaskContext:   # ray.get_runtime_context() in a task (there is no Ray task here)
    def get_node_id(self):
        return "0123456789abcdef"

    def get_assigned_resources(self):
        return {"CPU": 1.0}


def test_a_ray_retry_fences_the_task_it_replaces_and_the_dispatcher_keeps_the_lease(
        jobs_api, monkeypatch):
    """Ray retries a task whose node it took for dead while the first process lives on (a
    partition): both attached with the dispatcher's token and reported with it, so the first
    could publish while its retry ran. Mocked: the task's runtime context, and its runner (no
    model), during which the retry attaches."""
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")                 # run_task sets it
    monkeypatch.setattr(ray, "get_runtime_context", lambda: TaskContext())
    job = jobs_api.submit(max_attempts=3, lease_seconds=30)
    lease = jobs_api.worker.claim("dispatch:test", None, ray=True)["lease"]["token"]
    tokens = {}

    def runner_outlived_by_a_retry(self, work):
        tokens["first"] = self.token
        tokens["retry"] = jobs_api.worker.attach(job["id"], lease, "ray-task:h:2:node:b0a")[
            "lease"]["token"]
        make_bundle(work / "bundle")
        return self._finish(work, {"bundle_dir": str(work / "bundle"), "timings": {}})

    monkeypatch.setattr(W.Attempt, "_run_child", runner_outlived_by_a_retry)
    outcome = R.run_task(jobs_api.server.url, jobs_api.worker.registry.token, job["id"], lease)
    assert outcome == "lost" and len({lease, tokens["first"], tokens["retry"]}) == 3
    after = jobs_api.submitter.get(job["id"])
    assert after["status"] == "running" and after["attempts"] == 2, after
    assert after["result_version"] is None and after["lease"]["holder"] == "ray-task:h:2:node:b0a"
    with pytest.raises(LeaseLost):
        jobs_api.worker.heartbeat(job["id"], tokens["first"])
    # the dispatcher's own calls still hold with its claim token: a heartbeat, a report
    f = R.Flight(job["id"], lease, 30.0, 0.0)
    assert R._beat(jobs_api.worker, "ref", f, {"ref": f}, grace=1.0) and f.lost_at is None
    jobs_api.worker.progress(job["id"], tokens["retry"], "pass1", {"done": 1, "total": 2})
    R._report(jobs_api.worker, f, "the Ray task failed: WorkerCrashedError", retryable=True)
    assert jobs_api.submitter.get(job["id"])["status"] == "queued"


def test_an_attach_to_a_job_cancelled_meanwhile_ends_it_cancelled(jobs_api):
    job = jobs_api.submit(max_attempts=1, lease_seconds=30)
    lease = jobs_api.worker.claim("dispatch:test", None, ray=True)["lease"]["token"]
    jobs_api.worker.attach(job["id"], lease, "ray-task:h:1:node:f00")
    jobs_api.submitter.cancel(job["id"])              # then the task's process dies: Ray retries
    with pytest.raises(LeaseLost, match="cancelled"):
        R._attach(jobs_api.worker, job["id"], lease, "ray-task:h:2:node:b0a", patience=10)
    after = jobs_api.submitter.get(job["id"])
    assert after["status"] == "cancelled" and after["attempts"] == 1 and after["error"] is None


def test_the_dispatcher_beats_in_its_own_name_so_it_counts_as_seen_at_its_cap(jobs_api,
                                                                             monkeypatch):
    from oscar_zoo.registry_db import workers as workers_db

    job = jobs_api.submit(lease_seconds=30)
    lease = jobs_api.worker.claim("dispatch:test", None, ray=True)["lease"]["token"]
    jobs_api.worker.attach(job["id"], lease, "ray-task:test")          # the task holds it now
    ray_only = jobs_api.submit(ray_resources={"worker_node": 1})
    monkeypatch.setattr(workers_db, "SEEN_S", 0.5)
    time.sleep(0.6)                                   # at its cap, the dispatcher claims nothing
    assert "no worker has asked" in jobs_api.submitter.get(ray_only["id"])["waiting"]
    f = R.Flight(job["id"], lease, 30.0, 0.0)
    assert R._beat(jobs_api.worker, "ref", f, {"ref": f}, grace=1.0, worker="dispatch:test")
    assert jobs_api.submitter.get(ray_only["id"])["waiting"] is None


@pytest.mark.parametrize("end", ["complete", "fail", "cancel"])
def test_a_task_that_ended_its_job_is_left_to_land_not_force_cancelled(jobs_api, end):
    job = jobs_api.submit(lease_seconds=30)
    lease = jobs_api.worker.claim("dispatch:test", None, ray=True)["lease"]["token"]
    task = jobs_api.worker.attach(job["id"], lease, "ray-task:test")["lease"]["token"]
    if end == "complete":
        jobs_api.worker.complete(job["id"], task, {}, {"done": 1})   # the task's last call
    elif end == "fail":
        jobs_api.worker.fail(job["id"], task, "broke", retryable=False)
    else:
        jobs_api.submitter.cancel(job["id"])
        jobs_api.worker.fail(job["id"], task, "cancelled", cancelled=True)
    f = R.Flight(job["id"], lease, 30.0, 0.0)
    flights = {"ref": f}
    assert R._beat(jobs_api.worker, "ref", f, flights, grace=0.2) is True   # it cleans up
    assert flights == {"ref": f} and f.lost_at is not None
    assert R._beat(jobs_api.worker, "ref", f, flights, grace=0.2) is True
    time.sleep(0.5)                       # ... but a task that never lands is force-cancelled
    assert R._beat(jobs_api.worker, "ref", f, flights, grace=0.2) is False and flights == {}


def test_a_task_whose_job_was_requeued_is_force_cancelled(jobs_api):
    job = jobs_api.submit(lease_seconds=30)
    lease = jobs_api.worker.claim("dispatch:test", None, ray=True)["lease"]["token"]
    jobs_api.worker.release(job["id"], lease)                  # requeued (by the sweeper, say)
    f = R.Flight(job["id"], lease, 30.0, 0.0)
    flights = {"ref": f}
    assert R._beat(jobs_api.worker, "ref", f, flights, grace=10.0) is False and flights == {}


def test_a_task_no_node_can_place_is_noted_then_cleared_when_such_a_node_joins(jobs_api,
                                                                              monkeypatch):
    """The grace period's other end (the real cluster test, test_ray.py, covers the failure):
    Ray's node list is mocked here, as a node that joins cannot be had without a cluster."""
    job = jobs_api.submit(lease_seconds=30, ray_resources={"late": 1})
    lease = jobs_api.worker.claim("dispatch:test", None, ray=True)["lease"]["token"]
    f = R.Flight(job["id"], lease, 30.0, 0.0, demand={"CPU": 1, "late": 1})
    flights = {"ref": f}
    nodes = [{"CPU": 4, "head": 1}]
    monkeypatch.setattr(R, "_node_totals", lambda: nodes)
    R._check_placement(jobs_api.worker, flights, limit=60)
    waiting = jobs_api.submitter.get(job["id"])["waiting"]
    assert "late=1" in waiting and "late=0" in waiting and "60 s" in waiting
    nodes.append({"CPU": 1, "late": 1})                        # the autoscaler added one
    R._check_placement(jobs_api.worker, flights, limit=60)
    after = jobs_api.submitter.get(job["id"])
    assert after["status"] == "running" and after["waiting"] is None and flights == {"ref": f}
    assert after["progress"]["waiting_for"] == "Ray: CPU=1, late=1"
    # a task that attached meanwhile keeps its own progress
    task = jobs_api.worker.attach(job["id"], lease, "ray-task:h:1:node:f00")["lease"]["token"]
    jobs_api.worker.progress(job["id"], task, "loading", {"done": 0, "total": 1})
    nodes.pop()
    R._check_placement(jobs_api.worker, flights, limit=60)
    assert jobs_api.submitter.get(job["id"])["phase"] == "loading"


def test_the_dispatcher_claims_while_its_jobs_leave_gpus_free(monkeypatch):
    """Counting jobs, not GPUs, the dispatcher claimed 7 more jobs behind an 8-GPU one on an
    8-GPU cluster: they waited in Ray's queue, shown `running`, where another worker could
    have run them."""
    monkeypatch.delenv("OSCAR_ZOO_WORKERS", raising=False)

    def flights(*gpus):
        return {i: R.Flight(str(i), "lease", 30.0, 0.0, demand={"CPU": 1, **({"GPU": g} if g else {})})
                for i, g in enumerate(gpus)}

    assert R._room(flights(), 8) and R._room(flights(1, 1, 4), 8)
    assert not R._room(flights(8), 8) and not R._room(flights(4, 4), 8)
    assert not R._room(flights(*[1] * 8), 8)
    assert R._room(flights(), 0) and not R._room(flights(0), 0)    # no GPUs: one at a time
    unplaceable = flights(16)
    unplaceable[0].unplaceable_since = 0.0     # no node has 16: it holds none of the 8
    assert R._room(unplaceable, 8)
    monkeypatch.setenv("OSCAR_ZOO_WORKERS", "3")                    # the user's cap, in jobs
    assert R._room(flights(8, 8), 8) and not R._room(flights(1, 1, 1), 8)
