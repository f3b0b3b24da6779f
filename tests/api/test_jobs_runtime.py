"""The server's jobs runtime (api/jobs_runtime.py) on SQLite and PostgreSQL: what `serve` does
about the executor tokens of earlier servers."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from oscar_zoo.api.jobs_runtime import _host, _revoke_orphaned_tokens
from oscar_zoo.registry_db.registry import open_registry
from oscar_zoo.registry_db.tokens import authenticate, create_token, list_tokens, revoke_token


def _gone_pid() -> int:
    """The pid of a process that has exited (a killed server's)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_killed_servers_executor_token_is_revoked_by_the_next_serve_on_its_host(
        registry_db_url, tmp_path):
    host = _host()
    registry = open_registry(registry_db_url, tmp_path / "data")
    try:
        with registry.db.write() as session:
            names = {"killed": f"local executor of serve pid {_gone_pid()} on {host}",
                     # killed, and this process restarted under its pid (pid 1 in a container):
                     # its name would also stop this server from making its own token
                     "restarted": f"local executor of serve pid {os.getpid()} on {host}",
                     "running": f"ray executor of serve pid {os.getppid()} on {host}",
                     "elsewhere": f"local executor of serve pid {_gone_pid()} on not-{host}"}
            tokens = {key: create_token(session, ["jobs:work"], name, created_by="serve")[1]
                      for key, name in names.items()}
            # a user's token that only reads like one: not serve's to revoke
            names["user's"] = f"local executor of serve pid {_gone_pid()} on {host}"
            tokens["user's"] = create_token(session, ["jobs:work"], names["user's"],
                                            created_by="token:alice")[1]
        with registry.db.write() as session:
            _revoke_orphaned_tokens(session)
        with registry.db.read() as session:
            live = {r.name: r.created_by for r in list_tokens(session) if r.revoked_at is None}
            assert live == {names["running"]: "serve", names["elsewhere"]: "serve",
                            names["user's"]: "token:alice"}
            for key, token in tokens.items():
                if key not in ("killed", "restarted"):
                    authenticate(session, token, "jobs:work")
    finally:
        registry.close()


def test_a_killed_servers_token_stays_while_its_worker_finishes_a_job_then_goes(
        registry_db_url, tmp_path):
    """A killed server's local workers finish the job they hold against the restarted server
    (--exit-with-parent), with the dead server's token: the restart revoked it, the worker's
    next report was refused, and the job lost its compute and an attempt. Kept while one of them
    holds a live lease; the sweeper revokes it once none does."""
    from oscar_zoo.api.jobs_runtime import _revoke_finished
    from oscar_zoo.calibrate.executors.local import local_worker_prefix
    from oscar_zoo.registry_db import jobs as jobs_db
    from oscar_zoo.zoo.errors import Unauthorized

    registry = open_registry(registry_db_url, tmp_path / "data")
    try:
        pid, idle = _gone_pid(), _gone_pid()
        with registry.db.write() as session:
            row, token = create_token(session, ["jobs:work"], f"local executor of serve pid {pid} "
                                      f"on {_host()}", created_by="serve")
            _, idle_token = create_token(session, ["jobs:work"], f"local executor of serve pid "
                                         f"{idle} on {_host()}", created_by="serve")
            job, _ = jobs_db.submit(session, {"model": "m"}, model="m", gpus=0, max_attempts=2,
                                    lease_seconds=60)
            # another server's worker holding a job does not keep the idle one's token
            jobs_db.submit(session, {"model": "m2"}, model="m2", gpus=0, max_attempts=2,
                           lease_seconds=60)
            assert jobs_db.claim(session, f"{local_worker_prefix(pid)}w0:abc123", None)[0].id == job.id
            jobs_db.claim(session, f"{local_worker_prefix(os.getpid())}w0:def456", None)
        with registry.db.write() as session:
            kept = _revoke_orphaned_tokens(session)
        assert kept == {row.id: pid}
        with registry.db.read() as session:
            authenticate(session, token, "jobs:work")               # the worker goes on
            with pytest.raises(Unauthorized):
                authenticate(session, idle_token, "jobs:work")
        with registry.db.write() as session:
            _revoke_finished(session, kept)                           # still running: kept
        assert kept == {row.id: pid}
        # revoked meanwhile by an admin (its warning invites that): dropped, not a NotFound on
        # every sweep from then on, which kept expired leases from ever being requeued
        admins_too = dict(kept)
        with registry.db.write() as session:
            revoke_token(session, str(row.id), by="cli")
        with registry.db.write() as session:
            _revoke_finished(session, admins_too)
        assert admins_too == {}
        with registry.db.write() as session:
            session.get(type(row), row.id).revoked_at = None          # live again, for the rest
        with registry.db.write() as session:
            jobs_db.get(session, job.id).status = "succeeded"         # the job ended
            _revoke_finished(session, kept)
        assert kept == {}
        with registry.db.read() as session, pytest.raises(Unauthorized):
            authenticate(session, token, "jobs:work")
    finally:
        registry.close()


