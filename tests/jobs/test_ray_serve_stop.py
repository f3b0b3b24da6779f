"""`serve` stopping its Ray executor (api/jobs_runtime.py, calibrate/executors/ray_executor.py)
against the real registry, without a cluster. uvicorn closes the server's sockets before the
app's shutdown runs, so the dispatcher's own release calls find no server: serve must release
the jobs of its dispatcher and of the dispatcher's tasks itself, as it does for local workers."""

from __future__ import annotations

import pytest

from oscar_zoo.api.jobs_runtime import JobsRuntime
from oscar_zoo.calibrate.executors import ray_executor as R
from oscar_zoo.calibrate.executors import worker as W


class Exited:
    """The dispatcher process, which gave up on releasing over HTTP and exited."""

    pid, returncode = 4242, 0

    def poll(self):
        return 0


class TaskContext:
    def get_node_id(self):
        return "f" * 56

    def get_assigned_resources(self):
        return {"CPU": 1.0}


def _executor(monkeypatch) -> tuple[R.RayExecutor, str]:
    """A RayExecutor that 'started' its dispatcher: the name serve gave it."""
    started = []
    monkeypatch.setattr(R.subprocess, "Popen", lambda cmd, **kw: started.append(cmd) or Exited())
    executor = R.RayExecutor("http://127.0.0.1:1", "token", "127.0.0.1:6379")
    executor._spawn()
    cmd = started[0]
    assert "--worker-id" in cmd, "serve does not know its dispatcher's name"
    name = cmd[cmd.index("--worker-id") + 1]
    assert name.startswith("dispatch:")
    return executor, name


def _runtime(api, executor) -> JobsRuntime:
    runtime = JobsRuntime(api.server.app)
    runtime.executor = executor
    return runtime


def test_serve_stopping_gives_back_a_job_its_dispatcher_holds(jobs_api, monkeypatch):
    executor, dispatcher = _executor(monkeypatch)
    job = jobs_api.submit(lease_seconds=60, max_attempts=3)
    assert jobs_api.worker.claim(dispatcher, None, ray=True)["job"]["id"] == job["id"]
    _runtime(jobs_api, executor).stop()
    after = jobs_api.submitter.get(job["id"])
    assert after["status"] == "queued" and after["attempts"] == 0, after


def test_serve_stopping_gives_back_a_job_a_task_of_its_dispatcher_attached_to(jobs_api,
                                                                              monkeypatch):
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")                 # run_task sets it
    monkeypatch.setattr(ray, "get_runtime_context", lambda: TaskContext())
    executor, dispatcher = _executor(monkeypatch)
    other = jobs_api.submit(lease_seconds=60, max_attempts=3)  # another dispatcher's: kept
    other_lease = jobs_api.worker.claim("dispatch:elsewhere:1:abc", None, ray=True)["lease"]
    jobs_api.worker.attach(other["id"], other_lease["token"], "ray-task:h:1:node:f00")
    job = jobs_api.submit(lease_seconds=60, max_attempts=3)
    lease = jobs_api.worker.claim(dispatcher, None, ray=True)["lease"]["token"]
    seen = {}

    def serve_stops_while_the_task_runs(self, work):
        assert jobs_api.submitter.get(job["id"])["lease"]["holder"] == self.worker   # attached
        _runtime(jobs_api, executor).stop()
        seen.update(jobs_api.submitter.get(job["id"]))
        return "released"

    monkeypatch.setattr(W.Attempt, "_run_child", serve_stops_while_the_task_runs)
    R.run_task(jobs_api.server.url, jobs_api.worker.registry.token, job["id"], lease, dispatcher)
    assert seen["status"] == "queued" and seen["attempts"] == 0, seen
    assert jobs_api.submitter.get(other["id"])["status"] == "running"
