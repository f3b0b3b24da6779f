"""Which GPUs a worker's jobs run on: `oscar-zoo worker --gpus N` gives its runner only the
first N visible GPUs, and the embedded executor hands out every GPU; and the path variables the
runner gets. No GPU is needed: the runner process is a stand-in that records the environment
it was started with."""

from __future__ import annotations

import os
import threading

import pytest

from oscar_zoo.calibrate.executors import local
from oscar_zoo.calibrate.executors import worker as wk
from oscar_zoo.zoo.errors import ConfigError


class FakeRunner:
    """A runner that ends at once with a non-retryable error."""

    pid = 2 ** 22 + 12345      # above any pid_max default: killpg finds no such group
    returncode = 2

    def __init__(self):
        self.stdout = iter([b'{"event": "error", "error": "stand-in", "retryable": false}\n'])

    def poll(self):
        return self.returncode

    def wait(self, *args):
        return self.returncode


class FakeClient:
    def __init__(self):
        self.claims = 0

    def claim(self, worker, gpus, wait=None):
        self.claims += 1
        return {"job": {"id": "job-0001", "spec": {"model": "smollm2-135m"}},
                "lease": {"token": "t", "seconds": 60}}

    def heartbeat(self, *args):
        return {}

    def progress(self, *args, **kwargs):
        return {}

    def fail(self, *args, **kwargs):
        return {"status": "failed"}


@pytest.fixture
def started(monkeypatch):
    """The env each runner was started with (None: inherited)."""
    envs: list[dict | None] = []

    def popen(cmd, **kwargs):
        envs.append(kwargs.get("env"))
        return FakeRunner()

    monkeypatch.setattr(wk.subprocess, "Popen", popen)
    monkeypatch.setattr(wk, "gpu_pids", lambda: set())
    return envs


