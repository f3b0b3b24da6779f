"""The `ray` executor: calibration jobs as Ray tasks on an existing Ray cluster.

Ray places the work; the registry stays the system of record (anchors A7, synthesis 6: Ray is
an executor, not the queue). A dispatcher (`oscar-zoo worker --executor ray --ray-address
ADDR`, which `serve` starts when OSCAR_ZOO_EXECUTOR=ray) claims jobs over HTTP like any worker
and submits each as a task asking for the job's GPUs (`num_gpus=spec.gpus`: 1 for an 8B model,
8 for GLM-4.7-FP8; none on a cluster without GPUs) and its custom `ray_resources`.

- While a task waits for resources, the dispatcher heartbeats its lease.
- The task attaches to the lease, which gives it a token of its own, and runs the same Attempt
  as a local worker (runner child in its own process group, heartbeats, progress, publish),
  reporting to the registry itself with that token. The dispatcher keeps the claim's token for
  its own calls (heartbeats, a force-cancel, an unplaceable or refused task, giving jobs back).
- A task Ray can never place (its demand fits no alive node's total resources: Ray calls it
  infeasible and leaves it pending forever) is noted in the job's `waiting`; past
  OSCAR_ZOO_RAY_INFEASIBLE_SECONDS (time for an autoscaler to add a node) it is cancelled and
  its job failed, naming the demand and what the nodes have, so that it neither shows
  `running` forever nor holds a dispatcher slot every other job waits for.
- A task whose worker process or node dies is retried by Ray (`max_retries`); the retry
  attaches again, which counts an attempt and replaces the task token: a first process that
  was in fact alive (a partition) gets LeaseLost on its next call and stops its runner. The
  registry's job-level guard (one version per job) keeps a retry from publishing twice.
- Cancel: the task's own Attempt stops its runner; if the task is still running two grace
  periods later, the dispatcher force-cancels it (`ray.cancel(force=True)`), keeps the lease
  until Ray says the task has ended (its GPU free), then reports the job cancelled.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from oscar_zoo.zoo import settings
from oscar_zoo.zoo.errors import (ConfigError, LeaseLost, OfflineError, OscarZooError, RemoteError,
                                  public_line)
from oscar_zoo.zoo.jobs_client import JobsClient

from .worker import CLAIM_WAIT_S, POLL_S, Attempt, new_worker_id, sweep_workdirs

log = logging.getLogger("oscar_zoo.ray")


ATTACH_PATIENCE_S = 120.0   # a task retries its attach this long through registry blips
PLACEMENT_CHECK_S = 5.0     # how often the dispatcher compares its tasks' demands with the nodes
GIVE_BACK_S = 20.0          # a stopping dispatcher waits this long for its tasks to end; serve
                            # kills it 10 s later, time enough to release their leases


def run_task(url: str, token: str, job_id: str, lease: str, dispatcher: str | None = None) -> str:
    """The Ray task: attach to the lease (`lease`: the dispatcher's claim token) and run the
    attempt with the task's own token. Returns its outcome. dispatcher: the name of the
    dispatcher that submitted it, the prefix of the task's own (see task_prefix)."""
    import ray

    ctx = ray.get_runtime_context()
    # One name per run of the task: attach is idempotent for it (a retried attach is the same
    # attempt), so Ray's retry, even in a process that reuses a pid, must have another.
    worker = (f"{task_prefix(dispatcher)}{socket.gethostname()}:{os.getpid()}:"
              f"{ctx.get_node_id()[:12]}:{secrets.token_hex(3)}")
    # Ray sets OMP_NUM_THREADS=1 in its workers (the task asks for num_cpus=1); the runner
    # (which inherits this process's environment) would run its CPU parts on one thread.
    task_gpus = float(ctx.get_assigned_resources().get("GPU", 0))
    node_gpus = _node_gpus(ctx.get_node_id()) if task_gpus else 0.0
    threads = _runner_threads(_host_cpus(), task_gpus, node_gpus)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    sweep_workdirs()     # those of earlier tasks whose process Ray or the OOM killer killed
    with JobsClient(url, token) as client:
        try:
            job = _attach(client, job_id, lease, worker)
        except LeaseLost as e:
            return f"lost: {e}"
        info = {"ray_node_id": ctx.get_node_id(), "ray_resources": ctx.get_assigned_resources(),
                "cpu_threads": threads}
        return Attempt(client, job, job["lease"], worker, threading.Event(), info).run()


def task_prefix(dispatcher: str | None) -> str:
    """How the names of a dispatcher's tasks begin (first, so that the lease holder's 200
    characters keep it). A task that attached holds the job's lease in its own name; `serve`,
    whose HTTP server is closed by the time it stops its dispatcher (whose releases then find
    no server), finds the jobs to give back by it (api/jobs_runtime.py)."""
    return f"ray-task[{dispatcher}]:" if dispatcher else "ray-task:"


def _runner_threads(host_cpus: int, task_gpus: float, node_gpus: float) -> int:
    """The runner's CPU threads: the host's CPUs, in proportion to the node's GPUs the task
    holds, so that eight 1-GPU jobs on an 8-GPU host get an eighth each rather than all of
    them eight times over."""
    if 0 < task_gpus < node_gpus:
        return max(1, int(host_cpus * task_gpus / node_gpus))
    return host_cpus


def _node_gpus(node_id: str) -> float:
    import ray

    try:
        return float(next(n["Resources"].get("GPU", 0) for n in ray.nodes()
                          if n.get("NodeID") == node_id))
    except Exception as e:  # noqa: BLE001 - the GCS unreachable, the node gone: all the CPUs
        log.warning("ray task: cannot read this node's GPU count (%s)", e)
        return 0.0


def _host_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _attach(client: JobsClient, job_id: str, lease: str, worker: str,
            patience: float | None = None) -> dict:
    """attach, retried through registry blips (the dispatcher keeps the lease alive meanwhile)
    for `patience` seconds; LeaseLost and anything else are raised at once."""
    deadline = time.monotonic() + (ATTACH_PATIENCE_S if patience is None else patience)
    delay = 1.0
    while True:
        try:
            return client.attach(job_id, lease, worker)
        except (OfflineError, RemoteError) as e:
            if time.monotonic() + delay > deadline:
                raise
            log.warning("ray task: job %s: cannot attach (%s); retrying", job_id, e)
            time.sleep(delay)
            delay = min(delay * 2, 10.0)


@dataclass
class Flight:
    job_id: str
    lease: str                         # the claim's token: the dispatcher's own, never its task's
    lease_s: float
    next_beat: float
    cancel_since: float | None = None
    forced_at: float | None = None     # ray.cancel(force=True) sent; reported once it lands
    lost_at: float | None = None       # our heartbeat found the job ended: waiting for the task
    demand: dict = field(default_factory=dict)   # what its task asks Ray for
    unplaceable_since: float | None = None        # no alive node has all of `demand`


def dispatch(client: JobsClient, address: str | None, stop: threading.Event,
             worker: str | None = None, exit_with_parent: bool = False) -> None:
    """Claim jobs and run them as Ray tasks until `stop` is set (or, with exit_with_parent,
    the process that started this one is gone); then give the jobs in flight back."""
    import ray

    if not address:
        raise ConfigError("the ray executor needs a cluster: --ray-address or OSCAR_ZOO_RAY_ADDRESS "
                          "(e.g. 127.0.0.1:6379)")
    parent = os.getppid()
    _warn_if_loopback(client.endpoint)
    handlers = _signal_handlers()
    ray.init(address=address, namespace="oscar-zoo", log_to_driver=False,
             logging_level=logging.WARNING)
    _restore_signal_handlers(handlers)   # ray.init replaces SIGTERM's: keep the graceful stop
    worker = worker if (worker or "").startswith("dispatch:") else new_worker_id("dispatch")
    task = ray.remote(run_task)
    flights: dict = {}
    grace = float(settings.get("job_cancel_grace_seconds"))
    infeasible_s = float(settings.get("ray_infeasible_seconds"))
    next_check = 0.0
    try:
        while not stop.is_set():
            if exit_with_parent and os.getppid() != parent:
                log.warning("ray dispatcher: parent process exited; stopping")
                break
            gpus = int(ray.cluster_resources().get("GPU", 0))
            if _room(flights, gpus):
                # Idle: a long poll (a job starts at once, an idle dispatcher asks rarely; with
                # exit_with_parent a short one, so a dead parent is noticed).
                wait = 0 if flights else (min(CLAIM_WAIT_S, 5.0) if exit_with_parent
                                          else CLAIM_WAIT_S)
                _claim_one(client, worker, task, flights, gpus, wait=wait)
            for ref, f in list(flights.items()):
                if time.monotonic() >= f.next_beat and not _beat(client, ref, f, flights, grace,
                                                                 worker):
                    ray.cancel(ref, force=True)
            if flights and time.monotonic() >= next_check:
                next_check = time.monotonic() + PLACEMENT_CHECK_S
                _check_placement(client, flights, infeasible_s)
            if flights:
                ready, _ = ray.wait(list(flights), num_returns=len(flights), timeout=0)
                for ref in ready:
                    _landed(client, ref, flights.pop(ref))
                stop.wait(POLL_S)
    finally:
        _give_back(client, flights)


def _room(flights: dict, cluster_gpus: int) -> bool:
    """Whether to claim another job: up to OSCAR_ZOO_WORKERS jobs in flight when that is set;
    else, on a cluster with GPUs, until their tasks ask for all of them (one 8-GPU job fills
    an 8-GPU cluster: a job claimed behind it would only wait in Ray's queue, shown `running`,
    where another worker could have run it); without GPUs, one job at a time. A task no node
    can place holds no GPU: it does not count, so it holds back no job behind it."""
    workers = settings.get("workers")
    if workers:
        return len(flights) < workers
    if not cluster_gpus:
        return not flights
    asked = sum(f.demand.get("GPU", 0) for f in flights.values() if f.unplaceable_since is None)
    return asked < cluster_gpus and len(flights) < cluster_gpus


def _signal_handlers() -> dict:
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}


