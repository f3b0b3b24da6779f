"""`oscar-zoo serve` as a real process (SQLite in a temp data dir, local executor), for the
tests that run jobs on the real test model, and the same process tree's cleanup.

    with Serve(tmp_path) as srv:          # waits for /v1/health
        srv.cli("jobs", "watch", job_id)  # the CLI against this registry
        srv.kill(); srv.start()           # a crash and a restart on the same port

Every process the tests start (server, its workers, their runners) is tracked by pid and
ended by pid on exit, never by name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from oscar_zoo.zoo.jobs_client import JobsClient
from tests.utils.registry_server import free_socket

REPO = Path(__file__).resolve().parents[2]
EXE = Path(sys.executable).with_name("oscar-zoo")
# Tokenizers rebuilt from the GGUF are cached here across tests and runs (see tests/conftest.py).
MODEL_CACHE = REPO / ".cache" / "test-model"


class Serve:
    def __init__(self, root: Path, **env: str):
        self.root = Path(root)
        sock = free_socket()
        self.port = sock.getsockname()[1]
        sock.close()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {**os.environ, "OSCAR_ZOO_DATA_DIR": str(self.root / "data"),
                    "OSCAR_ZOO_CACHE": str(MODEL_CACHE), "OSCAR_ZOO_WORKERS": "1",
                    "OSCAR_ZOO_ENDPOINT": self.url, "OSCAR_ZOO_SOURCES": "registry",
                    "OSCAR_ZOO_JOB_LEASE_SECONDS": "6", "OSCAR_ZOO_JOB_CANCEL_GRACE_SECONDS": "10",
                    "TOKENIZERS_PARALLELISM": "false",
                    # jobs name the trimmed test models kept there (a module-scoped server
                    # starts before the per-test sandbox sets this)
                    "OSCAR_ZOO_JOB_PATHS": str(MODEL_CACHE.parent),
                    # the workers' scratch dirs (left behind by the ones a test kills) stay here
                    "TMPDIR": str(self.root / "tmp"), **env}
        self.env.pop("OSCAR_ZOO_TOKEN", None)
        self.proc: subprocess.Popen | None = None
        self.seen_pids: set[int] = set()
        self.token: str | None = None

    # --- the server --------------------------------------------------------------------------

    def start(self, timeout: float = 60.0) -> "Serve":
        log = open(self.root / "serve.log", "ab")
        self.proc = subprocess.Popen([str(EXE), "serve", "--port", str(self.port),
                                      "--log-level", "warning"],
                                     env=self.env, stdout=log, stderr=log, start_new_session=True)
        self.seen_pids.add(self.proc.pid)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log_tail()
            try:
                if httpx.get(f"{self.url}/v1/health", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"the server did not start\n{self.log_tail()}")

    def kill(self) -> None:
        """SIGKILL the server process alone (its workers live on, as after a crash)."""
        self.track()
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.track()
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait()

    def __enter__(self) -> "Serve":
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)
        self.start()
        self.token = self.cli("tokens", "create", "--scope", "jobs:submit",
                              "--scope", "bundles:publish").stdout.strip()
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.stop()
        finally:
            self.reap()

    # --- processes ---------------------------------------------------------------------------

    def track(self) -> set[int]:
        """Remember the server's descendants (workers and runners) while they are reachable."""
        pending = [p for p in list(self.seen_pids) if alive(p)]
        while pending:
            pid = pending.pop()
            for child in children(pid):
                if child not in self.seen_pids:
                    self.seen_pids.add(child)
                    pending.append(child)
        return self.seen_pids

    def reap(self, timeout: float = 30.0) -> None:
        """End every process this server started that is still running, by pid."""
        self.track()
        deadline = time.monotonic() + timeout
        while any(alive(p) for p in self.seen_pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        for pid in self.seen_pids:
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def worker_pids(self) -> list[int]:
        return [p for p in children(self.proc.pid) if alive(p)]

    # --- clients -----------------------------------------------------------------------------

    def client(self) -> JobsClient:
        return JobsClient(self.url, self.token)

    def cli(self, *args: str, check: bool = True, timeout: float = 600,
            env: dict | None = None) -> subprocess.CompletedProcess:
        env = {**self.env, **({"OSCAR_ZOO_TOKEN": self.token} if self.token else {}), **(env or {})}
        out = subprocess.run([str(EXE), *args], env=env, capture_output=True, text=True,
                             timeout=timeout)
        if check and out.returncode != 0:
            raise AssertionError(f"oscar-zoo {' '.join(args)} -> {out.returncode}\n{out.stdout}\n"
                                 f"{out.stderr[-4000:]}")
        return out

    def log_tail(self, n: int = 4000) -> str:
        try:
            return (self.root / "serve.log").read_text(errors="replace")[-n:]
        except OSError:
            return ""


def fault_spec(model: str, **extra) -> dict:
    """A job spec for the fault tests: a pass 1 long enough to act in (24 windows x 4 layers of
    the trimmed model: ~1.3 s on a fast core, several of wait_for's 0.2 s polls and of the
    worker's 0.5 s progress reports; 8 windows took 0.4 s, which a poll could miss), validation
    off (these tests are about the machinery). The model is a path, so it is published under
    a name of its own."""
    return {"model": model, "publish_as": "oscar-zoo-tests/smollm2-135m-4l", "tokens": 12288,
            "seq_len": 512, "clip_search": False, "validation": {"enabled": False}, **extra}


def versions_of(srv: Serve, model: str) -> list[dict]:
    with srv.client() as c:
        try:
            return list(c.registry.versions(model))
        except LookupError:
            return []


def in_phase(srv: Serve, job_id: str, phases: tuple[str, ...], timeout: float = 180) -> dict:
    with srv.client() as c:
        return wait_for(lambda: (j := c.get(job_id))["phase"] in phases and j, timeout,
                        what=f"job {job_id} in {phases}")


def trimmed_gguf(layers: int) -> Path:
    """The test model's first `layers` blocks as a GGUF (bench/trim_gguf.py), made once and
    kept in the repo's .cache: the same weights, so the same Q/K/V in those layers."""
    import importlib.util

    from oscar_zoo.calibrate.loading import builtin_gguf

    out = MODEL_CACHE / f"SmolLM2-135M-Instruct-{layers}L.Q4_1.gguf"
    if not out.is_file():
        spec = importlib.util.spec_from_file_location("trim_gguf", REPO / "bench" / "trim_gguf.py")
        trim = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(trim)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_suffix(f".tmp{os.getpid()}")
        trim.trim(str(builtin_gguf("smollm2-135m")), str(tmp), layers)
        os.replace(tmp, out)
    return out


def alive(pid: int) -> bool:
    """Running (a zombie does not count)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def wait_for(fn, timeout: float, every: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"{what} not met within {timeout:.0f} s")