def _runner_sees(env: dict | None) -> str | None:
    return (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")


@pytest.mark.parametrize("gpus, seen", [(2, "0,1"), (1, "0"), (0, ""), (8, "0,1,2,3,4,5,6,7")])
def test_worker_runner_sees_only_its_first_n_gpus(monkeypatch, started, gpus, seen):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
    client = FakeClient()
    run_worker_of(client, gpus)
    assert client.claims == 1 and len(started) == 1
    assert _runner_sees(started[0]) == seen
    assert started[0]["PATH"] == os.environ["PATH"]      # the rest of the environment is kept


def run_worker_of(client, gpus):
    """main_loop's path from --gpus to the runner, without its registry client."""
    wk.run_worker(client, "w", gpus, threading.Event(), once=True, devices=wk.runner_devices(gpus))


def test_main_loop_passes_gpus_to_the_runner(monkeypatch, started):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    client = FakeClient()

    class Jobs:
        def __init__(self, *args):
            pass

        def __enter__(self):
            return client

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(wk, "JobsClient", Jobs)
    monkeypatch.setattr(wk, "install_stop_signals", lambda stop: None)
    wk.main_loop("http://127.0.0.1:1", None, 2, "w", exit_with_parent=False, once=True)
    assert [_runner_sees(env) for env in started] == ["4,5"]


def test_without_gpus_the_runner_inherits(monkeypatch, started):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    wk.run_worker(FakeClient(), "w", 2, threading.Event(), once=True, devices=wk.runner_devices(None))
    assert started == [None]


@pytest.mark.parametrize("devices", [None, "0"])
def test_relative_path_variables_reach_the_runner_absolute(monkeypatch, started, tmp_path,
                                                           devices):
    """The runner works in the attempt's own directory (deleted after it): HF_HOME=hf-cache
    named a folder there, so each job downloaded its model again into it and the worker's cache
    went unused. They are resolved against the worker's directory, as the worker reads them."""
    monkeypatch.chdir(tmp_path)
    relative = {"HF_HOME": "hf-cache", "HF_DATASETS_CACHE": "./datasets",
                "TRANSFORMERS_CACHE": "caches/transformers", "OSCAR_ZOO_CACHE": "oscar",
                "OSCAR_ZOO_DATA_DIR": "../data"}
    as_given = {"HF_HUB_CACHE": str(tmp_path / "hub"), "TORCH_HOME": "~/torch",
                "OSCAR_ZOO_SOURCES": "registry,hf"}             # absolute, the home's, no path
    for name, value in {**relative, **as_given}.items():
        monkeypatch.setenv(name, value)
    wk.run_worker(FakeClient(), "w", 1, threading.Event(), once=True, devices=devices)
    env = started[0]
    assert env is not None
    for name, value in relative.items():
        assert env[name] == os.path.normpath(tmp_path / value), name
    assert {name: env[name] for name in as_given} == as_given
    assert _runner_sees(env) == (devices if devices is not None else
                                 os.environ.get("CUDA_VISIBLE_DEVICES"))


def test_more_gpus_than_visible_is_refused(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with pytest.raises(ConfigError, match="--gpus 3, but this worker sees 2 GPU"):
        wk.runner_devices(3)


def test_gpus_that_cannot_be_listed_are_counted_from_zero(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(wk.shutil, "which", lambda name: None)    # no nvidia-smi
    assert wk.runner_devices(2) == "0,1"


@pytest.mark.parametrize("n, workers, sizes", [
    (8, 3, [3, 3, 2]), (7, 2, [4, 3]), (8, 1, [8]), (8, None, [1] * 8), (5, 4, [2, 1, 1, 1]),
    (2, 5, [1, 1]), (6, 3, [2, 2, 2]),
])
def test_plan_gives_out_every_gpu(n, workers, sizes):
    gpus = [str(i) for i in range(n)]
    slots = local.plan(gpus, workers)
    assert [len(s) for s in slots] == sizes
    assert [g for s in slots for g in s] == gpus          # each once, in order


def test_plan_without_gpus_runs_on_the_cpu():
    assert local.plan([], 3) == [[], [], []]
    assert local.plan([], None) == [[]]


@pytest.fixture
def sleeping_workers(monkeypatch, tmp_path):
    """The executor's workers are processes that only sleep (holding what they inherit)."""
    import subprocess
    import sys

    real = subprocess.Popen
    started: list[dict] = []

    def popen(cmd, **kwargs):
        started.append(kwargs["env"])
        return real([sys.executable, "-c", "import time; time.sleep(60)"], **kwargs)

    monkeypatch.setattr(local.subprocess, "Popen", popen)
    monkeypatch.setattr(local, "visible_gpus", lambda: ["0", "1"])
    return started


def _wait_until(fn, timeout=10.0):
    import time

    end = time.monotonic() + timeout
    while not fn():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.1)


def test_a_restarted_server_starts_no_worker_on_a_gpu_its_killed_predecessors_worker_uses(
        sleeping_workers, tmp_path):
    import signal

    locks = tmp_path / "gpu-locks"
    killed = local.LocalExecutor("http://127.0.0.1:1", "t", workers=2, lock_dir=locks)
    killed.start()
    killed.stopping.set()           # the server is SIGKILLed: its workers live on
    orphan_gpu0 = killed.slots[0].proc
    orphan_gpu1 = killed.slots[1].proc
    os.kill(orphan_gpu1.pid, signal.SIGKILL)    # the one on GPU 1 had already finished
    orphan_gpu1.wait()
    restarted = local.LocalExecutor("http://127.0.0.1:1", "t", workers=2, lock_dir=locks)
    restarted.start()
    try:
        assert restarted.slots[0].proc is None and restarted.slots[0].waiting
        assert restarted.slots[1].proc is not None
        assert [e["CUDA_VISIBLE_DEVICES"] for e in sleeping_workers] == ["0", "1", "1"]
        os.kill(orphan_gpu0.pid, signal.SIGKILL)   # it finished its job and exited
        orphan_gpu0.wait()
        _wait_until(lambda: restarted.slots[0].proc is not None)
        assert sleeping_workers[-1]["CUDA_VISIBLE_DEVICES"] == "0"
    finally:
        restarted.stop()
        for proc in (orphan_gpu0, orphan_gpu1):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_worker_that_dies_is_restarted_on_its_gpu(sleeping_workers, tmp_path, monkeypatch):
    # the server's own copy of a lock must not outlive the worker's start
    import signal

    monkeypatch.setattr(local, "RESTART_BACKOFF_S", 0.0)
    ex = local.LocalExecutor("http://127.0.0.1:1", "t", workers=1, lock_dir=tmp_path / "locks")
    ex.start()
    try:
        first = ex.slots[0].proc
        os.kill(first.pid, signal.SIGKILL)
        first.wait()
        _wait_until(lambda: ex.slots[0].proc is not first and ex.slots[0].proc is not None)
    finally:
        ex.stop()