def _restore_signal_handlers(handlers: dict) -> None:
    for sig, handler in handlers.items():
        if handler is not None and signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)


def _give_back(client, flights: dict, timeout: float = GIVE_BACK_S) -> None:
    """Stopping: end each task in flight (Ray would end them with this driver anyway), wait
    until Ray says it is gone (its GPU free), then release its lease: the job is requeued
    without spending an attempt, as a local worker does on Ctrl-C."""
    import ray

    if not flights:
        return
    for ref in flights:
        try:
            ray.cancel(ref, force=True)
        except Exception as e:  # noqa: BLE001 - already ended, Ray going away: release anyway
            log.warning("ray dispatcher: cannot cancel a task: %s", e)
    try:
        ray.wait(list(flights), num_returns=len(flights), timeout=timeout)
    except Exception as e:  # noqa: BLE001
        log.warning("ray dispatcher: cannot wait for the cancelled tasks: %s", e)
    for ref, f in list(flights.items()):
        try:
            client.release(f.job_id, f.lease)
            log.info("ray dispatcher: job %s given back to the queue", f.job_id)
        except (LeaseLost, OfflineError, RemoteError) as e:
            log.warning("ray dispatcher: job %s not given back (%s)", f.job_id, e)
        flights.pop(ref, None)


