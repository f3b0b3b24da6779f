"""Rotations fitted on a host thread while the GPU is still running the passes.

LAPACK's eigh of one small matrix is latency-bound host work (~0.35 ms at d = 64 on an H100
host), so a 10-layer model's two sides cost ~7 ms of eigh alone, and a whole forward of a small
model over 32K tokens on an H100 is only ~24 ms. Each layer's statistic becomes final at a known
moment: the keys' (from C) when pass 1 ends, the values' (S_v) once pass 2's last forward has
passed that layer. It is then copied to the host without stalling the GPU stream, and one worker
thread fits it while the GPU runs the remaining layers; the values' fits start once the host has
launched the whole forward (release()), so they do not take the GIL from the launching thread.
What is left to wait for at the end is the last layer's fit.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from functools import lru_cache

import torch

from . import fit


class Fitter:
    """submit(layers, side, covs) as soon as statistics are final; result(layer, side) waits."""

    def __init__(self, composition: str, per_head: bool):
        self.composition, self.per_head = composition, per_head
        self.busy_s = 0.0          # host time spent fitting, hidden or not
        self._pool = _worker()
        self._jobs: dict[tuple[int, str], tuple[Future, int]] = {}
        self._held: list = []
        self._started: list[Future] = []

    def submit(self, layers: list[int], side: str, covs: torch.Tensor, hold: bool = False) -> None:
        """covs: [len(layers), H, d, d] per KV head, on one device; they must not change
        afterwards. Layers submitted together share one batched eigh. The copy to the host is
        queued on the GPU stream now; with hold=True the fit starts only at release()."""
        job: Future = Future()
        self._register(layers, side, job)
        host, ready = _to_host(covs)
        self._held.append((job, host, ready))
        if not hold:
            self.release()

    def release(self) -> None:
        """Start the held fits. While the main thread is still launching a forward, a fit on the
        worker would compete with it for the GIL (every small torch op takes it) and slow the
        launches down; once the host waits for the GPU, the GIL is free."""
        for job, host, ready in self._held:
            self._started.append(self._pool.submit(self._fit_into, job, host, ready))
        self._held.clear()

    def fixed(self, layer: int, side: str, rot: torch.Tensor, eig: torch.Tensor) -> None:
        done: Future = Future()
        done.set_result((rot.float()[None], eig.float()[None]))
        self._register([layer], side, done)

    def _register(self, layers: list[int], side: str, job: Future) -> None:
        taken = [layer for layer in layers if (layer, side) in self._jobs]
        if taken:           # a statistic submitted twice was not final the first time
            raise RuntimeError(f"the {side} statistic of layers {taken} was submitted twice")
        for i, layer in enumerate(layers):
            self._jobs[(layer, side)] = (job, i)

    def result(self, layer: int, side: str) -> tuple[torch.Tensor, torch.Tensor]:
        job, i = self._jobs[(layer, side)]
        rot, eig = job.result()
        return rot[i], eig[i]

    def _fit_into(self, job: Future, covs: torch.Tensor, ready) -> None:
        if not job.set_running_or_notify_cancel():
            return
        try:
            if ready is not None:
                ready.synchronize()                   # the copy has landed (releases the GIL)
            t = time.perf_counter()
            rot, eig = fit.fit_side(covs, self.composition, self.per_head)
            self.busy_s += time.perf_counter() - t
            job.set_result((rot.float(), eig.float()))
        except BaseException as e:                   # reaches whoever waits on result()
            job.set_exception(e)

    def __enter__(self) -> "Fitter":
        return self

    def __exit__(self, *exc) -> None:
        for job, _, _ in self._held:
            job.cancel()
        for started in self._started:     # nothing of this calibration runs on after it
            started.cancel()
        wait(self._started)


@lru_cache(maxsize=1)
def _worker() -> ThreadPoolExecutor:
    # One thread for the whole process: a new thread per calibration would also build a new
    # OpenMP team inside LAPACK on its first eigh (16 threads on the H100 host).
    return ThreadPoolExecutor(1, thread_name_prefix="oscar-fit")


def _to_host(x: torch.Tensor):
    # A blocking .cpu() would wait for every kernel queued so far, the rest of the forward too.
    if x.device.type != "cuda":
        return x.clone(), None
    host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
    host.copy_(x, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record(torch.cuda.current_stream(x.device))
    return host, ready
