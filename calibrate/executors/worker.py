"""A calibration worker: claims jobs from a registry over HTTP and runs each one.

One Attempt per claimed job:
- the runner (calibrate/runner.py) runs in a child process, in its own process group, that dies
  with this process (PR_SET_PDEATHSIG), so a kill of the worker never leaves GPU work behind;
  it writes JSON events on its stdout (progress, then done | error | cancelled);
- a heartbeat thread, independent of the GPU work, extends the lease every lease/3 seconds and
  learns about a cancel; progress is forwarded at most twice a second (its answer carries the
  cancel flag too);
- cancel: SIGTERM to the child's group (the runner stops at its next layer), SIGKILL after the
  grace period, wait until the group is gone and its GPU memory is released, then report;
- a lost lease (409, or no heartbeat got through before it ran out): kill the child, report
  nothing (another attempt owns the job now);
- done: upload the bundle (published, or draft when it failed validation), complete; the
  registry moves the spec's aliases and starts mirroring when it records the version.
- anything else that breaks the attempt (the registry refuses the result, a local I/O error, a
  bug) stops the runner and fails the job with the cause (retried only for local I/O and a full
  disk, the registry's included), so the job neither waits out its lease nor reruns the whole
  calibration with the cause lost;
- a SIGTERM to the runner that the worker did not send is a retryable failure, not a cancel;
- a runner's error: its one line becomes the job's error, which anyone may read; its traceback
  (or the end of its output), naming this host's paths, goes to this worker's log only;
- a SIGTERM or SIGINT to the worker: the runner is stopped at once and the lease released, so
  the job goes back to the queue without spending an attempt and starts over elsewhere.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable

from oscar_zoo.zoo import settings
from oscar_zoo.zoo.errors import (ConfigError, Conflict, JobCancelled, LeaseLost, OfflineError,
                                  OscarZooError, RemoteError, RemoteStorageFull, StorageFull,
                                  TRY_LATER, public_line)
from oscar_zoo.zoo.jobs_client import JobsClient
from oscar_zoo.zoo.sources.download import backoff

log = logging.getLogger("oscar_zoo.worker")
POLL_S = 1.0
CLAIM_WAIT_S = 5.0       # long poll: a job starts within ~0.5 s, and an idle worker asks rarely
PROGRESS_EVERY_S = 0.5
SHUTDOWN_GRACE_S = 5.0
UPLOAD_TRIES = 3         # a result refused by a version-number race: tried this often in all
UPLOAD_REFUSALS = 3      # a result upload answered TRY_LATER: retried this often, then given up
EXIT_CANCELLED = 3
WORKDIR_PREFIX = "oscar-zoo-job-"
WORKDIR_LOCK = ".held"   # flocked by the attempt's process while it lives (see sweep_workdirs)


class _UnreadableBeat(Exception):
    """A heartbeat reply that could not be read: retried like an unreachable registry."""


def new_worker_id(kind: str = "worker") -> str:
    return f"{kind}:{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def run_worker(client: JobsClient, worker: str, gpus: int, stop: threading.Event,
               exit_with_parent: bool = False, once: bool = False,
               devices: str | None = None) -> None:
    """Claim and run jobs until `stop` is set (or, with exit_with_parent, the parent is gone).
    devices: CUDA_VISIBLE_DEVICES for each job's runner (None: inherit this process's)."""
    parent = os.getppid()
    failures = 0
    sweep_workdirs()
    while not stop.is_set():
        if exit_with_parent and os.getppid() != parent:
            log.warning("worker %s: parent process exited; stopping", worker)
            return
        try:
            claimed = client.claim(worker, gpus, wait=CLAIM_WAIT_S)
            failures = 0
        except (OfflineError, RemoteError) as e:
            failures += 1
            if failures == 3:       # not the blip of a registry restarting
                log.warning("worker %s: cannot claim (%s); retrying", worker, e)
            stop.wait(max(POLL_S * 3, asked_wait(e)))   # as a 429 asks
            continue
        if claimed is None:
            continue
        log.info("worker %s: running job %s", worker, claimed["job"]["id"])
        try:
            outcome = Attempt(client, claimed["job"], claimed["lease"], worker, stop,
                              devices=devices).run()
            log.info("worker %s: job %s %s", worker, claimed["job"]["id"], outcome)
        except Exception:  # noqa: BLE001 - the lease runs out and the job is retried elsewhere
            log.exception("worker %s: job %s broke the worker's own code", worker, claimed["job"]["id"])
        if once:
            return


def _libc_prctl():
    try:
        import ctypes

        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None   # not Linux: the runner also watches its parent pid


_PRCTL = _libc_prctl()   # resolved before any fork: the child only makes the call


def _die_with_parent() -> None:  # preexec_fn: runs in the child between fork and exec
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)   # PR_SET_PDEATHSIG


class Attempt:
    """One attempt at one job; `run()` returns its outcome (succeeded, failed, requeued,
    cancelled, released, lost)."""

    def __init__(self, client: JobsClient, job: dict, lease: dict, worker: str,
                 stop: threading.Event, info: dict | None = None, devices: str | None = None):
        self.client, self.job, self.worker, self.stop = client, job, worker, stop
        self.devices = devices   # CUDA_VISIBLE_DEVICES for the runner; None: inherit ours
        self.id, self.spec = job["id"], job["spec"]
        self.token, self.lease_s = lease["token"], float(lease["seconds"])
        self.expires = time.monotonic() + self.lease_s      # our own view of the lease
        self.cancel, self.lost, self.ended = threading.Event(), threading.Event(), threading.Event()
        self.info = {"id": worker, "host": socket.gethostname(), "pid": os.getpid(), **(info or {})}
        self.child: subprocess.Popen | None = None
        self.phase, self.phase_t0, self.timings = "loading", time.monotonic(), {}
        self.latest: dict | None = None
        self.final: dict | None = None
        self.sent: dict | None = None
        self.sent_at = 0.0
        self.t0 = time.monotonic()

    # --- the whole attempt ---------------------------------------------------------------------

    def run(self) -> str:
        beat = threading.Thread(target=self._heartbeats, daemon=True, name=f"heartbeat-{self.id[:8]}")
        beat.start()
        threading.Thread(target=self._watchdog, daemon=True, name=f"lease-{self.id[:8]}").start()
        work, held = new_workdir(self.id)
        try:
            if self.job.get("result_version") is not None:   # an earlier attempt published
                return self._finish(None, done={"timings": {}})
            return self._run_child(work)
        except LeaseLost as e:
            log.warning("job %s: %s", self.id, e)
            return "lost"
        except Exception as e:  # noqa: BLE001 - reported, so the job does not wait out its lease
            return self._broke(e)
        finally:
            self.ended.set()
            if self.child is not None and self.child.poll() is None:
                self._kill_group(signal.SIGKILL)
                self.child.wait()
            shutil.rmtree(work, ignore_errors=True)
            os.close(held)

    def _run_child(self, work: Path) -> str:
        (work / "job.json").write_text(json.dumps({"id": self.id, "spec": self.spec}))
        with open(work / "runner.log", "wb") as logf:
            self.child = subprocess.Popen(
                [sys.executable, "-P", "-m", "oscar_zoo.calibrate.runner", str(work / "job.json"),
                 str(work / "out")],
                stdout=subprocess.PIPE, stderr=logf, stdin=subprocess.DEVNULL, env=self._child_env(),
                # in the attempt's own dir: a spec's relative name (model "org/name" taken for a
                # directory, by us or by transformers) finds nothing of the worker's host there
                cwd=work, start_new_session=True, preexec_fn=_die_with_parent)
        self.info["runner_pid"] = self.child.pid
        reader = threading.Thread(target=self._read_events, daemon=True, name=f"events-{self.id[:8]}")
        reader.start()
        if self._supervise() == "lost":
            return "lost"
        reader.join(5)
        self._wait_released()            # before any report that lets the lease go
        final = self.final or {}
        # The runner says "cancelled" for any SIGTERM: only a cancel we passed on ends the job
        # so; ours at shutdown gives it back, anyone else's (an operator, earlyoom) is retried.
        if self.cancel.is_set():
            self._call(lambda: self.client.fail(self.id, self.token, "cancelled", cancelled=True))
            return "cancelled"
        if final.get("event") == "done":
            return self._finish(work, final)
        if self.stop.is_set():
            self._call(lambda: self.client.release(self.id, self.token), patience=2.0)
            return "released"
        if final.get("event") == "cancelled":
            final = {"event": "error", "retryable": True, "error": (
                "the runner received SIGTERM from outside the worker (an operator's kill, an "
                "out-of-memory killer such as earlyoom?); cancel a job with `oscar-zoo jobs "
                "cancel` or POST /v1/jobs/{id}/cancel")}
        return self._report_error(final, work / "runner.log")

    def _broke(self, e: Exception) -> str:
        """The attempt cannot go on (the registry refused the result: another model, a geometry
        mismatch, too large; a full disk; a bug): stop the runner and fail the job with the
        cause, retried only for a local I/O error, instead of leaving it `running` until its
        lease runs out and rerunning the whole calibration with the cause lost."""
        log.error("job %s: attempt broken by %s: %s", self.id, type(e).__name__, e,
                  exc_info=not isinstance(e, OscarZooError))
        if self.child is not None and self.child.poll() is None:
            self._kill_group(signal.SIGKILL)
        self._wait_released()
        retryable = isinstance(e, OSError) and not isinstance(e, OscarZooError)
        message = f"the worker could not finish the attempt: {type(e).__name__}: {e}"
        if isinstance(e, StorageFull):
            # The registry's disk (or this host's) was full. Retryable, as a local I/O error
            # is: nothing is wrong with the job, room is an operator's to make, and the job's
            # max_attempts bounds the reruns. Its message (what was full, how to make room)
            # becomes the job's error, which `jobs show` gives while it waits in the queue.
            # Failed for good, its owner would have to submit it again once room is made;
            # retried here (as _call did), the whole bundle went up again every second for
            # as long as the heartbeats kept the lease, holding the GPU.
            retryable = True
            if isinstance(e, RemoteStorageFull):   # only the result upload is let through _call
                message = f"the result could not be stored: {e}"
        message = public_line(message)      # the whole of it is in the log line above
        try:
            job = self._call(lambda: self.client.fail(self.id, self.token, message, retryable))
        except OscarZooError as report_error:   # LeaseLost included: nothing left to report to
            log.error("job %s: could not report the failure (%s)", self.id, report_error)
            return "lost"
        return "lost" if job is None else ("requeued" if job["status"] == "queued" else job["status"])

    def _supervise(self) -> str | None:
        """Wait for the child, acting on cancel, shutdown and a lost lease meanwhile."""
        grace = float(settings.get("job_cancel_grace_seconds"))
        term_at = None
        while self.child.poll() is None:
            if self.lost.is_set():
                self._kill_group(signal.SIGKILL)
                self.child.wait()
                return "lost"
            if term_at is None and (self.cancel.is_set() or self.stop.is_set()):
                term_at = time.monotonic()
                self._kill_group(signal.SIGTERM)
            if term_at is not None:
                limit = grace if self.cancel.is_set() else SHUTDOWN_GRACE_S
                if time.monotonic() - term_at > limit:
                    self._kill_group(signal.SIGKILL)
            self._forward_progress()
            time.sleep(0.1)
        return None

    # --- child process -------------------------------------------------------------------------

    def _child_env(self) -> dict | None:
        """The runner's environment (None: this process's, unchanged)."""
        changed = absolute_path_vars(os.environ)
        # The runner spreads a model over every GPU it can see (device_map="auto"): it must see
        # only the worker's own, or --gpus would limit what is claimed but not what is used.
        if self.devices is not None:
            changed["CUDA_VISIBLE_DEVICES"] = self.devices
        return {**os.environ, **changed} if changed else None

    def _read_events(self) -> None:
        for line in self.child.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "progress":
                self._on_phase(event.get("phase") or self.phase)
                self.latest = event
            else:
                self.final = event

    def _on_phase(self, phase: str) -> None:
        if phase != self.phase:
            now = time.monotonic()
            self.timings[self.phase] = round(self.timings.get(self.phase, 0.0) + now - self.phase_t0, 3)
            self.phase, self.phase_t0 = phase, now

    def _kill_group(self, sig: int) -> None:
        if self.child is None:
            return
        try:
            os.killpg(self.child.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def _wait_released(self, timeout: float = 60.0) -> None:
        """Until every process of the child's group is gone and no GPU lists its pid: the
        memory is free before the lease is given back (anchors A7, Ray #23638)."""
        if self.child is None:
            return
        self.child.wait()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.killpg(self.child.pid, 0)
            except (ProcessLookupError, PermissionError):
                if self.child.pid not in gpu_pids():
                    return
            time.sleep(0.1)
        log.error("job %s: runner group %d still present after %.0f s", self.id, self.child.pid, timeout)

    # --- talking to the registry ---------------------------------------------------------------

    def _call(self, fn: Callable, patience: float | None = None, full_retried: bool = True):
        """fn() with retries while the registry is unreachable, until our lease would have run
        out (or `patience` seconds). LeaseLost propagates; giving up sets `lost`.

        full_retried=False: a registry whose disk is full (StorageFull, 507) is raised at once.
        A small report is retried through it: room may be made while the lease lasts, and a
        full database refuses the heartbeats too, so the lease runs out soon. A result upload
        is not: each try sends the whole bundle again."""
        deadline = time.monotonic() + patience if patience is not None else None
        refused = 0
        while True:
            try:
                return fn()
            except (OfflineError, RemoteError) as e:
                if isinstance(e, StorageFull) and not full_retried:
                    raise
                # TRY_LATER answers this request, not the registry's health: the heartbeats may
                # go on getting through (and the lease with them) while an upload is refused
                # every time, so an upload tries a few times, waiting as long as asked
                refused += getattr(e, "status", None) in TRY_LATER
                left = (deadline or self.expires) - time.monotonic()
                if left < 0 or (not full_retried and refused > UPLOAD_REFUSALS):
                    self.lost.set()
                    log.error("job %s: registry unreachable or refusing (%s); giving the attempt up",
                              self.id, e)
                    return None
                time.sleep(min(max(1.0, getattr(e, "retry_after", None) or 0.0), left + 0.01))

    def _watchdog(self) -> None:
        """The lease by our own clock, apart from the beats: a beat stuck in its request (a
        registry that accepts and never answers holds it for the whole HTTP timeout, 30 s) must
        not keep the runner going after the registry has handed the job to another worker."""
        while not self.ended.wait(0.2):
            if time.monotonic() > self.expires:
                self._lose("no heartbeat got through before the lease ran out")
                return

    def _lose(self, why: str) -> None:
        """The lease is gone: kill the runner now, from whichever thread learnt it. _supervise
        would too, but it may be stuck in a progress request (up to the HTTP timeout) while the
        registry hands the job, and its GPU, to another worker."""
        log.error("job %s: %s; stopping the runner", self.id, why)
        self.lost.set()
        self._kill_group(signal.SIGKILL)

    def _heartbeats(self) -> None:
        interval = max(self.lease_s / 3, 0.2)
        wait = interval
        while not self.ended.wait(wait):
            # The registry extends the lease from when the beat arrives, at the latest when the
            # reply leaves: counted from the reply's arrival, a slow answer would make our view
            # of the lease outlast the registry's by its delay, and the runner with it.
            sent = time.monotonic()
            try:
                state = self._beat()
            except (OfflineError, RemoteError, _UnreadableBeat) as e:
                if self._beat_failed(e):
                    return
                wait = self._beat_again_in(e)
                continue
            if state is None:
                return
            self.expires = sent + float(state.get("lease_seconds") or self.lease_s)
            if state.get("cancel_requested"):
                self.cancel.set()
            wait = interval

    def _beat(self) -> dict | None:
        """One heartbeat: the job's state, or None once the attempt is lost. Raises what is
        worth retrying until the lease runs out (the registry unreachable or erring)."""
        try:
            return self.client.heartbeat(self.id, self.token)
        except LeaseLost as e:
            self._lose(f"lease lost ({e})")
        except (OfflineError, RemoteError):
            raise
        except OscarZooError as e:
            # A revoked token (401), a job that is gone (404): no later beat gets through, so
            # the runner is stopped now rather than the lease running out.
            self._lose(f"the registry refused the heartbeat ({e})")
        except Exception as e:  # noqa: BLE001 - a reply we cannot read: a blip, not the end
            # Uncaught, it would end this thread for good: no more beats, the attempt given up
            # when the lease runs out however well the registry answers afterwards.
            log.warning("job %s: unreadable heartbeat reply (%s: %s); retrying", self.id,
                        type(e).__name__, e)
            raise _UnreadableBeat(f"{type(e).__name__}: {e}") from e
        return None

    def _beat_again_in(self, e: Exception) -> float:
        """After a beat that did not get through: 1 s, or as long as a 429 (or 408, 503) asked
        in its Retry-After (a beat every second kept a rate limit tripped), but within half the
        lease left, so that another beat is tried before it runs out."""
        left = self.expires - time.monotonic()
        # and never past the lease: with under a second left, the 1 s floor slept through it
        return min(max(1.0, min(asked_wait(e), left / 2)), max(left - 0.25, 0.05))

    def _beat_failed(self, e: Exception) -> bool:
        """A beat that did not get through: True (the attempt given up) once the lease is out."""
        if time.monotonic() > self.expires:
            self._lose(f"no heartbeat got through before the lease ran out ({e})")
            return True
        return False

    def _progress_body(self) -> tuple[str, dict]:
        ev = dict(self.latest or {"phase": self.phase, "done": 0, "total": 0})
        ev.pop("event", None)
        phase = ev.pop("phase", self.phase)
        return phase, {**ev, "worker": self.info}

    def _forward_progress(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.sent_at < PROGRESS_EVERY_S:
            return
        phase, body = self._progress_body()
        if body == self.sent and not force:
            return
        timings = {**self.timings, phase: round(self.timings.get(phase, 0.0) + now - self.phase_t0, 3)}
        try:
            state = self.client.progress(self.id, self.token, phase, body, timings)
        except LeaseLost as e:
            self._lose(f"lease lost ({e})")
            return
        except (OfflineError, RemoteError) as e:
            # The heartbeat thread decides when the lease is lost. Tried again after the usual
            # interval, not at once: _supervise comes back every 0.1 s, and a registry that
            # answers 503 under load must not get ten reports a second from every worker; nor
            # before a Retry-After it asked for (429), whose refusals would take the heartbeats'
            # share of a rate limit.
            self.sent_at = now + asked_wait(e)
            return
        except OscarZooError as e:
            # A refused report (422, 413) is no reason to stop the calibration: the heartbeat
            # thread keeps the lease; try again after the usual interval.
            log.warning("job %s: progress report refused (%s); skipped", self.id, e)
            self.sent_at = now
            return
        self.sent, self.sent_at = body, now
        if state.get("cancel_requested"):
            self.cancel.set()

    # --- results -------------------------------------------------------------------------------

    def _finish(self, work: Path | None, done: dict) -> str:
        """Publish (draft if validation failed), then complete."""
        t = time.monotonic()
        self.latest = {"phase": "publishing", "done": 0, "total": 1}
        self._on_phase("publishing")
        self._forward_progress(force=True)
        version = None
        if work is not None:
            status = self._status(done)
            try:
                version = self._upload(done["bundle_dir"], status)
            except JobCancelled:     # asked while we calibrated or uploaded: nothing published
                self._call(lambda: self.client.fail(self.id, self.token, "cancelled", cancelled=True))
                return "cancelled"
            if version is None:
                return "lost"
        else:
            version = self.client.registry.version(self.job["model"], self.job["result_version"],
                                                   cache_hint=False)
        timings = {**done.get("timings", {}), "publishing": round(time.monotonic() - t, 3)}
        timings["total"] = round(time.monotonic() - self.t0, 3)
        tokens = done.get("tokens_per_pass")
        stats = {"done": 1, "total": 1, "tokens_per_pass": tokens, "worker": self.info,
                 "validation_passed": done.get("validation_passed")}
        for p in ("pass1", "pass2"):
            if tokens and timings.get(p):
                stats[f"{p}_tokens_per_s"] = round(tokens / timings[p], 1)
        error = None
        if version["status"] == "draft" and self.spec.get("publish", True):
            # a retry that finds an earlier attempt's draft has no report of its own: the version has it
            criterion = done.get("criterion") or (version.get("validation") or {}).get("criterion")
            error = (f"validation failed ({criterion}); the bundle is kept as draft "
                     f"version {version['version']} of {version['model']} with its report")
        out = self._call(lambda: self.client.complete(self.id, self.token, timings, stats, error))
        return ("failed" if error else "succeeded") if out else "lost"

    def _upload(self, bundle_dir: str, status: str, tries: int = UPLOAD_TRIES) -> dict | None:
        """The result as the job's version (None: the registry stayed unreachable). A plain 409
        (no version number free after the registry's own retries, a model created at the same
        moment) is a race another upload may lose: tried again, as one version per job makes
        safe. A lost lease or yanked content is final and propagates, and so does a registry
        out of disk space (StorageFull: _broke fails the attempt, to be retried)."""
        for attempt in range(tries):
            try:
                got = self._call(lambda: self.client.upload_result(self.id, self.token, bundle_dir,
                                                                   status), full_retried=False)
                return got[0] if got else None
            except Conflict as e:
                if type(e) is not Conflict or attempt == tries - 1:
                    raise
                log.warning("job %s: the registry refused the result for now (%s); retrying", self.id, e)
                time.sleep(0.5 * 2 ** attempt)

    def _status(self, done: dict) -> str:
        validation = self.spec.get("validation") or {}
        failed = done.get("validation_passed") is False and validation.get("require_pass", True)
        return "published" if self.spec.get("publish", True) and not failed else "draft"

    def _report_error(self, final: dict, log_path: Path) -> str:
        """Fail the attempt with a one-line error, which anyone may read (GET /v1/jobs/{id}, the
        UI). The runner's traceback, or the end of its log, names this host's paths and code:
        it goes to this worker's log, for its operator."""
        code = self.child.returncode if self.child else None
        if final.get("event") == "error":
            message = final.get("error") or "calibration failed"
            retryable = bool(final.get("retryable", True))
            detail = final.get("traceback")
        else:
            why = (f"killed by signal {signal.Signals(-code).name}" if code is not None and code < 0
                   else f"exit code {code}")
            message = (f"the calibration process ended without a result ({why}); its output is "
                       "in the worker's log")
            retryable = True
            detail = _tail(log_path)
        log.warning("job %s: %s\n%s", self.id, message, detail or "(the runner said no more)")
        message = public_line(message)      # the log line above has the whole of it
        job = self._call(lambda: self.client.fail(self.id, self.token, message, retryable))
        return "lost" if job is None else ("requeued" if job["status"] == "queued" else job["status"])


# Environment variables that name a directory or file the runner (or a library it loads) reads
# or writes, besides the path settings of zoo/settings.py.
PATH_VARS = ("HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_ASSETS_CACHE",
             "HF_DATASETS_CACHE", "HF_MODULES_CACHE", "HF_TOKEN_PATH", "HF_XET_CACHE",
             "TRANSFORMERS_CACHE", "MODELSCOPE_CACHE", "TORCH_HOME", "TORCHINDUCTOR_CACHE_DIR",
             "TRITON_CACHE_DIR", "TRITON_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME",
             "XDG_CONFIG_HOME")


def absolute_path_vars(env) -> dict[str, str]:
    """The path variables of `env` given relative, made absolute against this process's
    directory. The runner works in the attempt's own directory (deleted after it): there,
    HF_HOME=hf-cache would download the model again into a folder that goes with the attempt,
    and miss the cache the operator meant. `~` is left to the library that reads it."""
    names = PATH_VARS + tuple(s.env for s in settings.SETTINGS if s.kind == "path")
    return {name: os.path.abspath(env[name]) for name in names
            if env.get(name) and not os.path.isabs(os.path.expanduser(env[name]))}


def asked_wait(e: Exception) -> float:
    """The seconds a refusal asked to be left alone (Retry-After of a 429, 408 or 503), within
    download.RETRY_AFTER_CAP as every client of the registry waits, else 0."""
    asked = getattr(e, "retry_after", None)
    return backoff(0, asked) if asked else 0.0


def new_workdir(job_id: str) -> tuple[Path, int]:
    """A fresh work dir for one attempt, and the descriptor of the flock that marks it in use
    for as long as this process lives (a SIGKILL releases it; the runner does not inherit it).
    The lock file is locked before it gets the name sweep_workdirs looks for."""
    work = Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{job_id[:8]}-"))
    fd = os.open(work / f"{WORKDIR_LOCK}.new", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(work / f"{WORKDIR_LOCK}.new", work / WORKDIR_LOCK)
    return work, fd


def sweep_workdirs(root: str | Path | None = None) -> None:
    """Remove the work dirs of attempts whose process died without cleaning up (SIGKILL, the
    OOM killer, a power cut): nobody holds their lock. One would be left per crash, each with
    a bundle and a log; a worker starting on the host clears them."""
    for work in Path(root or tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*"):
        try:
            fd = os.open(work / WORKDIR_LOCK, os.O_RDWR)
        except OSError:
            continue          # not ours, being made, or removed meanwhile by another sweeper
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue          # its attempt is alive
        else:
            log.info("removing %s, left by a worker that died", work)
            shutil.rmtree(work, ignore_errors=True)
        finally:
            os.close(fd)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(line[:300] for line in text[-lines:])


def gpu_pids() -> set[int]:
    """PIDs holding GPU memory (nvidia-smi); empty without NVIDIA GPUs."""
    if shutil.which("nvidia-smi") is None:
        return set()
    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return set()
    return {int(x) for x in out.split() if x.strip().isdigit()}


def visible_gpus() -> list[str]:
    """GPU ids this host may use: CUDA_VISIBLE_DEVICES if set, else what nvidia-smi lists."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g for g in env.split(",") if g.strip() and g.strip() != "-1"]
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [x.strip() for x in out.splitlines() if x.strip().isdigit()]


def runner_devices(gpus: int | None) -> str | None:
    """CUDA_VISIBLE_DEVICES for the runners of a worker started with --gpus N: the first N ids
    it can see ("" for 0, the CPU); None without --gpus (the runner sees what the worker sees)."""
    if gpus is None:
        return None
    ids = visible_gpus()
    if len(ids) < gpus:
        if ids or os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
            raise ConfigError(f"--gpus {gpus}, but this worker sees {len(ids)} GPU(s) "
                              f"({','.join(ids) or 'none'}): lower --gpus or make more visible "
                              "(CUDA_VISIBLE_DEVICES)")
        ids = [str(i) for i in range(gpus)]   # no nvidia-smi to list them: CUDA counts from 0
    return ",".join(ids[:gpus])


def install_stop_signals(stop: threading.Event) -> None:
    def handler(signum, _frame):
        # as Attempt._run_child (and the Ray dispatcher's _give_back) act on it: the runner is
        # stopped, not waited for, and the lease released without spending an attempt
        # said at every shutdown, idle or not: what would happen to a job, not that one ran
        log.warning("worker: %s received; stopping (a job in progress is stopped, its lease "
                    "released: back to the queue, no attempt spent, it starts over on the next "
                    "worker)", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)


def main_loop(registry: str, token: str | None, gpus: int | None, worker: str | None,
              exit_with_parent: bool, once: bool) -> None:
    """`oscar-zoo worker`: a standalone worker against a registry URL."""
    devices = runner_devices(gpus)   # before anything starts: a bad --gpus is refused at once
    stop = threading.Event()
    install_stop_signals(stop)
    gpus = len(visible_gpus()) if gpus is None else gpus
    with JobsClient(registry, token) as client:
        run_worker(client, worker or new_worker_id(), gpus, stop, exit_with_parent, once, devices)