def test_the_sweeper_outlives_a_lease_setting_turned_bad_and_resumes_once_fixed(
        monkeypatch, caplog):
    """Its wait was computed outside the loop's try: one bad OSCAR_ZOO_JOB_LEASE_SECONDS while
    the server ran ended the sweeper for good, and expired leases were never swept again."""
    import threading

    from oscar_zoo.api.jobs_runtime import JobsRuntime

    runtime = JobsRuntime.__new__(JobsRuntime)      # the loop alone: no app, no executor
    runtime.stopping = threading.Event()
    swept = threading.Event()
    runtime.sweep = swept.set
    monkeypatch.setenv("OSCAR_ZOO_JOB_LEASE_SECONDS", "soon")
    thread = threading.Thread(target=runtime._loop, daemon=True)
    thread.start()
    try:
        assert not swept.wait(1.0)          # waiting 5 s between sweeps, not dead
        assert thread.is_alive()
        assert "OSCAR_ZOO_JOB_LEASE_SECONDS='soon'" in caplog.text
        monkeypatch.setenv("OSCAR_ZOO_JOB_LEASE_SECONDS", "3")
        assert swept.wait(10.0)
    finally:
        runtime.stopping.set()
        thread.join(10)


class _ExecutorThatFailsToStop:
    """Stands in for the local or Ray executor: neither can be made to fail at stop() on demand
    (a worker that will not die, a Ray cluster gone mid-shutdown), and stop() is all the runtime
    calls at shutdown."""

    def stop(self) -> list[str]:
        raise RuntimeError("worker 0 did not exit")


def test_an_executor_that_fails_to_stop_still_has_its_token_revoked(registry_db_url, tmp_path,
                                                                     caplog):
    """The revoke came after executor.stop() in the same block: one that raised left the
    executor's jobs:work token live after the server was gone, and the sweeper running."""
    from fastapi import FastAPI

    from oscar_zoo.api.jobs_runtime import JobsRuntime
    from oscar_zoo.zoo.errors import Unauthorized

    registry = open_registry(registry_db_url, tmp_path / "data")
    try:
        app = FastAPI()
        app.state.registry = registry
        runtime = JobsRuntime(app)
        runtime.start()                 # the sweeper thread; no executor of its own
        with registry.db.write() as session:
            row, token = create_token(session, ["jobs:work"], f"local executor of serve pid "
                                      f"{os.getpid()} on {_host()}", created_by="serve")
        runtime.token_id, runtime.executor = row.id, _ExecutorThatFailsToStop()

        with pytest.raises(RuntimeError, match="did not exit"):
            runtime.stop()

        with registry.db.read() as session, pytest.raises(Unauthorized):
            authenticate(session, token, "jobs:work")
        assert runtime.stopping.is_set() and not runtime.thread.is_alive()
        assert ("the job executor failed to stop (RuntimeError: worker 0 did not exit)"
                in caplog.text)
    finally:
        registry.close()


@pytest.mark.parametrize("breaks", ["its construction", "its start"])
def test_an_executor_that_fails_to_start_leaves_no_live_token_and_no_sweeper(
        registry_db_url, tmp_path, monkeypatch, breaks):
    """The executor's token was made before the executor, and the runtime started outside the
    lifespan's try: an executor that failed to come up left its jobs:work token live (until a
    later serve on this host revoked it) and the sweeper thread running. Real failures of the
    local executor: a bad OSCAR_ZOO_WORKERS when it is made, a file where its GPU locks go when
    it starts."""
    import asyncio

    from fastapi import FastAPI

    from oscar_zoo.api import jobs_runtime
    from oscar_zoo.zoo.errors import ConfigError

    monkeypatch.setenv("OSCAR_ZOO_EXECUTOR", "local")
    registry = open_registry(registry_db_url, tmp_path / "data")
    try:
        if breaks == "its construction":
            monkeypatch.setenv("OSCAR_ZOO_WORKERS", "lots")
            raised = ConfigError
        else:
            (tmp_path / "data" / "gpu-locks").write_text("a file in the way")
            raised = FileExistsError
        app = FastAPI()
        app.state.registry, app.state.start_workers = registry, True
        app.state.self_url = "http://127.0.0.1:9"
        jobs_runtime.install(app)

        async def serve() -> None:
            async with app.router.lifespan_context(app):
                raise AssertionError("the server started")

        with pytest.raises(raised):
            asyncio.run(serve())
        runtime = app.state.jobs_runtime
        assert runtime.stopping.is_set() and not runtime.thread.is_alive()
        with registry.db.read() as session:
            made = [t for t in list_tokens(session) if t.created_by == "serve"]
        assert len(made) == 1 and made[0].revoked_at is not None
        assert runtime.token_id is None and runtime.executor is None
    finally:
        registry.close()


def test_stop_revokes_a_token_whose_executor_never_came_to_be(registry_db_url, tmp_path):
    """stop() revoked the token only beside an executor: one made for an executor that then
    failed to come up stayed live."""
    from fastapi import FastAPI

    from oscar_zoo.api.jobs_runtime import JobsRuntime
    from oscar_zoo.zoo.errors import Unauthorized

    registry = open_registry(registry_db_url, tmp_path / "data")
    try:
        app = FastAPI()
        app.state.registry = registry
        runtime = JobsRuntime(app)
        runtime.start()
        with registry.db.write() as session:
            row, token = create_token(session, ["jobs:work"], f"local executor of serve pid "
                                      f"{os.getpid()} on {_host()}", created_by="serve")
        runtime.token_id = row.id
        runtime.stop()
        with registry.db.read() as session, pytest.raises(Unauthorized):
            authenticate(session, token, "jobs:work")
        assert not runtime.thread.is_alive()
        runtime.stop()          # again: nothing left to revoke, no error
    finally:
        registry.close()
