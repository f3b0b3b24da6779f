"""Rotations fitted on a host thread while the GPU is still running the passes.

LAPACK's eigh of one small matrix is latency-bound host work (~0.35 ms at d = 64 on an H100
host), so a 10-layer model's two sides cost ~7 ms of eigh alone, and a whole forward of a small
model over 32K tokens on an H100 is only ~24 ms. Each layer's statistic becomes final at a known
moment: the keys' (from C) when pass 1 ends, the values' (S_v) once pass 2's last forward has
passed that layer. It is then copied to the host without stalling the GPU stream, and one worker
thread fits it while the GPU runs the remaining layers. What is left to wait for at the end is
the last layer's fit.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from . import fit


class Fitter:
    """submit(layers, side, covs) as soon as statistics are final; result(layer, side) waits."""

    def __init__(self, composition: str, per_head: bool):
        self.composition, self.per_head = composition, per_head
        self.busy_s = 0.0          # host time spent fitting, hidden or not
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="oscar-fit")
        self._jobs: dict[tuple[int, str], tuple[Future, int]] = {}

    def submit(self, layers: list[int], side: str, covs: torch.Tensor) -> None:
        """covs: [len(layers), H, d, d] per KV head, on one device; they must not change
        afterwards. Layers submitted together share one batched eigh."""
        host, ready = _to_host(covs)
        job = self._pool.submit(self._fit, host, ready)
        for i, layer in enumerate(layers):
            self._add(layer, side, job, i)

    def fixed(self, layer: int, side: str, rot: torch.Tensor, eig: torch.Tensor) -> None:
        done: Future = Future()
        done.set_result((rot.float()[None], eig.float()[None]))
        self._add(layer, side, done, 0)

    def result(self, layer: int, side: str) -> tuple[torch.Tensor, torch.Tensor]:
        job, i = self._jobs[(layer, side)]
        rot, eig = job.result()
        return rot[i], eig[i]

    def _add(self, layer: int, side: str, job: Future, index: int) -> None:
        if (layer, side) in self._jobs:     # a statistic submitted twice was not final the first time
            job.cancel()
            raise RuntimeError(f"the {side} statistic of layer {layer} was submitted twice")
        self._jobs[(layer, side)] = (job, index)

    def _fit(self, covs: torch.Tensor, ready) -> tuple[torch.Tensor, torch.Tensor]:
        if ready is not None:
            ready.synchronize()                       # the copy has landed (releases the GIL)
        t = time.perf_counter()
        rot, eig = fit.fit_side(covs, self.composition, self.per_head)
        self.busy_s += time.perf_counter() - t
        return rot.float(), eig.float()

    def __enter__(self) -> "Fitter":
        return self

    def __exit__(self, *exc) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _to_host(x: torch.Tensor):
    # A blocking .cpu() would wait for every kernel queued so far, the rest of the forward too.
    if x.device.type != "cuda":
        return x.clone(), None
    host = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
    host.copy_(x, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record(torch.cuda.current_stream(x.device))
    return host, ready
