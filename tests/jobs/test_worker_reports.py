"""What a worker (calibrate/executors/worker.py) tells the registry and its own log, against the
real registry over HTTP, on SQLite and PostgreSQL: a failed job's error is public (GET
/v1/jobs/{id}, the UI), so it holds the runner's one line and the traceback goes to the
worker's log; a stopped worker says what becomes of its job. The runner is a stand-in script
with the runner's event protocol; no model is loaded."""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import sys
import threading
import time

import httpx

from oscar_zoo.calibrate.executors import worker as W

SECRET = "/srv/oscar-internal/calibrate/pipeline.py"
TRACEBACK = (f'Traceback (most recent call last):\n  File "{SECRET}", line 12, in calibrate\n'
             "    raise ValueError(\"bad\")\nValueError: bad")


def _runner_script(tmp_path, body: str) -> str:
    script = tmp_path / "runner_stand_in.py"
    script.write_text("import json, os, sys\n"
                      "events = os.fdopen(os.dup(1), 'w', buffering=1)\n" + body)
    return str(script)


def _with_runner(monkeypatch, script: str) -> None:
    real = subprocess.Popen
    monkeypatch.setattr(W.subprocess, "Popen",
                        lambda argv, **kw: real([sys.executable, script, *argv[-2:]], **kw))


def _attempt(api, stop=None) -> W.Attempt:
    claimed = api.worker.claim("w1", 0)
    return W.Attempt(api.worker, claimed["job"], claimed["lease"], "w1", stop or threading.Event())


def test_a_runner_error_is_public_as_one_line_and_its_traceback_is_logged(jobs_api, monkeypatch,
                                                                         tmp_path, caplog):
    event = {"event": "error", "error": "ValueError: bad", "traceback": TRACEBACK,
             "retryable": False}
    line = json.dumps(event) + "\n"
    _with_runner(monkeypatch, _runner_script(tmp_path, f"events.write({line!r})\nsys.exit(2)\n"))
    job = jobs_api.submit(max_attempts=1)
    with caplog.at_level(logging.WARNING, logger="oscar_zoo.worker"):
        assert _attempt(jobs_api).run() == "failed"
    public = httpx.get(f"{jobs_api.server.url}/v1/jobs/{job['id']}").json()   # no token
    assert public["error"] == "ValueError: bad"
    logged = [r for r in caplog.records if SECRET in r.getMessage()]
    assert logged and logged[0].levelno >= logging.WARNING
    assert job["id"] in logged[0].getMessage() and "ValueError: bad" in logged[0].getMessage()


def test_a_runner_that_dies_without_a_result_leaves_its_output_to_the_log(jobs_api, monkeypatch,
                                                                         tmp_path, caplog):
    _with_runner(monkeypatch, _runner_script(
        tmp_path, f"print('Fatal Python error at {SECRET}', file=sys.stderr)\nsys.exit(1)\n"))
    job = jobs_api.submit(max_attempts=2)
    with caplog.at_level(logging.WARNING, logger="oscar_zoo.worker"):
        assert _attempt(jobs_api).run() == "requeued"       # retried: it may be the host's
    error = jobs_api.submitter.get(job["id"])["error"]
    assert error == ("attempt 1 failed and will be retried: the calibration process ended "
                     "without a result (exit code 1); its output is in the worker's log"), error
    assert any(SECRET in r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)


