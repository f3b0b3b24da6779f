"""Attempt (calibrate/executors/worker.py) and its lease, against a fake registry client: the
worker's own view of the lease must never outlast the registry's, the runner must stop as soon
as that view runs out, and a registry in trouble must not be flooded with progress reports.
No model, no registry server: fast, and no timing that depends on one."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

from oscar_zoo.calibrate.executors import worker as W
from oscar_zoo.zoo.errors import LeaseLost, RemoteError

FAKE_RUNNER = str(Path(__file__).with_name("fake_runner.py"))


class FakeClient:
    """Answers heartbeats after `delay` seconds (the registry extended the lease when the
    request arrived, the reply came late), refuses progress with 503s, counting the calls."""

    def __init__(self, delay: float = 0.0, lease_s: float = 3.0):
        self.delay, self.lease_s = delay, lease_s
        self.beats, self.reports = [], []

    def heartbeat(self, job_id, lease, worker=None):
        self.beats.append(time.monotonic())
        time.sleep(self.delay)
        return {"status": "running", "cancel_requested": False, "lease_seconds": self.lease_s}

    def progress(self, job_id, lease, phase, progress, timings=None):
        self.reports.append(time.monotonic())
        raise RemoteError("registry answered 503: overloaded")


def _attempt(client, lease_s: float = 3.0) -> W.Attempt:
    job = {"id": "job-0123456789", "spec": {}, "model": "smollm2-135m"}
    return W.Attempt(client, job, {"token": "t", "seconds": lease_s}, "w1", threading.Event())


def test_the_lease_is_counted_from_when_the_beat_was_sent_not_when_its_reply_came():
    # The registry extends the lease to (arrival + lease); a reply that took 1.5 s must not
    # leave the worker believing it has 1.5 s more than the registry gives it.
    client = FakeClient(delay=1.5, lease_s=3.0)
    attempt = _attempt(client, lease_s=3.0)
    beat = threading.Thread(target=attempt._heartbeats, daemon=True)
    beat.start()
    try:
        deadline = time.monotonic() + 5
        while len(client.beats) < 1 or attempt.expires < client.beats[0]:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        while time.monotonic() < client.beats[0] + client.delay + 0.2:
            time.sleep(0.05)       # the reply is in
        assert attempt.expires <= client.beats[0] + client.lease_s + 0.05
    finally:
        attempt.ended.set()
        beat.join(5)


def test_progress_refused_by_an_overloaded_registry_is_sent_again_only_at_the_usual_pace():
    client = FakeClient()
    attempt = _attempt(client)
    attempt.latest = {"event": "progress", "phase": "pass1", "done": 1, "total": 10}
    end = time.monotonic() + 1.0
    while time.monotonic() < end:          # what _supervise does, every 0.1 s
        attempt._forward_progress()
        time.sleep(0.1)
    assert 1 <= len(client.reports) <= 1 + 1.0 / W.PROGRESS_EVERY_S


def test_the_watchdog_stops_the_runner_itself_when_the_lease_runs_out():
    """The supervising loop may be stuck in a progress request to a registry that stopped
    answering (up to the HTTP timeout, 30 s): the runner must not keep the GPU that long
    after the registry handed the job to another worker."""
    attempt = _attempt(FakeClient(), lease_s=0.5)
    attempt.child = subprocess.Popen([sys.executable, FAKE_RUNNER], stdout=subprocess.DEVNULL,
                                     start_new_session=True)
    try:
        attempt.expires = time.monotonic() + 0.3
        threading.Thread(target=attempt._watchdog, daemon=True).start()
        assert attempt.lost.wait(3)
        attempt.child.wait(3)               # TimeoutExpired: still running after the lease
    finally:
        attempt.ended.set()
        if attempt.child.poll() is None:
            attempt.child.kill()
            attempt.child.wait()


def test_a_lease_lost_on_a_heartbeat_stops_the_runner_at_once():
    client = FakeClient()

    def lost(*a, **k):
        raise LeaseLost("job is no longer yours (queued)")

    client.heartbeat = lost
    attempt = _attempt(client, lease_s=0.6)
    attempt.child = subprocess.Popen([sys.executable, FAKE_RUNNER], stdout=subprocess.DEVNULL,
                                     start_new_session=True)
    try:
        threading.Thread(target=attempt._heartbeats, daemon=True).start()
        assert attempt.lost.wait(3)
        attempt.child.wait(3)
    finally:
        attempt.ended.set()
        if attempt.child.poll() is None:
            attempt.child.kill()
            attempt.child.wait()


def test_a_killed_workers_work_dir_is_removed_by_the_next_worker_and_a_live_one_is_kept(
        tmp_path, monkeypatch):
    """A worker SIGKILLed (or OOM-killed) mid attempt never runs its cleanup: its work dir
    (the bundle, the runner's log) would stay in the temp dir for good, one per crash."""
    import os
    import signal

    monkeypatch.setattr(W.tempfile, "tempdir", str(tmp_path))
    dying = subprocess.Popen([sys.executable, "-P", "-c", """
import os, sys, threading, time
sys.path[:0] = [os.getcwd()]
from oscar_zoo.calibrate.executors import worker as W
from tests.jobs.test_worker_lease import FakeClient, _attempt
W.Attempt._run_child = lambda self, work: (print(work, flush=True), time.sleep(60))
_attempt(FakeClient(), lease_s=60).run()
"""], stdout=subprocess.PIPE, text=True, env={**os.environ, "TMPDIR": str(tmp_path)})
    left = Path(dying.stdout.readline().strip())
    dying.send_signal(signal.SIGKILL)
    dying.wait()
    assert left.is_dir() and left.parent == tmp_path

    live = _attempt(FakeClient(), lease_s=60)
    seen = {}

    def runner_while_another_worker_starts(self, work):
        class Idle:                       # claims nothing, and stops the worker
            def claim(self, *a, **k):
                stop.set()

        stop = threading.Event()
        W.run_worker(Idle(), "w2", 0, stop)
        seen.update(killed=left.exists(), live=work.is_dir())
        return "succeeded"

    monkeypatch.setattr(W.Attempt, "_run_child", runner_while_another_worker_starts)
    live.run()
    assert seen == {"killed": False, "live": True}
    assert list(tmp_path.iterdir()) == []


def test_one_unreadable_heartbeat_reply_does_not_end_the_heartbeats():
    """A reply the client cannot read (a proxy's HTML page with 200, a truncated body) is a
    blip like a 503: the next beat may get through. Unhandled, it ended the heartbeat thread
    for good, and a calibration of hours was given up when the lease ran out."""
    _beats_go_on_after(ValueError("Expecting value: line 1 column 1 (char 0)"))


def test_a_registry_out_of_disk_space_does_not_end_the_heartbeats():
    """A registry whose database is full answers a heartbeat 507 (StorageFull): like a 503, the
    next beat may get through once its operator makes room, so the runner goes on until the
    lease runs out, not at the first such answer (RemoteStorageFull is a RemoteError for this)."""
    from oscar_zoo.zoo.errors import RemoteStorageFull

    _beats_go_on_after(RemoteStorageFull("registry http://r: out of disk space in the "
                                         "registry's database (database or disk is full)"))


def _beats_go_on_after(error: Exception) -> None:
    """The first heartbeat raises `error`; the lease must still be held 4 s later (2 s leases)."""
    client = FakeClient(lease_s=2.0)
    real = client.heartbeat

    def failing_once(*a, **k):
        if len(client.beats) == 0:
            client.beats.append(time.monotonic())
            raise error
        return real(*a, **k)

    client.heartbeat = failing_once
    attempt = _attempt(client, lease_s=2.0)
    threads = [threading.Thread(target=attempt._heartbeats, daemon=True),
               threading.Thread(target=attempt._watchdog, daemon=True)]
    for t in threads:
        t.start()
    try:
        assert not attempt.lost.wait(4), f"the lease was given up after one {error!r}"
        assert len(client.beats) >= 3
    finally:
        attempt.ended.set()
        for t in threads:
            t.join(5)


def test_an_upload_the_registry_keeps_refusing_with_429_is_given_up_waiting_as_asked(monkeypatch):
    """A 429 (or 408) answers the upload, not the registry's health: the heartbeats kept the
    lease alive, and the whole bundle was sent again every second for as long as they did."""
    from oscar_zoo.zoo.errors import RemoteError

    attempt = _attempt(FakeClient(lease_s=600.0), lease_s=600.0)
    slept, tries = [], []
    monkeypatch.setattr(W.time, "sleep", slept.append)

    def refused():
        tries.append(1)
        err = RemoteError("registry http://r: 429 Too Many Requests")
        err.status, err.retry_after = 429, 7.0
        raise err

    assert attempt._call(refused, full_retried=False) is None
    assert attempt.lost.is_set()
    assert len(tries) == W.UPLOAD_REFUSALS + 1 and slept == [7.0] * W.UPLOAD_REFUSALS
    # a small report keeps trying through them while the lease lasts (it costs nothing to send)
    calls = iter([RemoteError("429"), None])

    def report():
        e = next(calls)
        if e is not None:
            e.status = 429
            raise e
        return "sent"

    assert _attempt(FakeClient(lease_s=600.0), lease_s=600.0)._call(report) == "sent"
