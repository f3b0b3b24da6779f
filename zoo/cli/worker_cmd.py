"""`oscar-zoo worker`: run calibration jobs from a registry, on this host or through Ray.

    OSCAR_ZOO_TOKEN=ozk_... oscar-zoo worker --registry http://registry:8000
    oscar-zoo worker --registry URL --executor ray --ray-address 10.0.0.1:6379

The token needs scope jobs:work (`oscar-zoo tokens create --scope jobs:work`). `serve` starts
workers itself unless told not to (--no-workers); this command is for other hosts.
"""

from __future__ import annotations

import logging

import click

from .. import settings


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
@click.option("--once", is_flag=True, help="Run at most one job, then exit.")
def worker_command(registry, gpus, executor, ray_address, worker_id, exit_with_parent, once):
    """Claim calibration jobs from the registry at --registry and run them until stopped (Ctrl-C
    gives the current job back to the queue)."""
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
        with JobsClient(registry, token) as client:
            dispatch(client, ray_address or settings.get("ray_address"), stop, worker_id,
                     exit_with_parent)
        return
    from ...calibrate.executors.worker import main_loop

    main_loop(registry, token, gpus, worker_id, exit_with_parent, once)


def register(cli: click.Group) -> None:
    cli.add_command(worker_command)
