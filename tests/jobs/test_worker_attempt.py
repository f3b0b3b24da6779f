"""Attempt (calibrate/executors/worker.py) against the real registry over HTTP, on SQLite and
PostgreSQL: how an attempt ends when something other than the runner goes wrong. No model is
loaded: the runner is either skipped (`_run_child` replaced) or tests/jobs/fake_runner.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from oscar_zoo.calibrate.executors import worker as W
from oscar_zoo.zoo.errors import InvalidInput, Unauthorized
from oscar_zoo.zoo.jobs_client import JobsClient
from tests.utils.bundles import make_bundle

FAKE_RUNNER = str(Path(__file__).with_name("fake_runner.py"))


def _wait(fn, timeout: float = 20.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if (value := fn()):
            return value
        time.sleep(0.1)
    raise AssertionError("timed out")


def _attempt(api, worker="w1", stop=None) -> W.Attempt:
    claimed = api.worker.claim(worker, 0)
    return W.Attempt(api.worker, claimed["job"], claimed["lease"], worker, stop or threading.Event())


def test_a_result_the_registry_refuses_fails_the_job_with_the_cause_at_once(jobs_api, monkeypatch):
    def runner_made_another_models_bundle(self, work):
        make_bundle(work / "bundle", model="qwen3-8b")
        return self._finish(work, {"bundle_dir": str(work / "bundle"), "timings": {}})

    monkeypatch.setattr(W.Attempt, "_run_child", runner_made_another_models_bundle)
    job = jobs_api.submit(max_attempts=3)
    outcome = _attempt(jobs_api).run()
    after = jobs_api.submitter.get(job["id"])
    assert outcome == "failed" and after["status"] == "failed" and after["attempts"] == 1
    assert "InvalidInput" in after["error"] and "qwen3-8b" in after["error"]


def test_a_version_number_race_on_the_result_is_retried_not_fatal(jobs_api, monkeypatch):
    # The race itself (every number taken by concurrent uploads through all of the registry's
    # own retries) cannot be produced on demand: the registry (in this process) raises its
    # Conflict once, with the message it gives then.
    from oscar_zoo.registry_db import jobs as jobs_db
    from oscar_zoo.zoo.errors import Conflict

    real, calls = jobs_db.record_version, []

    def busy_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise Conflict("could not allocate a version number for smollm2-135m after 8 tries")
        return real(*args, **kwargs)

    def runner_made_a_bundle(self, work):
        make_bundle(work / "bundle")
        return self._finish(work, {"bundle_dir": str(work / "bundle"), "timings": {}})

    monkeypatch.setattr(jobs_db, "record_version", busy_once)
    monkeypatch.setattr(W.Attempt, "_run_child", runner_made_a_bundle)
    job = jobs_api.submit(max_attempts=1)
    outcome = _attempt(jobs_api).run()
    after = jobs_api.submitter.get(job["id"])
    assert outcome == "succeeded" and after["status"] == "succeeded", after.get("error")
    assert len(calls) == 2 and after["result_version"] is not None


def test_a_local_io_error_is_reported_as_a_retryable_failure(jobs_api, monkeypatch):
    def disk_full(self, work):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(W.Attempt, "_run_child", disk_full)
    job = jobs_api.submit(max_attempts=3)
    outcome = _attempt(jobs_api).run()
    after = jobs_api.submitter.get(job["id"])
    assert outcome == "requeued" and after["status"] == "queued"
    assert "No space left on device" in after["error"]


def test_a_registry_out_of_disk_space_requeues_the_job_with_its_message_after_one_upload(
        jobs_api, monkeypatch):
    """The registry's 507 on the result was a RemoteError of no status, retried as transient:
    the worker sent the whole bundle again every second for as long as its heartbeats kept the
    lease (here, for ever), then gave the job up as lost, the cause nowhere. Now the attempt
    fails, retryable, with the registry's message as the job's error. The registry's blob
    store is simulated full (a real full disk cannot be made in a test run in general:
    tests/utils/full_disk.py); the registry's own handling of it is tests/api/test_publish.py's."""
    from tests.utils.full_disk import full_disk

    uploads, real_upload = [], JobsClient.upload_result

    def counted(self, *args, **kwargs):
        uploads.append(1)
        return real_upload(self, *args, **kwargs)

    def runner_made_a_bundle(self, work):
        make_bundle(work / "bundle")
        return self._finish(work, {"bundle_dir": str(work / "bundle"), "timings": {}})

    monkeypatch.setattr(JobsClient, "upload_result", counted)
    monkeypatch.setattr(W.Attempt, "_run_child", runner_made_a_bundle)
    job = jobs_api.submit(max_attempts=3)
    attempt = _attempt(jobs_api)
    outcome: dict = {}
    with full_disk(monkeypatch, jobs_api.server.registry.blobs.root) as disk:
        thread = threading.Thread(target=lambda: outcome.update(result=attempt.run()), daemon=True)
        thread.start()
        thread.join(20)
        still_uploading = thread.is_alive()
    thread.join(30)         # without the fix: its next upload, the disk freed, goes through
    assert not still_uploading, f"still uploading the result after {len(uploads)} tries"
    assert disk.refused == 1 and len(uploads) == 1
    after = jobs_api.submitter.get(job["id"])
    assert outcome["result"] == "requeued" and after["status"] == "queued", after
    assert after["attempts"] == 1 and after["result"] is None
    assert after["error"].startswith("attempt 1 failed and will be retried: the result could not "
                                     "be stored: registry "), after["error"]
    assert ("out of disk space in the registry's blob store (No space left on device) while "
            "storing a bundle file") in after["error"]
    assert "the registry's operator frees space" in after["error"]


def test_a_refused_progress_report_is_skipped_not_raised(jobs_api, monkeypatch):
    jobs_api.submit()
    attempt = _attempt(jobs_api)

    def refused(*a, **k):
        raise InvalidInput("progress body too large")

    monkeypatch.setattr(attempt.client, "progress", refused)
    attempt._forward_progress(force=True)
    assert not attempt.lost.is_set() and not attempt.cancel.is_set()


def test_a_revoked_token_ends_the_attempt_instead_of_killing_the_heartbeat_silently(jobs_api,
                                                                                    monkeypatch):
    jobs_api.submit(lease_seconds=1)
    attempt = _attempt(jobs_api)

    def revoked(*a, **k):
        raise Unauthorized("the token was refused")

    monkeypatch.setattr(attempt.client, "heartbeat", revoked)
    beat = threading.Thread(target=attempt._heartbeats, daemon=True)
    beat.start()
    try:
        assert attempt.lost.wait(5)
    finally:
        attempt.ended.set()
        beat.join(5)


def _fake_runner(monkeypatch):
    real = subprocess.Popen
    monkeypatch.setattr(W.subprocess, "Popen",
                        lambda argv, **kw: real([sys.executable, FAKE_RUNNER, *argv[-2:]], **kw))


def _run_in_thread(attempt: W.Attempt) -> tuple[threading.Thread, dict]:
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.update(result=attempt.run()))
    thread.start()
    _wait(lambda: (attempt.latest or {}).get("phase") == "pass1")
    return thread, outcome


def test_a_sigterm_from_outside_the_worker_is_a_retryable_failure_not_a_cancel(jobs_api,
                                                                             monkeypatch):
    _fake_runner(monkeypatch)
    job = jobs_api.submit(lease_seconds=30, max_attempts=3)
    attempt = _attempt(jobs_api)
    thread, outcome = _run_in_thread(attempt)
    os.kill(attempt.child.pid, signal.SIGTERM)      # an operator's kill, earlyoom, ...
    thread.join(60)
    after = jobs_api.submitter.get(job["id"])
    assert outcome["result"] == "requeued" and after["status"] == "queued"
    assert "SIGTERM from outside the worker" in after["error"]


def test_a_cancel_asked_through_the_registry_still_ends_the_job_cancelled(jobs_api, monkeypatch):
    _fake_runner(monkeypatch)
    job = jobs_api.submit(max_attempts=3)
    attempt = _attempt(jobs_api)
    thread, outcome = _run_in_thread(attempt)
    jobs_api.submitter.cancel(job["id"])
    thread.join(60)
    after = jobs_api.submitter.get(job["id"])
    assert outcome["result"] == "cancelled" and after["status"] == "cancelled"


def test_a_cancel_asked_while_the_result_uploads_publishes_nothing(jobs_api, monkeypatch):
    def runner_done_then_cancel_arrives(self, work):
        make_bundle(work / "bundle")
        jobs_api.submitter.cancel(self.id)        # between the runner's end and the upload
        return self._finish(work, {"bundle_dir": str(work / "bundle"), "timings": {}})

    monkeypatch.setattr(W.Attempt, "_run_child", runner_done_then_cancel_arrives)
    job = jobs_api.submit(max_attempts=3)
    outcome = _attempt(jobs_api).run()
    after = jobs_api.submitter.get(job["id"])
    assert outcome == "cancelled" and after["status"] == "cancelled"
    assert after["result"] is None and after["attempts"] == 1


def test_a_registry_that_stops_answering_loses_the_lease_on_time(jobs_api):
    """The registry accepts the heartbeat's connection and never answers (hung, or packets
    dropped): the beat waits out the HTTP timeout (30 s) while the registry requeues the job
    after its 1 s lease. The attempt gives up when its lease runs out, not when a beat returns."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    held = []
    threading.Thread(target=lambda: [held.append(silent.accept()) for _ in iter(int, 1)],
                     daemon=True).start()
    jobs_api.submit(lease_seconds=1)
    attempt = _attempt(jobs_api)
    attempt.client = JobsClient(f"http://127.0.0.1:{silent.getsockname()[1]}", "any-token")
    started = time.monotonic()
    threading.Thread(target=attempt._heartbeats, daemon=True).start()
    threading.Thread(target=attempt._watchdog, daemon=True).start()
    assert attempt.lost.wait(15), "still working on a job whose lease ran out"
    assert time.monotonic() - started < 5
    attempt.ended.set()
    silent.close()
