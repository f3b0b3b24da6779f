"""HTTP client of the jobs API: the user's side (submit, follow, cancel) and the worker protocol
(claim, heartbeat, progress, result). Built on RegistryClient (endpoint, token, problem+json ->
domain errors); no torch, so `oscar-zoo jobs ...` and the worker's supervisor stay light.

    jobs = JobsClient()                              # OSCAR_ZOO_ENDPOINT, OSCAR_ZOO_TOKEN
    job, created = jobs.submit({"model": "smollm2-135m", "tokens": 8192})
    for state in jobs.events(job["id"]): ...         # until a terminal status

The user's side names a job by its whole id or a unique prefix of at least 8 characters (as
`oscar-zoo jobs list` shows it); the worker protocol by its whole id.

On the worker endpoints a 409 means the lease is gone (raised as LeaseLost), except on the
result upload, whose 409 may also refuse the version (yanked content, ...): a Conflict then.

"Not now" answers (errors.TRY_LATER: a 429 Too Many Requests from a rate limit in front of the
registry, 408, 425) say the request was not acted on, so the user's side (submit and cancel
too, status, list, events) sends it again after the Retry-After asked for, up to
TRY_LATER_RETRIES times; refused still, or asked to wait longer than download.RETRY_AFTER_CAP
(30 s), it raises the RemoteError saying when to try again. The worker protocol does not: the
worker paces those calls by its lease (executors/worker.py), and an upload sends the whole
bundle each time.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import quote

from . import settings
from .errors import TRY_LATER, Conflict, LeaseLost, OfflineError, OscarZooError, RemoteError
from .registry_client import RegistryClient

TERMINAL = ("succeeded", "failed", "cancelled")
SHORT_ID = 8    # the fewest leading characters of a job id that name its job, as `jobs list` shows


class JobsClient:
    def __init__(self, endpoint: str | None = None, token: str | None = None):
        self.registry = RegistryClient(endpoint, token)

    @property
    def endpoint(self) -> str:
        return self.registry.endpoint

    def close(self) -> None:
        self.registry.close()

    def __enter__(self) -> "JobsClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- the user's side -----------------------------------------------------------------------

    def submit(self, spec: dict, idempotency_key: str | None = None) -> tuple[dict, bool]:
        # A key of our own where none is given: a TRY_LATER answer is sent again, and a 408 from
        # a gateway may come after the registry queued the job; under one key a resend is
        # answered with that job, not a second one
        key = idempotency_key or f"oscar-zoo-{uuid.uuid4().hex}"
        sent = []

        def once():
            sent.append(1)
            # retry=False: a 5xx or a dropped connection is not sent again (the user decides)
            return self.registry.request("POST", "/v1/jobs", json=spec,
                                         headers={"Idempotency-Key": key}, retry=False)

        r = self._patiently(once)
        # a 200 to a resend under our own key is the job our first send created
        return r.json(), r.status_code == 201 or (idempotency_key is None and len(sent) > 1)

    def get(self, job_id: str) -> dict:
        return self._patiently(lambda: self.registry.get_json(f"/v1/jobs/{_id(job_id)}"))

    def list(self, status: str | None = None, model: str | None = None, limit: int = 50,
             cursor: str | None = None) -> dict:
        return self._patiently(lambda: self.registry.get_json(
            "/v1/jobs", status=status, model=model, limit=limit, cursor=cursor))

    def cancel(self, job_id: str) -> dict:
        return self._patiently(lambda: self.registry.request(
            "POST", f"/v1/jobs/{_id(job_id)}/cancel", retry=False)).json()

    def _patiently(self, call):
        """call() again while the registry answers TRY_LATER, waiting as it asks."""
        refused = 0
        while True:
            try:
                return call()
            except RemoteError as e:
                if getattr(e, "status", None) not in TRY_LATER:
                    raise
                refused += 1
                time.sleep(_wait_or_raise(e, refused))

    def events(self, job_id: str, reconnect_s: float = 120.0) -> Iterator[dict]:
        """The job's state on every change (server-sent events) until it ends; reconnects
        through a registry restart for up to `reconnect_s` seconds. job_id: whole or a prefix."""
        import httpx

        down_since, refused = None, 0
        while True:
            try:
                timeout = httpx.Timeout(60.0, connect=10.0)
                with self.registry.http().stream("GET", f"/v1/jobs/{_id(job_id)}/events",
                                                 timeout=timeout) as r:
                    if r.status_code in TRY_LATER:
                        # waited out as asked; as a lost registry it was asked again every
                        # second for 2 minutes, then told as "lost the registry"
                        r.read()
                        refused += 1
                        time.sleep(_wait_or_raise(self.registry.error_of(r), refused))
                        continue
                    if r.status_code >= 400:
                        r.read()
                        self.get(job_id)          # raises the domain error
                        raise OfflineError(f"job events answered {r.status_code}")
                    down_since, refused = None, 0
                    for job in parse_sse(r.iter_lines()):
                        job_id = job.get("id") or job_id   # reconnect by the whole id
                        yield job
                        if job.get("status") in TERMINAL:
                            return
            except (httpx.TransportError, OfflineError):
                down_since = down_since or time.monotonic()
                if time.monotonic() - down_since > reconnect_s:
                    raise OfflineError(f"lost the registry at {self.registry.where} for "
                                       f"{reconnect_s:.0f} s while following job {job_id}") from None
                time.sleep(1.0)

    # --- the worker protocol -------------------------------------------------------------------

    def _work(self, path: str, timeout: float | None = None, **body) -> Any:
        extra = {} if timeout is None else {"timeout": timeout}
        try:
            r = self.registry.request("POST", path, json=body, retry=False, **extra)
        except Conflict as e:
            raise LeaseLost(str(e)) from None
        return r.json() if r.status_code != 204 else None

    def claim(self, worker: str, gpus: int | None, ray: bool = False,
              wait: float = 0) -> dict | None:
        """{job, lease: {token, seconds, expires_at}}, or None when no job came within `wait`
        seconds (a long poll)."""
        # The registry answers only after up to `wait` s: a read timeout shorter than that would
        # drop an answer that leased a job, which then waits out its lease unrun.
        timeout = float(settings.get("http_timeout")) + wait
        return self._work("/v1/workers/claim", timeout=timeout, worker=worker, gpus=gpus,
                          ray=ray, wait=wait)

    def attach(self, job_id: str, lease: str, worker: str) -> dict:
        """A Ray task takes over its dispatcher's lease: the job, whose `lease` (token, seconds)
        the task's later calls present; another task process attaching replaces that token."""
        return self._work(f"/v1/jobs/{job_id}/attach", lease=lease, worker=worker)

    def heartbeat(self, job_id: str, lease: str, worker: str | None = None) -> dict:
        """worker: who beats, when not the lease's holder (a Ray dispatcher for its task)."""
        return self._work(f"/v1/jobs/{job_id}/heartbeat", lease=lease,
                          **({"worker": worker} if worker else {}))

    def progress(self, job_id: str, lease: str, phase: str, progress: dict,
                 timings: dict | None = None) -> dict:
        return self._work(f"/v1/jobs/{job_id}/progress", lease=lease, phase=phase,
                          progress=progress, timings=timings)

    def complete(self, job_id: str, lease: str, timings: dict | None = None,
                 progress: dict | None = None, error: str | None = None) -> dict:
        return self._work(f"/v1/jobs/{job_id}/complete", lease=lease, timings=timings,
                          progress=progress, error=_clean(error))

    def fail(self, job_id: str, lease: str, error: str, retryable: bool = True,
             cancelled: bool = False) -> dict:
        return self._work(f"/v1/jobs/{job_id}/fail", lease=lease, error=_clean(error),
                          retryable=retryable, cancelled=cancelled)

    def release(self, job_id: str, lease: str) -> dict:
        return self._work(f"/v1/jobs/{job_id}/release", lease=lease)

    def upload_result(self, job_id: str, lease: str, bundle_dir: str | Path,
                      status: str) -> tuple[dict, bool]:
        """The bundle as the job's version: (version detail, created)."""
        from .manifest import MANIFEST

        bundle_dir = Path(bundle_dir)
        manifest = json.loads((bundle_dir / MANIFEST).read_text())
        names = [MANIFEST] + [f["name"] for f in manifest.get("files", [])]
        handles = [open(bundle_dir / n, "rb") for n in names]
        try:
            files = [(n, (n, h, "application/octet-stream")) for n, h in zip(names, handles)]
            r = self.registry.request("POST", f"/v1/jobs/{job_id}/result", files=files,
                                      data={"status": status}, retry=False,
                                      headers={"X-Lease-Token": lease})
        except Conflict as e:
            raise self._lease_or(e, job_id, lease) from None
        finally:
            for h in handles:
                h.close()
        return r.json(), r.status_code == 201

    def _lease_or(self, conflict: Conflict, job_id: str, lease: str) -> Conflict:
        """A 409 on the result is a lost lease or a refused version (this content was yanked,
        no version number could be allocated): a heartbeat tells which. The second must end
        the job with its cause, not be taken for someone else owning the job."""
        try:
            self.heartbeat(job_id, lease)
        except LeaseLost:
            return LeaseLost(str(conflict))
        except OscarZooError:
            pass   # unreachable, refused: the upload's own answer is all we know
        return conflict


