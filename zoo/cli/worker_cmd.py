"""`oscar-zoo worker`: run calibration jobs from a registry, on this host or through Ray.

    OSCAR_ZOO_TOKEN=ozk_... oscar-zoo worker --registry http://registry:8000
    oscar-zoo worker --registry URL --executor ray --ray-address 10.0.0.1:6379

The token needs scope jobs:work (`oscar-zoo tokens create --scope jobs:work`, on the registry's
host). `serve` starts workers itself unless told not to (--no-workers); this command is for other
hosts. It says on stderr, once, where it waits and as whom: a worker with an empty queue is
otherwise silent until a job comes.
"""

from __future__ import annotations

import logging

import click

from .. import settings
from .output import info, plural


@click.command("worker")
@click.option("--registry", "registry", envvar="OSCAR_ZOO_ENDPOINT", required=True,
              help="Registry base URL [env OSCAR_ZOO_ENDPOINT].")
@click.option("--gpus", type=click.IntRange(0, 1024),
              help="GPUs this worker may use: the first N visible ones, which are all its jobs "
              "see [default: every visible one; 0 = CPU].")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: run jobs here, one at a time; ray: hand each job to a Ray cluster.")
@click.option("--ray-address", help="Ray cluster address for --executor ray "
              "[env OSCAR_ZOO_RAY_ADDRESS].")
@click.option("--worker-id", help="Name in job leases [default: host:pid:random].")
@click.option("--exit-with-parent", is_flag=True, hidden=True,
              help="Exit (after the current job) when the process that started this one is gone.")
@click.option("--once", is_flag=True, help="Wait for one job, run it, then exit.")
def worker_command(registry, gpus, executor, ray_address, worker_id, exit_with_parent, once):
    """Claim calibration jobs from the registry at --registry and run them until stopped (Ctrl-C
    gives the current job back to the queue).

    Needs a token with scope jobs:work: OSCAR_ZOO_TOKEN, or the one `oscar-zoo login` stored
    (the registry's admin makes one with `oscar-zoo tokens create --scope jobs:work`)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)   # one line per request otherwise
    token = settings.get("token")
    if executor == "ray":
        import threading

        # The dispatcher runs many jobs at once and Ray places them on the cluster's GPUs:
        # these options of the local worker mean nothing to it, and must not be ignored silently.
        for given, option, why in ((once, "--once", "it runs jobs until stopped"),
                                   (gpus is not None, "--gpus", "Ray places each job on the "
                                    "cluster's GPUs (a job's `gpus`, `ray_resources`)")):
            if given:
                raise click.UsageError(f"{option} is for the local executor; --executor ray does "
                                       f"not take it ({why})")

        from ...calibrate.executors.ray_executor import dispatch
        from ...calibrate.executors.worker import install_stop_signals
        from ..jobs_client import JobsClient

        stop = threading.Event()
        install_stop_signals(stop)
        address = ray_address or settings.get("ray_address")
        if address:     # without one, dispatch refuses to start: nothing to announce
            info(f"oscar-zoo worker: waiting for jobs at {settings.redact_url(registry)}, to run "
                 f"on the Ray cluster at {address}")
        with JobsClient(registry, token) as client:
            dispatch(client, address, stop, worker_id, exit_with_parent)
        return
    from ...calibrate.executors.worker import main_loop, new_worker_id, runner_devices

    runner_devices(gpus)    # a --gpus this host cannot give is refused before the line below
    worker_id = worker_id or new_worker_id()
    info(f"oscar-zoo worker: waiting for {'one job' if once else 'jobs'} at "
         f"{settings.redact_url(registry)} as worker {worker_id}, {_gpus_shown(gpus)}")
    main_loop(registry, token, gpus, worker_id, exit_with_parent, once)


def _gpus_shown(gpus: int | None) -> str:
    """with 2 GPUs (--gpus 2), with every visible GPU (4), on the CPU (no GPU visible)."""
    from ...calibrate.executors.worker import visible_gpus

    if gpus == 0:
        return "on the CPU (--gpus 0)"
    if gpus is not None:
        return f"with {plural(gpus, 'GPU')} (--gpus {gpus})"
    seen = len(visible_gpus())
    return f"with every visible GPU ({seen})" if seen else "on the CPU (no GPU visible)"


def register(cli: click.Group) -> None:
    cli.add_command(worker_command)
