"""The ray executor on a real local Ray cluster: a head node plus a second node started with
`ray start`, each with one CPU and a custom resource of its own. The job asks for the second
node's resource, so its task can only run there; the task's worker process is SIGKILLed in
pass 1, Ray retries the task, and the job completes with exactly one version. A variant of the
cluster declares 2 GPUs on the second node, for the dispatcher's GPU accounting.

Teardown ends the cluster's processes by pid: those of the process groups `ray start` made
(found by this test's own temp dir), and their descendants (Ray's worker processes) - not
`ray stop`, which would stop every Ray cluster on the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pytest

from tests.utils.registry_server import free_socket

from .serve import (MODEL_CACHE, Serve, alive, children, fault_spec, in_phase, versions_of,
                    wait_for)

pytestmark = [pytest.mark.model, pytest.mark.slow, pytest.mark.timeout(600)]
RAY = Path(sys.executable).with_name("ray")


def _port() -> int:
    sock = free_socket()
    port = sock.getsockname()[1]
    sock.close()
    return port


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _groups_of(temp_dir: str) -> set[int]:
    """Process groups of the processes whose command line names our temp dir (`ray start`
    puts each node's daemons in a group of their own), never the test's own group."""
    groups = set()
    for pid in _pids():
        if pid != os.getpid() and temp_dir in _cmdline(pid):
            try:
                groups.add(os.getpgid(pid))
            except ProcessLookupError:
                pass
    return groups - {os.getpgid(0)}


def _tree(groups: set[int], temp_dir: str) -> set[int]:
    """Every process in these groups or naming our temp dir, and all their descendants."""
    found = set()
    for pid in _pids():
        try:
            if os.getpgid(pid) in groups or temp_dir in _cmdline(pid):
                found.add(pid)
        except ProcessLookupError:
            pass
    todo = list(found)
    while todo:
        for child in children(todo.pop()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _ray_start(args: list[str], env: dict) -> None:
    # A session of its own: the node's daemons share its process group, never the test's.
    out = subprocess.run([str(RAY), "start", *args, "--disable-usage-stats"], env=env,
                         capture_output=True, text=True, timeout=180, start_new_session=True)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]


@contextlib.contextmanager
def _cluster(monkeypatch, worker_args: list[str]):
    """A head node (1 CPU, resource `head`) and a second node (`worker_args`, resource
    `worker_node`): yields the head's address."""
    # Ray's unix socket paths must stay short: a temp dir of our own under /tmp.
    temp_dir = tempfile.mkdtemp(prefix="ozray-", dir="/tmp")
    # A ~/.ray/auth_token left by some other Ray use (`ray get-auth-token --generate`) makes the
    # second node's `ray start` fail to authenticate to our head: Ray gets a home of its own.
    monkeypatch.setenv("HOME", temp_dir)
    port = _port()
    env = {**os.environ, "OSCAR_ZOO_CACHE": str(MODEL_CACHE), "RAY_USAGE_STATS_ENABLED": "0",
           "TOKENIZERS_PARALLELISM": "false", "TMPDIR": temp_dir}
    groups: set[int] = set()
    try:
        _ray_start(["--head", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=1",
                    "--resources", json.dumps({"head": 1}), "--include-dashboard=false",
                    f"--temp-dir={temp_dir}", f"--ray-client-server-port={_port()}",
                    f"--dashboard-agent-listen-port={_port()}"], env)
        groups |= _groups_of(temp_dir)
        _ray_start([f"--address=127.0.0.1:{port}", "--node-ip-address=127.0.0.1", *worker_args,
                    "--resources", json.dumps({"worker_node": 1}),
                    f"--dashboard-agent-listen-port={_port()}"], env)
        groups |= _groups_of(temp_dir)
        assert len(groups) == 2, f"expected one process group per node, found {groups}"
        yield f"127.0.0.1:{port}"
    finally:
        groups |= _groups_of(temp_dir)
        for _ in range(3):                      # workers may be forked while we collect
            tree = _tree(groups, temp_dir) - {os.getpid()}
            for pid in tree:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.5)
        wait_for(lambda: not [p for p in _tree(groups, temp_dir) - {os.getpid()} if alive(p)], 15,
                 what="the Ray cluster's processes ending")
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture
def ray_cluster(monkeypatch):
    with _cluster(monkeypatch, ["--num-cpus=1"]) as address:
        yield address


@pytest.fixture
def ray_gpu_cluster(monkeypatch):
    """The second node declares 2 GPUs. Ray counts them as it counts any resource (this
    machine has none: what is tested is the scheduling and the dispatcher's accounting, not
    CUDA; the runners see CUDA_VISIBLE_DEVICES set and fall back to the CPU) and 3 CPUs, so
    that a 2-GPU task or two 1-GPU tasks fit beside each other's 1 CPU."""
    with _cluster(monkeypatch, ["--num-cpus=3", "--num-gpus=2"]) as address:
        yield address


