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
    """submit(layer, side, cov) as soon as a statistic is final; result(layer, side) waits."""

    def __init__(self, composition: str, per_head: bool):
        self.composition, self.per_head = composition, per_head
        self.busy_s = 0.0          # host time spent fitting, hidden or not
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="oscar-fit")
        self._jobs: dict[tuple[int, str], Future] = {}

    def submit(self, layer: int, side: str, cov: torch.Tensor) -> None:
        """cov: [H, d, d] per KV head, on the layer's device; it must not change afterwards."""
        host, ready = _to_host(cov)
        self._add(layer, side, self._pool.submit(self._fit, host, ready))

    def fixed(self, layer: int, side: str, rot: torch.Tensor, eig: torch.Tensor) -> None:
        done: Future = Future()
        done.set_result((rot.float(), eig.float()))
        self._add(layer, side, done)

    def _add(self, layer: int, side: str, job: Future) -> None:
        if (layer, side) in self._jobs:     # a statistic submitted twice was not final the first time
            job.cancel()
            raise RuntimeError(f"the {side} statistic of layer {layer} was submitted twice")
        self._jobs[(layer, side)] = job

    def result(self, layer: int, side: str) -> tuple[torch.Tensor, torch.Tensor]:
        return self._jobs[(layer, side)].result()

    def _fit(self, cov: torch.Tensor, ready) -> tuple[torch.Tensor, torch.Tensor]:
        if ready is not None:
            ready.synchronize()                       # the copy has landed (releases the GIL)
        t = time.perf_counter()
        rot, eig = fit.fit_side(cov, self.composition, self.per_head)
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