def _warn_if_loopback(url: str) -> None:
    from urllib.parse import urlsplit

    host = (urlsplit(url).hostname or "").lower()
    if host == "localhost" or host.startswith("127.") or host == "::1":
        log.warning("ray dispatcher: Ray tasks get the registry URL %s, which only the head "
                    "node can reach; tasks on other nodes fail to attach. Set "
                    "OSCAR_ZOO_PUBLIC_URL (serve) or pass --registry with an address the "
                    "cluster's nodes can reach.", url)


def _claim_one(client, worker, task, flights, cluster_gpus: int, wait: float) -> None:
    try:
        claimed = client.claim(worker, None, ray=True, wait=wait)
    except (OfflineError, RemoteError) as e:
        log.warning("ray dispatcher: cannot claim (%s)", e)
        time.sleep(POLL_S)
        return
    if claimed is None:
        return
    job, lease = claimed["job"], claimed["lease"]
    spec = job["spec"]
    gpus = job["gpus"] if cluster_gpus else 0      # a CPU-only cluster runs everything on CPU
    # what task.options() below asks for, all of it on one node: checked against the nodes
    demand = {"CPU": 1, **({"GPU": gpus} if gpus else {}), **(spec.get("ray_resources") or {})}
    lease_s = float(lease["seconds"])
    try:
        ref = task.options(num_cpus=1, num_gpus=gpus, resources=spec.get("ray_resources") or None,
                           max_retries=job["max_attempts"], retry_exceptions=False,
                           name=f"oscar-zoo-job-{job['id'][:8]}").remote(
            client.endpoint, client.registry.token, job["id"], lease["token"], worker)
    except Exception as e:  # noqa: BLE001 - one job Ray refuses must not end the dispatcher
        # (and with it every task it drives), then come back to do it again after a requeue
        log.error("ray dispatcher: Ray refused job %s: %s", job["id"], e)
        _report(client, Flight(job["id"], lease["token"], lease_s, 0.0),
                f"Ray refused the task: {type(e).__name__}: {str(e)[:2000]}; fix the job's "
                "gpus or ray_resources and submit it again")
        return
    flights[ref] = f = Flight(job["id"], lease["token"], lease_s, time.monotonic() + lease_s / 3,
                              demand=demand)
    _note(client, f)
    log.info("ray dispatcher: job %s submitted (%d GPU)", job["id"], gpus)


