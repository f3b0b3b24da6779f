"""`oscar-zoo worker --executor ray` refuses the local worker's options instead of ignoring
them; `serve`'s Ray executor hands its tasks the public registry URL and starts its dispatcher
with --exit-with-parent. Nothing here needs a Ray cluster (dispatch is never reached)."""

from __future__ import annotations

import logging

import pytest
from click.testing import CliRunner

from oscar_zoo.calibrate.executors import ray_executor as R
from oscar_zoo.zoo.cli.worker_cmd import worker_command


@pytest.mark.parametrize("option", [["--once"], ["--gpus", "2"]])
def test_worker_with_the_ray_executor_refuses_local_only_options(option, monkeypatch):
    called = []
    monkeypatch.setattr(R, "dispatch", lambda *a, **k: called.append(a))
    result = CliRunner().invoke(worker_command, ["--registry", "http://127.0.0.1:1", "--executor",
                                                 "ray", "--ray-address", "x:1", *option])
    assert result.exit_code == 2 and option[0] in result.output, result.output
    assert not called


def test_the_ray_executor_hands_tasks_the_public_url_and_dies_with_serve(monkeypatch):
    spawned = []
    monkeypatch.setattr(R.subprocess, "Popen", lambda cmd, **kw: spawned.append(cmd))
    monkeypatch.setenv("OSCAR_ZOO_PUBLIC_URL", "http://10.1.2.3:8000/")
    R.RayExecutor("http://127.0.0.1:8000", "tok", "10.1.2.3:6379")._spawn()
    cmd = spawned[0]
    assert cmd[cmd.index("--registry") + 1] == "http://10.1.2.3:8000"
    assert "--exit-with-parent" in cmd
    monkeypatch.delenv("OSCAR_ZOO_PUBLIC_URL")
    R.RayExecutor("http://127.0.0.1:8000", "tok", "10.1.2.3:6379")._spawn()
    assert spawned[1][spawned[1].index("--registry") + 1] == "http://127.0.0.1:8000"


def test_a_loopback_registry_url_is_warned_about(caplog):
    with caplog.at_level(logging.WARNING, logger="oscar_zoo.ray"):
        R._warn_if_loopback("http://127.0.0.1:8000")
        R._warn_if_loopback("http://[::1]:8000")
        R._warn_if_loopback("http://10.1.2.3:8000")
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and "OSCAR_ZOO_PUBLIC_URL" in warned[0]


def test_the_runner_of_a_ray_task_gets_the_hosts_cpus_not_rays_one_thread(monkeypatch):
    """Ray sets OMP_NUM_THREADS=1 in a num_cpus=1 task's process; the runner inherits the
    task's environment. Mocked: the task's runtime context (there is no Ray task here) and its
    attach (no registry), which ends the task before any runner starts."""
    import ray

    from oscar_zoo.zoo.errors import LeaseLost

    class Context:
        def get_node_id(self):
            return "0123456789abcdef"

        def get_assigned_resources(self):
            return {"CPU": 1.0}

    def lost(*args, **kwargs):
        raise LeaseLost("gone")

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setattr(ray, "get_runtime_context", lambda: Context())
    monkeypatch.setattr(R, "_attach", lost)
    assert R.run_task("http://127.0.0.1:1", "tok", "job", "lease").startswith("lost")
    import os

    assert os.environ["OMP_NUM_THREADS"] == str(R._host_cpus()) and R._host_cpus() >= 1


def test_ray_tasks_sharing_a_gpu_host_share_its_cpus():
    """Each task's runner took every CPU of the host: eight 1-GPU jobs on an 8-GPU node ran
    eight times as many threads as it has CPUs."""
    assert R._runner_threads(64, 1, 8) == 8 and R._runner_threads(64, 2, 8) == 16
    assert R._runner_threads(64, 8, 8) == 64 and R._runner_threads(4, 1, 8) == 1
    assert R._runner_threads(64, 0, 8) == 64 and R._runner_threads(64, 1, 0) == 64
