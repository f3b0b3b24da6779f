"""LocalExecutor (calibrate/executors/local.py) without real workers: its monitor thread,
which restarts dead workers, must outlive a failed restart."""

from __future__ import annotations

import errno
import time

from oscar_zoo.calibrate.executors import local as L


class Exited:
    """A worker process that has exited (crashed, OOM-killed)."""

    pid, returncode = 4242, -9

    def poll(self):
        return self.returncode


class Running(Exited):
    returncode = None


def test_a_restart_that_fails_once_is_tried_again_not_given_up_for_good(monkeypatch, tmp_path):
    # A worker killed by the OOM killer, and fork failing under the same memory pressure: the
    # monitor thread must not die of it, or the slot never gets a worker again, silently.
    monkeypatch.setattr(L, "visible_gpus", lambda: [])
    monkeypatch.setattr(L, "RESTART_BACKOFF_S", 0.0)
    calls = []

    def popen(cmd, **kw):
        calls.append(cmd)
        if len(calls) == 1:
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        return Running()

    monkeypatch.setattr(L.subprocess, "Popen", popen)
    executor = L.LocalExecutor("http://127.0.0.1:1", "token", workers=1, lock_dir=tmp_path)
    executor.slots[0].proc = Exited()
    executor.monitor = L.threading.Thread(target=executor._watch, daemon=True)
    executor.monitor.start()
    try:
        deadline = time.monotonic() + 8
        while len(calls) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert len(calls) >= 2, "the monitor gave up on the slot after one failed restart"
        assert executor.monitor.is_alive()
    finally:
        executor.stopping.set()
        executor.monitor.join(5)
