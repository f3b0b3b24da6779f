"""Where calibration jobs run. Nothing here imports torch: the GPU work happens in a child
process (calibrate/runner.py) that each attempt starts in its own process group.

    worker.py        the worker: claim over HTTP, then per job an Attempt = runner child +
                     heartbeat thread + progress forwarding + publish; `oscar-zoo worker`
    local.py         LocalExecutor: worker processes beside `oscar-zoo serve` (one per GPU
                     group, one on the CPU without GPUs), restarted when they die
    ray_executor.py  RayExecutor / dispatch loop: claims jobs and runs each as a Ray task that
                     asks for the job's GPUs; the task runs the same Attempt

The registry (registry_db/jobs.py) owns job state; executors only ever talk HTTP to it.
"""