TRY_LATER_RETRIES = 3   # as the registry client retries its reads (at most 3 times)


def _wait_or_raise(refusal: RemoteError, refused: int) -> float:
    """Seconds to wait before sending the request again after its `refused`-th TRY_LATER
    answer in a row: the Retry-After asked for, else a short backoff. Raises the refusal, saying
    when to try again, once it was refused TRY_LATER_RETRIES + 1 times or asks for longer than
    RETRY_AFTER_CAP (a command sitting that long looks hung)."""
    from .sources.download import asks_too_long, backoff, duration

    asked = getattr(refusal, "retry_after", None)
    if asks_too_long(asked):
        raise _later(refusal, f"the registry asked to wait {duration(asked)}: try again "
                              "then") from None
    if refused > TRY_LATER_RETRIES:
        waited = f", last asking to wait {duration(asked)}" if asked is not None else ""
        raise _later(refusal, f"refused {refused} times in a row{waited}: the registry is busy or "
                              "limiting requests, try again in a minute") from None
    return backoff(refused - 1, asked)


def _later(refusal: RemoteError, advice: str) -> RemoteError:
    """The refusal with what to do about it; status and retry_after kept (is_transient, the
    worker and pull decide by them)."""
    err = RemoteError(f"{refusal}; {advice}")
    err.status = getattr(refusal, "status", None)
    err.retry_after = getattr(refusal, "retry_after", None)
    return err


def _id(job_id: str) -> str:
    """A typed job id as one path segment: `../models/x` must not reach another endpoint."""
    return quote(str(job_id).strip(), safe="")


def _clean(text: str | None) -> str | None:
    """Error text as the registry stores it: no NUL characters, the last 20,000 characters."""
    return None if text is None else text.replace("\x00", "")[-20000:]


def parse_sse(lines: Iterator[str]) -> Iterator[dict]:
    """`data:` payloads of `event: job` messages (comments and other events are skipped)."""
    event, data = None, []
    for line in lines:
        if line == "":
            if event in (None, "job") and data:
                yield json.loads("\n".join(data))
            event, data = None, []
        elif line.startswith(":"):
            continue
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())
