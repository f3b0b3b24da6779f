"""What the server runs for jobs beside the API: the lease sweeper (always) and, when
`app.state.start_workers` is set (`oscar-zoo serve` without --no-workers), an executor.

The sweeper requeues expired leases inside the service itself, so a dead worker's job never
waits for someone's cron (anchors A7, synthesis 3). It runs every lease/6 seconds (0.5 to 5 s)
and takes a write transaction only when a lease has expired.

The executor gets a token of its own (scope jobs:work), created at startup and revoked at a
clean shutdown. A server that was killed could not revoke its token: the next `serve` on the
same host revokes every executor token of a serve process there that no longer runs, once that
server's local workers hold no job (they finish theirs against the new server with it). On
shutdown the local executor's workers stop, give their jobs back and wait until their GPU work
is gone; jobs they still held are requeued without spending an attempt.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI
from sqlalchemy import exists, or_, select

from ..registry_db import jobs as jobs_db
from ..registry_db.models import Job
from ..registry_db.tokens import create_token, list_tokens, revoke_token
from ..zoo import settings
from ..zoo.errors import ConfigError

log = logging.getLogger("oscar_zoo.jobs")


class JobsRuntime:
    def __init__(self, app: FastAPI):
        self.app = app
        self.registry = app.state.registry
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.executor = None
        self.token_id: int | None = None
        self.orphans: dict[int, int] = {}   # a killed server's tokens its workers still use

    def start(self) -> None:
        # a serve with --no-workers too: a killed server's token must not outlive it
        with self.registry.db.write() as session:
            self.orphans = _revoke_orphaned_tokens(session)
        self.sweep()   # leases that ran out while the service was down
        self.thread = threading.Thread(target=self._loop, daemon=True, name="job-sweeper")
        self.thread.start()
        if getattr(self.app.state, "start_workers", False):
            self._start_executor()

    def stop(self) -> None:
        """Stop the executor, give back the jobs its workers held and revoke its token, then the
        sweeper. The executor failing to stop re-raises only once the rest is done: its token
        (scope jobs:work) must not outlive the server, nor the sweeper keep running."""
        try:
            if self.executor is not None:
                self._stop_executor()
            elif self.token_id is not None:     # made, and its executor never came to be
                self._release([])
        finally:
            self.stopping.set()
            if self.thread is not None:
                self.thread.join(10)

    def _stop_executor(self) -> None:
        holders: list[str] = []
        try:
            holders = self.executor.stop()
        except Exception as e:
            # which jobs its workers held is not known: as after a kill, a sweeper requeues
            # them once their leases run out
            log.error("the job executor failed to stop (%s: %s); revoking its token anyway, and "
                      "the jobs it held return to the queue when their leases expire",
                      type(e).__name__, e)
            raise
        finally:
            self._release(holders)

    def _release(self, holders: list[str]) -> None:
        """Requeue the jobs these lease holders still held, and revoke the executor's token."""
        with self.registry.db.write() as session:
            holders = holders + _ray_tasks_of(session, holders)
            for job_id, status in jobs_db.release_held_by(session, holders):
                done = "requeued" if status == "queued" else status  # cancelled: one was pending
                log.warning("job %s: %s (its worker stopped with the server)", job_id, done)
            if self.token_id is not None:
                revoke_token(session, str(self.token_id), by="serve")
        self.token_id = None        # revoked: a second stop() must not look for it again

    # --- sweeper -------------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self.stopping.wait(_safe_interval()):
            try:
                self.sweep()
            except Exception:  # noqa: BLE001 - the sweeper must outlive a database hiccup
                log.exception("job sweeper: sweep failed; retrying")

    def sweep(self) -> None:
        if self.orphans:
            try:
                with self.registry.db.write() as session:
                    _revoke_finished(session, self.orphans)
            except Exception:  # noqa: BLE001 - never in the way of requeueing expired leases
                log.exception("job sweeper: revoking a gone server's token failed; retrying")
        now = jobs_db.now_utc()
        with self.registry.db.read() as session:
            due = session.scalar(select(exists().where(Job.status == "running",
                                                       Job.lease_expires_at < now)))
        if not due:
            return
        with self.registry.db.write() as session:
            for job_id, status in jobs_db.sweep(session, now):
                log.warning("job %s: lease expired -> %s", job_id, status)

    # --- executor ------------------------------------------------------------------------------

    def _start_executor(self) -> None:
        url = getattr(self.app.state, "self_url", None)
        if not url:
            raise ConfigError("workers need the server's own URL (app.state.self_url); "
                              "`oscar-zoo serve` sets it")
        kind = settings.get("executor")
        with self.registry.db.write() as session:
            row, token = create_token(session, ["jobs:work"], f"{kind} executor of serve pid "
                                      f"{os.getpid()} on {_host()}", created_by="serve")
            self.token_id = row.id
        try:
            if kind == "local":
                from ..calibrate.executors.local import LocalExecutor

                # the registry's own data dir: a restarted server finds its killed
                # predecessor's GPU locks there whatever the environment says
                self.executor = LocalExecutor(url, token,
                                              lock_dir=Path(self.registry.data_dir) / "gpu-locks")
            else:   # ray: settings refuses any other choice
                from ..calibrate.executors.ray_executor import RayExecutor

                self.executor = RayExecutor(url, token, settings.get("ray_address"))
            self.executor.start()
        except BaseException:
            # The token (scope jobs:work) would stay live after this server failed to start:
            # only a later serve on this host revokes a dead one's. An executor half started
            # (some workers up) is stopped with it.
            self._undo_start()
            raise

    def _undo_start(self) -> None:
        try:
            if self.executor is not None:
                self._stop_executor()
            else:
                self._release([])
        except Exception as e:  # noqa: BLE001 - the failure to start is what is raised
            left = "" if self.token_id is None else (
                f"; its token {self.token_id} is still live: `oscar-zoo tokens revoke "
                f"{self.token_id}`")
            log.error("could not undo the job executor's start (%s: %s)%s", type(e).__name__,
                      e, left)
        finally:
            self.executor = None


