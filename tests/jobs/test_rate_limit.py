"""The jobs client and the worker against a rate-limited registry: the real API app over HTTP
(SQLite), with a rate limit in front of it that answers 429 Too Many Requests and Retry-After.

The registry has no rate limit of its own (api/limits.py limits request sizes), so the limit
is the stand-in here, as a reverse proxy or API gateway in front of the registry would put one
(nginx's limit_req, a cloud gateway): the only piece that is not the real thing. Everything
behind it (routes, auth, database) and in front of it (JobsClient, the `oscar-zoo jobs` CLI,
the worker's heartbeat and progress threads) is.

What the code intends (zoo/jobs_client.py): a 429 says the request was not acted on, so the
user's calls (submit, status, cancel, watch) send it again after the Retry-After asked for, a
few times; asked to wait longer than download.RETRY_AFTER_CAP, or refused every time, the
command fails at once with one line saying to try again later. The worker paces its heartbeats
and progress reports by the Retry-After too, within its lease.
"""

from __future__ import annotations

import math
import re
import threading
import time
from dataclasses import dataclass, field

import pytest
from click.testing import CliRunner

from oscar_zoo.zoo.cli.main import cli
from oscar_zoo.zoo.jobs_client import TRY_LATER_RETRIES, JobsClient


@dataclass
class Seen:
    at: float
    method: str
    path: str
    status: int
    retry_after: int | None = None


@dataclass
class RateLimit:
    """At most `allowed` requests to matching paths per `window` seconds (a fixed window, from
    the first request past the last window), the rest answered 429 problem+json with
    Retry-After: the whole seconds until the window ends, or `retry_after` where set.
    `close(s)`: refuse every matching request for the next s seconds."""

    route: str
    allowed: int = 1
    window: float = 1.0
    retry_after: int | None = None
    seen: list[Seen] = field(default_factory=list)
    _start: float = -math.inf
    _count: int = 0
    _closed_until: float = -math.inf

    def close(self, seconds: float) -> None:
        self._closed_until = time.monotonic() + seconds

    def refuses(self, now: float) -> int | None:
        """None to let the request through, else the Retry-After to answer with."""
        if now < self._closed_until:
            return math.ceil(self._closed_until - now)
        if now - self._start >= self.window:
            self._start, self._count = now, 0
        self._count += 1
        if self._count <= self.allowed:
            return None
        return self.retry_after if self.retry_after is not None else \
            math.ceil(self._start + self.window - now)

    def refused(self, path: str = "") -> list[Seen]:
        return [s for s in self.seen if s.status == 429 and path in s.path]

    def passed(self, path: str = "") -> list[Seen]:
        return [s for s in self.seen if s.status != 429 and path in s.path]