def _note(client, f: Flight, unplaceable: str | None = None) -> None:
    """What the job waits for, as its progress (and, `unplaceable`, as its `waiting`): only
    while no task has attached, which the registry enforces (once one has, progress is the
    task's alone), so a task that attached meanwhile keeps its own."""
    try:
        client.progress(f.job_id, f.lease, "queued", {
            "waiting_for": f"Ray: {_describe(f.demand)}",
            **({"unplaceable": unplaceable} if unplaceable else {})})
    except LeaseLost:            # its task attached, or the job ended: nothing to note
        pass
    except OscarZooError as e:   # a note only: the job's own state is the heartbeat's business
        log.warning("ray dispatcher: job %s: cannot note what it waits for (%s)", f.job_id, e)


def _describe(resources: dict) -> str:
    return ", ".join(f"{k}={v:g}" for k, v in resources.items())


def _check_placement(client, flights: dict, limit: float) -> None:
    """Tasks Ray can never place (no alive node's total resources fit their demand) are left
    pending by Ray, their jobs `running` and, at the dispatcher's cap, every other job behind
    them. Noted at once; failed once that lasted `limit` seconds (an autoscaler's time to add
    a node)."""
    nodes = _node_totals()
    if not nodes:
        return                              # cannot tell now: no verdict
    now = time.monotonic()
    for ref, f in list(flights.items()):
        if f.cancel_since is not None or f.lost_at is not None:
            continue                        # ending already, by its own path
        if _fits(f.demand, nodes):
            if f.unplaceable_since is not None:     # a node that has it joined
                f.unplaceable_since = None
                _note(client, f)
        elif f.unplaceable_since is None:
            f.unplaceable_since = now
            why = _unplaceable(f.demand, nodes, f" (the job fails unless one joins within "
                                                f"{limit:g} s, OSCAR_ZOO_RAY_INFEASIBLE_SECONDS)")
            log.warning("ray dispatcher: job %s: %s", f.job_id, why)
            _note(client, f, why)
        elif now - f.unplaceable_since >= limit:
            flights.pop(ref)
            _give_up(client, ref, f, _unplaceable(f.demand, nodes, f" (for "
                                                  f"{now - f.unplaceable_since:.0f} s)"))