def test_a_traceback_stored_by_an_earlier_worker_is_not_shown(jobs_api):
    """Jobs that failed before: their stored error ends with the runner's traceback, or with the
    end of its output, or goes on over lines (CUDA's): shown by the rule workers store by, its
    first line."""
    old = jobs_api.submit(max_attempts=1)
    lease = jobs_api.worker.claim("old-worker", 0)["lease"]["token"]
    jobs_api.worker.fail(old["id"], lease, f"ValueError: bad\n\n{TRACEBACK}", retryable=False)
    cuda = jobs_api.submit(max_attempts=1, seed=2)
    lease = jobs_api.worker.claim("old-worker", 0)["lease"]["token"]
    jobs_api.worker.fail(cuda["id"], lease, "RuntimeError: CUDA error: an illegal memory access "
                         f"was encountered\nCompile with TORCH_USE_CUDA_DSA ({SECRET})",
                         retryable=False)
    died = jobs_api.submit(max_attempts=2, seed=1)
    lease = jobs_api.worker.claim("old-worker", 0)["lease"]["token"]
    jobs_api.worker.fail(died["id"], lease, "the calibration process ended without a result "
                         f"(exit code 1)\n\nFatal Python error at {SECRET}")
    shown = {j: httpx.get(f"{jobs_api.server.url}/v1/jobs/{j}").json()["error"]
             for j in (old["id"], died["id"], cuda["id"])}
    assert shown == {old["id"]: "ValueError: bad",
                     died["id"]: "attempt 1 failed and will be retried: the calibration process "
                                 "ended without a result (exit code 1)",
                     cuda["id"]: "RuntimeError: CUDA error: an illegal memory access was "
                                 "encountered"}, shown
    page = httpx.get(f"{jobs_api.server.url}/jobs/{old['id']}")
    assert page.status_code == 200 and SECRET not in page.text
    # nor anywhere else a job is shown: the requeued job's progress carries its reason too
    for url in ("/v1/jobs", f"/v1/jobs/{died['id']}", f"/jobs/{died['id']}", "/jobs"):
        text = httpx.get(f"{jobs_api.server.url}{url}").text
        assert SECRET not in text and "Traceback" not in text, (url, text[:2000])


def test_a_stopped_worker_says_its_job_is_given_back_and_it_is(jobs_api, monkeypatch, tmp_path,
                                                               caplog):
    """SIGTERM to a worker mid-job: its log said 'stopping after giving back the current job',
    which read as if it finished the job first. It stops the runner now and releases the lease:
    the job is queued again, with no attempt spent, to start over on another worker."""
    _with_runner(monkeypatch, _runner_script(tmp_path, (
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (events.write('{\"event\": \"cancelled\"}\\n'),"
        " sys.exit(3)))\n"
        "events.write('{\"event\": \"progress\", \"phase\": \"pass1\", \"done\": 1, "
        "\"total\": 9}\\n')\n"
        "time.sleep(120)\n")))
    job = jobs_api.submit(lease_seconds=30, max_attempts=3)
    stop = threading.Event()
    attempt = _attempt(jobs_api, stop)
    outcome: dict = {}
    thread = threading.Thread(target=lambda: outcome.update(result=attempt.run()))
    thread.start()
    end = time.monotonic() + 20
    while (attempt.latest or {}).get("phase") != "pass1" and time.monotonic() < end:
        time.sleep(0.1)
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        W.install_stop_signals(stop)
        with caplog.at_level(logging.WARNING, logger="oscar_zoo.worker"):
            signal.getsignal(signal.SIGTERM)(signal.SIGTERM, None)   # as the kernel would call it
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    thread.join(60)
    said = " ".join(r.getMessage() for r in caplog.records if "SIGTERM received" in r.getMessage())
    for part in ("lease released", "back to the queue", "no attempt spent", "starts over"):
        assert part in said, said
    after = jobs_api.submitter.get(job["id"])
    assert outcome["result"] == "released"
    assert after["status"] == "queued" and after["attempts"] == 0, after


def test_a_multi_line_error_is_published_as_its_first_line_capped():
    """A runner's error text may go on over lines (CUDA's, a remote traceback with the worker's
    paths): only its first line, capped, becomes the public job error."""
    from oscar_zoo.calibrate.executors.worker import public_line

    assert public_line(f"RuntimeError: CUDA error\n  File \"{SECRET}\"\n") == "RuntimeError: CUDA error"
    long = public_line("x" * 2000)
    assert len(long) == 500 and long.endswith("...")
    assert public_line("") == ""


def test_a_capped_line_is_shown_whole_with_the_registrys_words_around_it():
    """The registry frames a worker's capped line ("attempt 1 failed and will be retried: ...",
    "... (after 3 attempts)"): reading it back cuts nothing of either."""
    from oscar_zoo.api.serialize import public_error

    line = W.public_line("x" * 2000)
    for stored in (f"attempt 1 failed and will be retried: {line}", f"{line} (after 3 attempts)"):
        assert len(stored) > len(line) and public_error(stored) == stored
    assert public_error(None) is None