def test_job_runs_on_the_worker_node_and_survives_its_worker_process_being_killed(
        ray_cluster, tmp_path, four_layers):
    with Serve(tmp_path / "srv", OSCAR_ZOO_EXECUTOR="ray", OSCAR_ZOO_RAY_ADDRESS=ray_cluster) as srv:
        with srv.client() as c:
            job, _ = c.submit(fault_spec(four_layers, seed=11, ray_resources={"worker_node": 1}))
        running = in_phase(srv, job["id"], ("pass1",), timeout=300)
        first = running["progress"]["worker"]
        assert running["lease"]["holder"].startswith("ray-task[dispatch:")
        assert first["ray_resources"].get("worker_node") == 1.0        # it runs on the 2nd node
        os.kill(first["pid"], signal.SIGKILL)                          # the task's worker process
        wait_for(lambda: not alive(first["runner_pid"]), 10, what="the runner dying with it")
        with srv.client() as c:
            done = wait_for(lambda: (j := c.get(job["id"]))["status"] in ("succeeded", "failed") and j,
                            300, what="Ray's retry finishing the job")
        assert done["status"] == "succeeded" and done["attempts"] == 2, done
        second = done["progress"]["worker"]
        assert second["ray_resources"].get("worker_node") == 1.0
        assert second["ray_node_id"] == first["ray_node_id"]
        versions = [v for v in versions_of(srv, "smollm2-135m-4l") if v["source_job"] == job["id"]]
        assert len(versions) == 1