def limited(app, limits: list[RateLimit]):
    """The ASGI app behind the rate limits (matched against METHOD PATH)."""
    async def limiter(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        what = f"{scope['method']} {scope['path']}"
        limit = next((lim for lim in limits if re.search(lim.route, what)), None)
        now = time.monotonic()
        asked = None if limit is None else limit.refuses(now)
        if asked is None:
            # seen when it comes in, its status filled in when the answer starts: a stream
            # (job events) may end at the client before the app's call returns here
            seen = Seen(now, scope["method"], scope["path"], 0)
            if limit is not None:
                limit.seen.append(seen)

            async def noting(message):
                if message["type"] == "http.response.start":
                    seen.status = message["status"]
                await send(message)

            await app(scope, receive, noting)
            return
        limit.seen.append(Seen(now, scope["method"], scope["path"], 429, asked))
        body = (b'{"type": "about:blank", "title": "Too Many Requests", "status": 429, '
                b'"detail": "rate limit exceeded"}')
        await send({"type": "http.response.start", "status": 429, "headers": [
            (b"content-type", b"application/problem+json"),
            (b"content-length", str(len(body)).encode()),
            (b"retry-after", str(asked).encode())]})
        await send({"type": "http.response.body", "body": body})

    return limiter


@pytest.fixture
def limited_registry(tmp_path, monkeypatch):
    """(server, limits): the real registry (SQLite) behind `limits`, a list the test fills
    (empty: no limit). OSCAR_ZOO_ENDPOINT and OSCAR_ZOO_TOKEN (jobs:submit) set for the CLI."""
    from tests.utils.registry_server import run_registry

    limits: list[RateLimit] = []
    with run_registry(None, tmp_path / "registry-data",
                      app_factory=lambda r: limited(_app(r), limits)) as server:
        monkeypatch.setenv("OSCAR_ZOO_ENDPOINT", server.url)
        monkeypatch.setenv("OSCAR_ZOO_TOKEN", server.token("jobs:submit", name="owner"))
        yield server, limits


def _app(registry):
    from oscar_zoo.api.app import create_app

    return create_app(registry=registry)


def jobs(*args: str):
    return CliRunner().invoke(cli, ["jobs", *args])


def _waited_as_asked(limit: RateLimit) -> None:
    """Every 429 was followed by the same request no sooner than its Retry-After."""
    for refusal in limit.refused():
        after = [s for s in limit.seen if s.at > refusal.at and s.path == refusal.path
                 and s.method == refusal.method]
        assert after, f"{refusal} was never sent again"
        assert after[0].at - refusal.at >= refusal.retry_after - 0.05, (refusal, after[0])


def test_the_jobs_commands_wait_out_a_rate_limit_as_asked(limited_registry):
    """One request a second to /v1/jobs: each command after the first meets a 429 asking for
    1 s, and gets through after waiting it. Before, submit, status and cancel failed on the
    first 429, and watch asked again every second for two minutes, then said it had lost the
    registry."""
    server, limits = limited_registry
    limit = RateLimit(r"^(GET|POST) /v1/jobs", allowed=1, window=1.0)
    limits.append(limit)
    t0 = time.monotonic()
    submitted = jobs("submit", "smollm2-135m", "--json")
    assert submitted.exit_code == 0, submitted.output
    job = re.search(r'"id": "([0-9a-f-]+)"', submitted.stdout)[1]
    shown = jobs("status", job)
    assert shown.exit_code == 0 and f"job         {job}" in shown.stdout, shown.output
    cancelled = jobs("cancel", job)
    assert cancelled.exit_code == 0 and f"job {job}: cancelled" in cancelled.stderr, cancelled.output
    watched = jobs("watch", job)
    assert watched.exit_code == 1 and "status      cancelled" in watched.stdout, watched.output
    assert time.monotonic() - t0 < 8
    refused = {(s.method, s.path.rsplit("/", 1)[-1]) for s in limit.refused()}
    assert refused == {("GET", job), ("POST", "cancel"), ("GET", "events")}, limit.seen
    _waited_as_asked(limit)
    assert len(limit.passed()) == len(limit.seen) - len(limit.refused())
    with server.registry.db.read() as session:     # one job, though the limit met the calls
        from oscar_zoo.registry_db.models import Job

        assert session.query(Job).count() == 1


@pytest.mark.parametrize("retry_after, says, tries", [
    (120, "the registry asked to wait 2 min: try again then", 1),
    (0, f"refused {TRY_LATER_RETRIES + 1} times in a row, last asking to wait 0 s: the registry "
        "is busy or limiting requests, try again in a minute", TRY_LATER_RETRIES + 1)])
def test_a_rate_limit_that_does_not_lift_fails_the_command_saying_to_try_later(
        limited_registry, retry_after, says, tries):
    """Asked to wait longer than RETRY_AFTER_CAP (30 s), the command says so at once rather than
    sit silent; refused every time, it gives up after a few tries. One line, exit 1, no
    traceback; no job was queued by the refused submits."""
    server, limits = limited_registry
    limit = RateLimit(r"^POST /v1/jobs$", allowed=0, window=3600, retry_after=retry_after)
    limits.append(limit)
    r = jobs("submit", "smollm2-135m")
    assert r.exit_code == 1, r.output
    line = " ".join(r.stderr.split())
    assert line.startswith(f"Error: registry {server.url}: 429 Too Many Requests: rate limit "
                           "exceeded;") and line.endswith(says), r.stderr
    assert "Traceback" not in r.output and len(r.stderr.strip().splitlines()) == 1
    assert len(limit.seen) == tries
    with JobsClient(server.url, server.token("jobs:submit", name="reader")) as client:
        assert client.list()["items"] == []


def test_the_worker_beats_and_reports_after_the_retry_after_within_its_lease(limited_registry):
    """The heartbeats were sent again every second and progress every half second through a
    429 asking for longer, keeping a rate limit tripped (and the progress refusals taking the
    heartbeats' share of it). The heartbeat and progress threads of a real Attempt, on a job
    claimed from the real registry; the runner is not started."""
    from oscar_zoo.calibrate.executors.worker import Attempt, new_worker_id

    server, limits = limited_registry
    with JobsClient(server.url, server.token("jobs:submit", name="submitter")) as owner, \
            JobsClient(server.url, server.token("jobs:work", name="gpu")) as client:
        owner.submit({"model": "smollm2-135m", "lease_seconds": 6})
        claimed = client.claim(new_worker_id(), gpus=1)
        # refusing only while closed, as a limit tripped by other clients of the registry
        beats = RateLimit(r"/heartbeat$", allowed=10**6)
        reports = RateLimit(r"/progress$", allowed=10**6)
        limits.extend([beats, reports])
        stop = threading.Event()
        attempt = Attempt(client, claimed["job"], claimed["lease"], "w", stop)
        beats.close(4.0)
        reports.close(4.0)
        threads = [threading.Thread(target=attempt._heartbeats, daemon=True),
                   threading.Thread(target=attempt._watchdog, daemon=True)]
        for t in threads:
            t.start()
        try:
            deadline = time.monotonic() + 5.5    # the report refused at 0 s goes again at 4.5 s
            while time.monotonic() < deadline:    # as _supervise does, every 0.1 s
                attempt.latest = {"event": "progress", "phase": "pass1",
                                  "done": int(time.monotonic() * 10), "total": 10**12}
                attempt._forward_progress()
                time.sleep(0.1)
        finally:
            attempt.ended.set()
            for t in threads:
                t.join(5)
    assert not attempt.lost.is_set(), "the lease was given up"
    # the first beat (at lease/3 = 2 s) asked to wait 2 s: sent again once, then through
    assert [s.status for s in beats.seen][:2] == [429, 200], beats.seen
    assert len(reports.refused()) == 1 and reports.passed(), reports.seen
    _waited_as_asked(beats)
    _waited_as_asked(reports)
