"""The embedded default executor: worker processes beside `oscar-zoo serve`.

One worker per GPU (when OSCAR_ZOO_WORKERS asks for fewer workers, every GPU is still given out,
as evenly as they divide: 8 GPUs and 1 worker = one worker that runs 8-GPU jobs; 8 GPUs and 3
workers = 3, 3 and 2), or one on the CPU when there is none. Each is
`oscar-zoo worker` against the server's own URL, in its own session (so Ctrl-C on the server
does not reach it directly), and restarted when it dies. If the server itself is killed, a
worker finishes its current job against the restarted server, then exits (--exit-with-parent).

Each worker holds an flock per GPU (DATA_DIR/gpu-locks/gpu-ID.lock, through a file descriptor it
inherits) for as long as it lives, so a restarted server starts the worker for a GPU only once
the killed server's worker on that GPU has finished its job and exited: never two runners on
one GPU.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from oscar_zoo.zoo import settings

from .worker import visible_gpus

log = logging.getLogger("oscar_zoo.executor")
RESTART_BACKOFF_S = 5.0
STOP_TIMEOUT_S = 60.0


def local_worker_prefix(serve_pid: int) -> str:
    """How the lease holder names of serve `serve_pid`'s workers on this host begin: a restarted
    server tells the jobs its killed predecessor's workers still run by it."""
    return f"local:{socket.gethostname()}:serve{serve_pid}:"


@dataclass
class Slot:
    gpus: list[str]            # ids for CUDA_VISIBLE_DEVICES; [] = CPU
    proc: subprocess.Popen | None = None
    worker_id: str = ""
    started: float = 0.0
    waiting: bool = False      # for a GPU an earlier server's worker still holds


def plan(gpus: list[str], workers: int | None) -> list[list[str]]:
    """GPU ids per worker, consecutive; every id is used, the first workers taking one more
    when the GPUs do not divide evenly (a GPU left out would sit idle while jobs wait)."""
    if not gpus:
        return [[] for _ in range(workers or 1)]
    n = max(1, min(workers or len(gpus), len(gpus)))
    per, extra = divmod(len(gpus), n)
    bounds = [i * per + min(i, extra) for i in range(n + 1)]
    return [gpus[bounds[i]:bounds[i + 1]] for i in range(n)]


def lock_gpus(lock_dir: Path, gpus: list[str]) -> list[int] | None:
    """An flock on each GPU's file, taken without waiting: their descriptors, or None when
    another process (a worker of a killed server, finishing its job) holds one."""
    lock_dir.mkdir(parents=True, exist_ok=True)
    fds: list[int] = []
    for gpu in sorted(gpus):    # one order for everyone: workers of different plans never deadlock
        fd = os.open(lock_dir / f"gpu-{re.sub(r'[^A-Za-z0-9._-]', '_', gpu)}.lock",
                     os.O_RDWR | os.O_CREAT, 0o644)
        fds.append(fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            for f in fds:
                os.close(f)
            return None
    return fds


class LocalExecutor:
    def __init__(self, url: str, token: str, workers: int | None = None,
                 lock_dir: str | Path | None = None):
        self.url, self.token = url, token
        self.lock_dir = Path(lock_dir) if lock_dir else settings.get("data_dir") / "gpu-locks"
        self.slots = [Slot(g) for g in plan(visible_gpus(), workers or settings.get("workers"))]
        self.stopping = threading.Event()
        self.monitor: threading.Thread | None = None

    def start(self) -> None:
        for i, slot in enumerate(self.slots):
            self._spawn(i, slot)
        self.monitor = threading.Thread(target=self._watch, daemon=True, name="local-executor")
        self.monitor.start()
        log.info("local executor: %d worker(s) on %s", len(self.slots),
                 ", ".join(",".join(s.gpus) or "cpu" for s in self.slots))

    def _spawn(self, i: int, slot: Slot) -> None:
        """Start the slot's worker once its GPUs are free; until then _watch asks again."""
        fds = lock_gpus(self.lock_dir, slot.gpus)
        if fds is None:
            slot.proc = None
            if not slot.waiting:
                log.warning("local executor: GPU %s is held by another worker (an earlier "
                            "server's, finishing its job); this slot's worker starts when it "
                            "exits", ",".join(slot.gpus))
            slot.waiting = True
            return
        slot.waiting = False
        slot.worker_id = (f"{local_worker_prefix(os.getpid())}w{i}:"
                          f"{secrets.token_hex(3)}")
        env = {**os.environ, "OSCAR_ZOO_TOKEN": self.token,
               "CUDA_VISIBLE_DEVICES": ",".join(slot.gpus)}
        cmd = [sys.executable, "-P", "-m", "oscar_zoo.zoo.cli.main", "worker", "--registry",
               self.url, "--gpus", str(len(slot.gpus)), "--worker-id", slot.worker_id,
               "--exit-with-parent"]
        try:
            # The worker inherits the locks and holds them until it exits, outliving us if we
            # are killed; our copies must go, or its successor here could never take them.
            slot.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL,
                                         start_new_session=True, pass_fds=fds)
        finally:
            for fd in fds:
                os.close(fd)
        slot.started = time.monotonic()

    def _watch(self) -> None:
        while not self.stopping.wait(1.0):
            for i, slot in enumerate(self.slots):
                try:
                    self._check(i, slot)
                except Exception:  # noqa: BLE001 - this thread is every slot's only restarter
                    # fork refused (ENOMEM, EAGAIN: often the memory pressure that killed the
                    # worker), the lock file unopenable: try again after the back-off
                    slot.started = time.monotonic()
                    log.exception("local executor: cannot start a worker on %s; retrying",
                                  ",".join(slot.gpus) or "cpu")

    def _check(self, i: int, slot: Slot) -> None:
        if slot.proc is None:
            if slot.waiting and not self.stopping.is_set():
                self._spawn(i, slot)
            return
        if slot.proc.poll() is None:
            return
        if time.monotonic() - slot.started < RESTART_BACKOFF_S:
            return   # dying at once, again and again: do not spin
        log.warning("local executor: worker %s exited (%s); starting another",
                    slot.worker_id, slot.proc.returncode)
        if not self.stopping.is_set():
            self._spawn(i, slot)

    @property
    def pids(self) -> list[int]:
        return [s.proc.pid for s in self.slots if s.proc is not None]

    def stop(self) -> list[str]:
        """Stop every worker (each gives its job back after its GPU work is gone); returns the
        worker ids, whose remaining jobs the server requeues."""
        self.stopping.set()
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                slot.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for slot in self.slots:
            if slot.proc is None:
                continue
            try:
                slot.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.error("local executor: worker %s did not stop; killing it", slot.worker_id)
                os.killpg(slot.proc.pid, signal.SIGKILL)
                slot.proc.wait()
        if self.monitor is not None:
            self.monitor.join(5)
        return [s.worker_id for s in self.slots if s.worker_id]
