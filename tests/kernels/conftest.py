"""Kernel tests run on the CPU through Triton's interpreter by default (CI has no GPU). On a GPU
machine, OSCAR_ZOO_TEST_DEVICE=cuda runs the very same tests on compiled kernels, and
OSCAR_ZOO_TEST_DEVICE=cpu,cuda runs each test on both in turn, in one process: interpreted and
compiled launches interleaved, as in a program that quantizes on both devices."""

from __future__ import annotations

import os

import torch

from oscar_zoo.kernels import _launch


def pytest_generate_tests(metafunc):
    if "device" in metafunc.fixturenames:
        names = [n.strip() for n in os.environ.get("OSCAR_ZOO_TEST_DEVICE", "cpu").split(",") if n.strip()]
        metafunc.parametrize("device", [torch.device(n) for n in names], ids=names)


def run_poisoned(fn):
    """Run `fn` twice, every kernel output / workspace buffer pre-filled with two different
    sentinels; the results must be identical (so every element was written) and are returned."""
    outs = []
    for mode in ("a", "b"):
        _launch.POISON = mode
        try:
            res = fn()
        finally:
            _launch.POISON = None
        outs.append(res if isinstance(res, tuple) else (res,))
    for x, y in zip(*outs):
        assert torch.equal(x.view(torch.uint8) if x.dtype == torch.uint8 else x, y), "unwritten output elements"
        if x.dtype.is_floating_point:
            assert torch.isfinite(x).all(), "non-finite output"
    return outs[0] if len(outs[0]) > 1 else outs[0][0]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit: torch.equal calls -0.0 and +0.0 equal, a stored scale/zero cannot."""
    ints = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    return a.dtype == b.dtype and torch.equal(a.view(ints[a.element_size()]), b.view(ints[b.element_size()]))


def signed_permutation(d: int, gen: torch.Generator) -> torch.Tensor:
    """An orthogonal matrix whose products are exact in any precision."""
    p = torch.zeros(d, d)
    p[torch.arange(d), torch.randperm(d, generator=gen)] = torch.randint(0, 2, (d,), generator=gen).float() * 2 - 1
    return p


def random_orthogonal(*shape: int, gen: torch.Generator) -> torch.Tensor:
    return torch.linalg.qr(torch.randn(*shape, generator=gen, dtype=torch.float64))[0].float()