_EXECUTOR_TOKEN = re.compile(r"\w+ executor of serve pid (\d+) on (\S+)")


def _revoke_orphaned_tokens(session) -> dict[int, int]:
    """Revoke the executor tokens of serve processes on this host that are gone (killed before
    their clean shutdown could). Called before this server makes its own. Other hosts' are
    theirs to revoke: their pids mean nothing here.

    A killed server's local workers finish the job they hold against the next one, with its
    token (executors/local.py, --exit-with-parent): revoked now, the job's compute and an
    attempt were lost. Such a token is kept while one of them holds a live lease; returns those
    kept, {token id: its server's pid}, which the sweeper revokes once none does
    (_revoke_finished)."""
    kept = {}
    host = _host()
    for row in list_tokens(session):
        m = _EXECUTOR_TOKEN.fullmatch(row.name or "")
        if row.revoked_at is not None or row.created_by != "serve" or not m or m[2] != host:
            continue
        pid = int(m[1])
        # our own pid: a killed server's, restarted under it (pid 1 in a container), whose
        # workers died with it; this server has made no token yet
        if pid == os.getpid() or not _running(pid):
            if pid != os.getpid() and _workers_hold_a_lease(session, pid):
                kept[row.id] = pid
                log.warning("token %s (%s): its server is gone; kept until its workers finish "
                            "the jobs they hold", row.id, row.name)
                continue
            revoke_token(session, str(row.id), by="serve")
            log.warning("revoked token %s (%s): its server is gone", row.id, row.name)
    return kept


def _workers_hold_a_lease(session, pid: int) -> bool:
    """Whether a local worker of serve `pid` on this host holds a running job's live lease."""
    from ..calibrate.executors.local import local_worker_prefix

    prefix = local_worker_prefix(pid)
    return bool(session.scalar(select(exists().where(
        Job.status == "running", Job.lease_expires_at > jobs_db.now_utc(),
        Job.lease_holder.startswith(prefix, autoescape=True)))))


def _revoke_finished(session, kept: dict[int, int]) -> None:
    """Revoke the kept tokens whose server's workers hold no live lease any more (their job
    ended, or its lease ran out and the sweep requeued it)."""
    live = {t.id for t in list_tokens(session) if t.revoked_at is None}
    for token_id, pid in list(kept.items()):
        if token_id not in live:        # revoked meanwhile (`tokens revoke`, another serve)
            del kept[token_id]
        elif not _workers_hold_a_lease(session, pid):
            revoke_token(session, str(token_id), by="serve")
            log.warning("revoked token %s: the workers of gone serve pid %s hold no job", token_id, pid)
            del kept[token_id]


def _host() -> str:
    return socket.gethostname()[:100]     # the token's name holds it: at most 194 characters


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:   # someone else's process: running
        return True
    return True


def _ray_tasks_of(session, holders: list[str]) -> list[str]:
    """The lease holders of running jobs that Ray tasks of these dispatchers attached to: they
    hold the lease in their own names, which begin with their dispatcher's."""
    from ..calibrate.executors.ray_executor import task_prefix

    dispatchers = [h for h in holders if h.startswith("dispatch:")]
    if not dispatchers:
        return []
    attached = or_(*(Job.lease_holder.startswith(task_prefix(d), autoescape=True)
                     for d in dispatchers))
    return list(session.scalars(select(Job.lease_holder).where(Job.status == "running", attached)))


def interval() -> float:
    return max(0.5, min(5.0, float(settings.get("job_lease_seconds")) / 6))


def _safe_interval() -> float:
    """interval(), or its longest while the lease setting is invalid: a value turned bad while
    the server runs must not end the sweeper, which goes on once it is fixed."""
    try:
        return interval()
    except ConfigError as e:
        log.error("job sweeper: %s", e)
        return 5.0


def install(app: FastAPI) -> None:
    """Add the jobs and worker routes and run the sweeper (and executor) with the app."""
    from .routes import jobs, workers

    app.include_router(jobs.router)
    app.include_router(workers.router)
    app.state.start_workers = getattr(app.state, "start_workers", False)
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(a):
        runtime = JobsRuntime(app)
        app.state.jobs_runtime = runtime
        try:
            # inside: a start that fails after the sweeper began (the executor's) stops it
            runtime.start()
            async with inner(a) as state:
                yield state
        finally:
            runtime.stop()

    app.router.lifespan_context = lifespan