def _node_totals() -> list[dict]:
    """Each alive node's total resources (what it has, busy or not); [] when Ray cannot say."""
    import ray

    try:
        return [n.get("Resources") or {} for n in ray.nodes() if n.get("Alive")]
    except Exception as e:  # noqa: BLE001 - the GCS busy or restarting: ask again next round
        log.warning("ray dispatcher: cannot list the cluster's nodes (%s)", e)
        return []


def _fits(demand: dict, nodes: list[dict]) -> bool:
    return any(all(node.get(k, 0) >= v for k, v in demand.items()) for node in nodes)


def _unplaceable(demand: dict, nodes: list[dict], when: str) -> str:
    """Why no node fits `demand`, since `when`, with the most any node has of each resource
    asked for, and what to do."""
    most = {k: max(node.get(k, 0) for node in nodes) for k in demand}
    spread = all(most[k] >= v for k, v in demand.items())   # each somewhere, never all on one
    custom = {k: v for k, v in demand.items() if k not in ("CPU", "GPU")}
    flags = "".join([f" --num-gpus {demand['GPU']:g}" if "GPU" in demand else "",
                     f" --resources '{json.dumps(custom)}'" if custom else ""])
    return (f"Ray cannot place the task: it asks for {_describe(demand)} on one node, and no "
            f"alive node of the cluster {'has all of that' if spread else 'has that much'}{when}; "
            f"the most any node has: {_describe(most)}. Add a node that has it (`ray start "
            f"--address HEAD:PORT{flags}`), or fix the job's gpus or ray_resources and submit "
            "it again")


def _give_up(client, ref, f: Flight, why: str) -> None:
    """Cancel a task that never started (it holds no GPU: nothing to wait for) and fail its
    job for good: retried, it would wait for the same resources again."""
    import ray

    try:
        ray.cancel(ref, force=True)
    except Exception as e:  # noqa: BLE001 - it ended meanwhile: the job is failed all the same
        log.warning("ray dispatcher: cannot cancel job %s's task: %s", f.job_id, e)
    log.error("ray dispatcher: job %s failed: %s", f.job_id, why)
    _report(client, f, why)


def _beat(client, ref, f: Flight, flights, grace: float, worker: str | None = None) -> bool:
    """Heartbeat the lease of a task in flight; False when the task should be force-cancelled.
    worker: the dispatcher's name, sent along so that it counts as seen while at its cap."""
    f.next_beat = time.monotonic() + f.lease_s / 3
    if f.lost_at is not None:        # the job ended without us: give its task time to land
        if time.monotonic() - f.lost_at > 2 * grace:
            log.warning("ray dispatcher: job %s ended but its task has not; force-cancelling it",
                        f.job_id)
            flights.pop(ref, None)
            return False
        return True
    try:
        state = client.heartbeat(f.job_id, f.lease, worker=worker)
    except LeaseLost:
        return _lease_lost(client, ref, f, flights)
    except (OfflineError, RemoteError):
        return True
    if state.get("cancel_requested"):
        f.cancel_since = f.cancel_since or time.monotonic()
        if f.forced_at is not None:
            if time.monotonic() - f.forced_at > 2 * grace:   # Ray never confirmed: report anyway
                flights.pop(ref, None)
                _report(client, f, FORCED + " (Ray did not confirm the task ended)", cancelled=True)
            return True
        if time.monotonic() - f.cancel_since > 2 * grace:
            f.forced_at = time.monotonic()   # reported when the task lands: the lease (and the
            return False                     # GPU's next job) must wait until it is gone
    return True


def _lease_lost(client, ref, f: Flight, flights) -> bool:
    """Our lease is gone. The task itself ended the job (completed, failed, cancelled; it may
    still be cleaning up its work dir): let it land. The job was requeued or is held by
    another lease: this task has no business any more, force-cancel it."""
    try:
        status = client.get(f.job_id)["status"]
    except Exception as e:  # noqa: BLE001 - cannot tell: wait for the task, bounded
        log.warning("ray dispatcher: job %s: lease lost, status unknown (%s)", f.job_id, e)
        status = None
    if status in ("queued", "running"):
        flights.pop(ref, None)
        return False
    f.lost_at = time.monotonic()
    return True