def _dispatcher_log(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def _dispatcher(server, ray_cluster: str, **env) -> tuple[list[str], dict]:
    """`oscar-zoo worker --executor ray` against this registry and cluster: (command, env)."""
    return ([sys.executable, "-P", "-m", "oscar_zoo.zoo.cli.main", "worker", "--registry",
             server.url, "--executor", "ray", "--ray-address", ray_cluster],
            {**os.environ, "OSCAR_ZOO_TOKEN": server.token("jobs:work"),
             "RAY_USAGE_STATS_ENABLED": "0", **env})


@contextlib.contextmanager
def _running_dispatcher(server, ray_cluster: str, log_path: Path, **env):
    """A dispatcher (see _dispatcher) writing to `log_path` while the block runs; SIGTERMed after."""
    cmd, env = _dispatcher(server, ray_cluster, **env)
    with open(log_path, "w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


@pytest.mark.parametrize("stop", ["sigterm", "parent_killed"])
def test_a_stopped_dispatcher_gives_its_jobs_back_without_spending_an_attempt(
        ray_cluster, tmp_path, stop):
    """SIGTERM (ray.init() replaced its handler: the graceful stop was never taken) or the
    parent gone (--exit-with-parent, as `serve` starts it): the task in flight is cancelled
    and its lease released, so the job is queued again with its attempt refunded."""
    from oscar_zoo.zoo.jobs_client import JobsClient
    from tests.utils.registry_server import run_registry

    with run_registry(f"sqlite:///{tmp_path}/reg.sqlite", tmp_path / "data") as server, \
            JobsClient(server.url, server.token("jobs:submit")) as submitter:
        # a resource no node has: the task stays in flight, waiting for it
        job, _ = submitter.submit({"model": "smollm2-135m", "ray_resources": {"nowhere": 1}})
        log_path = tmp_path / "dispatcher.log"
        cmd, env = _dispatcher(server, ray_cluster)
        with open(log_path, "w") as out:
            if stop == "sigterm":
                proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                        start_new_session=True)
            else:    # a parent (standing in for serve) that is SIGKILLed
                proc = subprocess.Popen(["sh", "-c", 'exec 3>&-; "$@" & echo $!; wait', "sh",
                                         *cmd, "--exit-with-parent"], env=env,
                                        stdout=subprocess.PIPE, stderr=out, text=True,
                                        start_new_session=True)
        dispatcher = proc.pid if stop == "sigterm" else int(proc.stdout.readline())
        try:
            wait_for(lambda: submitter.get(job["id"])["status"] == "running", 120,
                     what="the dispatcher claiming the job")
            time.sleep(3)   # its task submitted, waiting for a resource no node has
            if stop == "sigterm":
                proc.send_signal(signal.SIGTERM)
            else:
                os.kill(proc.pid, signal.SIGKILL)
            wait_for(lambda: not alive(dispatcher), 90, what="the dispatcher stopping")
            after = submitter.get(job["id"])
            assert after["status"] == "queued" and after["attempts"] == 0, (
                after, _dispatcher_log(log_path)[-3000:])
            assert "given back" in _dispatcher_log(log_path)
        finally:
            for pid in (dispatcher, proc.pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            proc.wait(10)


def test_a_job_no_node_can_ever_run_fails_after_the_grace_period_and_frees_the_dispatcher(
        ray_cluster, tmp_path):
    """Ray leaves a task whose demand fits no alive node pending forever (it calls it
    infeasible): its job showed `running` for good and, at the dispatcher's cap of 1, every
    job behind it waited. The dispatcher notes why in the job's `waiting`, then, past
    OSCAR_ZOO_RAY_INFEASIBLE_SECONDS, cancels the task and fails the job without a retry."""
    from oscar_zoo.zoo.jobs_client import JobsClient
    from tests.utils.registry_server import run_registry

    with run_registry(f"sqlite:///{tmp_path}/reg.sqlite", tmp_path / "data") as server, \
            JobsClient(server.url, server.token("jobs:submit")) as submitter:
        nowhere, _ = submitter.submit({"model": "smollm2-135m", "max_attempts": 3,
                                       "ray_resources": {"nowhere": 1}})
        too_much, _ = submitter.submit({"model": "smollm2-135m", "seed": 1,
                                        "ray_resources": {"worker_node": 2}})
        log_path = tmp_path / "dispatcher.log"
        with _running_dispatcher(server, ray_cluster, log_path, OSCAR_ZOO_WORKERS="1",
                                 OSCAR_ZOO_RAY_INFEASIBLE_SECONDS="2"):
            waiting = wait_for(lambda: "Ray cannot place" in (w := submitter.get(
                nowhere["id"])["waiting"] or "") and w, 120,
                what="the job saying that no node has what it asks for")
            assert "nowhere=1" in waiting and "OSCAR_ZOO_RAY_INFEASIBLE_SECONDS" in waiting
            assert submitter.get(too_much["id"])["status"] == "queued"    # behind it, at the cap
            failed = wait_for(lambda: (j := submitter.get(nowhere["id"]))["status"] != "running"
                              and j, 60, what="the job failing")
            assert failed["status"] == "failed" and failed["attempts"] == 1, failed   # no retry
            for part in ("Ray cannot place", "nowhere=1", "the most any node has", "nowhere=0",
                         "ray start", "ray_resources"):
                assert part in failed["error"], failed["error"]
            assert failed["waiting"] is None
            # the dispatcher's slot is free again: the next job is claimed (and meets the same end)
            second = wait_for(lambda: (j := submitter.get(too_much["id"]))["status"] == "failed"
                              and j, 60, what="the next job being claimed and failed")
            assert "worker_node=2" in second["error"] and "worker_node=1" in second["error"]
            assert "Ray cannot place" in _dispatcher_log(log_path)


def test_jobs_fill_the_declared_gpus_and_each_runner_gets_its_share_of_the_cpus(
        ray_gpu_cluster, tmp_path, four_layers, monkeypatch):
    """A 2-GPU job fills the cluster's 2 GPUs: the dispatcher claims nothing behind it (a
    claimed job would only wait in Ray's queue, shown `running`). Once it ends, two 1-GPU jobs
    run side by side, and each runner gets half the host's CPUs; the 2-GPU one had them all."""
    from oscar_zoo.calibrate.executors.ray_executor import _host_cpus
    from oscar_zoo.zoo.jobs_client import JobsClient
    from tests.utils.registry_server import run_registry

    monkeypatch.delenv("OSCAR_ZOO_WORKERS", raising=False)     # the GPU count is the cap
    with run_registry(f"sqlite:///{tmp_path}/reg.sqlite", tmp_path / "data") as server, \
            JobsClient(server.url, server.token("jobs:submit")) as submitter:
        wide, _ = submitter.submit(fault_spec(four_layers, seed=1, gpus=2))
        narrow = [submitter.submit(fault_spec(four_layers, seed=s, gpus=1))[0] for s in (2, 3)]
        log_path = tmp_path / "dispatcher.log"
        ids = [wide["id"], *(j["id"] for j in narrow)]

        def ended() -> list[dict] | None:
            now = [submitter.get(i) for i in ids]
            return now if all(j["status"] in ("succeeded", "failed") for j in now) else None

        with _running_dispatcher(server, ray_gpu_cluster, log_path):
            jobs = wait_for(ended, 400, what="the three jobs ending")
        log = _dispatcher_log(log_path)[-3000:]
        assert [j["status"] for j in jobs] == ["succeeded"] * 3, (jobs, log)
        wide, *narrow = jobs
        at = {j["id"]: (datetime.fromisoformat(j["started_at"]), datetime.fromisoformat(j["finished_at"]))
              for j in jobs}
        (_, wide_end), (a0, a1), (b0, b1) = at[wide["id"]], at[narrow[0]["id"]], at[narrow[1]["id"]]
        assert a0 >= wide_end and b0 >= wide_end, (at, log)     # claimed only once the GPUs were free
        assert a0 < b1 and b0 < a1, (at, log)                   # and then side by side
        host = _host_cpus()
        assert wide["progress"]["worker"]["cpu_threads"] == host
        assert wide["progress"]["worker"]["ray_resources"].get("GPU") == 2.0
        for j in narrow:
            assert j["progress"]["worker"]["ray_resources"].get("GPU") == 1.0
            assert j["progress"]["worker"]["cpu_threads"] == max(1, host // 2)