FORCED = "cancelled: the Ray task did not stop; force-cancelled"


def _landed(client, ref, f: Flight) -> None:
    import ray

    error = None
    try:
        outcome = ray.get(ref)
        log.info("ray dispatcher: job %s task ended: %s", f.job_id, outcome)
    except Exception as e:  # noqa: BLE001 - Ray gave up (retries spent, node lost, ...)
        # str() of a RayTaskError is the remote traceback (pid, node ip, the worker's paths):
        # the log has it; the job's error, which anyone may read, gets the cause's first line
        log.warning("ray dispatcher: job %s task failed: %s", f.job_id, e)
        cause = getattr(e, "cause", None) or e
        error = public_line(f"the Ray task failed: {type(cause).__name__}: {cause}")
    if f.forced_at is not None:     # a task that reported itself leaves this a LeaseLost
        _report(client, f, FORCED, cancelled=True)
    elif error and f.lost_at is None:
        # A registry blip in the task's attach, a Ray system error, a node lost: retryable
        # (the job's attempts bound the retries; a job that ended already answers LeaseLost).
        _report(client, f, error, retryable=True)


def _report(client, f: Flight, error: str, retryable: bool = False, cancelled: bool = False) -> None:
    try:
        client.fail(f.job_id, f.lease, error, retryable=retryable, cancelled=cancelled)
    except (LeaseLost, OfflineError, RemoteError):
        pass   # the task reported first, or the sweeper will


def check_address(address: str | None) -> None:
    """`serve` calls this before it starts (a clean error, not a traceback from the app's
    startup), the executor again for any other caller."""
    if not address:
        raise ConfigError("OSCAR_ZOO_EXECUTOR=ray needs OSCAR_ZOO_RAY_ADDRESS "
                          "(or `oscar-zoo serve --ray-address HOST:PORT`)")


class RayExecutor:
    """For `serve`: one dispatcher process (restarted if it dies), like LocalExecutor's workers."""

    def __init__(self, url: str, token: str, address: str | None):
        check_address(address)
        # Ray tasks run on any node: they need an address of this server that every node
        # reaches (serve's own is loopback; dispatch() warns when it hands out one).
        self.url = (settings.get("public_url") or url).rstrip("/")
        self.token, self.address = token, address
        self.worker_id = ""     # the dispatcher's name in leases, its tasks' prefix
        self.proc: subprocess.Popen | None = None
        self.stopping = threading.Event()
        self.monitor: threading.Thread | None = None

    def _spawn(self) -> None:
        # Named here, so that stop() can say whose jobs to give back: the server's sockets are
        # closed by then, and the dispatcher's own releases find no server.
        self.worker_id = (f"dispatch:{socket.gethostname()}:serve{os.getpid()}:"
                          f"{secrets.token_hex(3)}")
        cmd = [sys.executable, "-P", "-m", "oscar_zoo.zoo.cli.main", "worker", "--registry",
               self.url, "--executor", "ray", "--ray-address", self.address,
               "--worker-id", self.worker_id,
               "--exit-with-parent"]    # a SIGKILLed serve must not leave it running
        self.proc = subprocess.Popen(cmd, env={**os.environ, "OSCAR_ZOO_TOKEN": self.token},
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def start(self) -> None:
        self._spawn()
        self.monitor = threading.Thread(target=self._watch, daemon=True, name="ray-executor")
        self.monitor.start()

    def _watch(self) -> None:
        while not self.stopping.wait(5.0):
            if self.proc.poll() is not None and not self.stopping.is_set():
                log.warning("ray executor: dispatcher exited (%s); starting another", self.proc.returncode)
                self._spawn()

    def stop(self) -> list[str]:
        """SIGTERM: the dispatcher ends its tasks (past GIVE_BACK_S + 10 s it is killed, and Ray
        ends them with it). Returns its name: the server releases the jobs it or its tasks
        still hold (requeued without spending an attempt), as the dispatcher's own release
        calls find the server's sockets closed when `serve` stops."""
        self.stopping.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(GIVE_BACK_S + 10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        return [self.worker_id] if self.worker_id else []
