"""Lloyd-Max buckets (kernels/lloyd_max.py, oscar-spec 5) against the float64 reference and
against what the spec says they are: N(0, 1)'s 4-level Lloyd-Max boundaries, levels
mu + {-1.751, -0.584, 0.584, 1.751} sigma, and the uniform kernel's storage format."""

from __future__ import annotations

import math

import pytest
import torch

from oscar_zoo.kernels import (dequantize_kv, fake_quantize_kv_lloyd_max, quantize_kv_lloyd_max,
                               ref_quantize_lloyd_max)
from oscar_zoo.kernels.reference import kernel_rotated, unpack_codes
from oscar_zoo.zoo.errors import InvalidInput

from .conftest import random_orthogonal

SCALE_TOL = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}


def _rows(gen, t=300, h=2, d=64):
    # gaussian rows of varied scale and offset, a few outliers for the clip to take
    x = torch.randn(t, h, d, generator=gen) * (0.2 + 3 * torch.rand(t, h, 1, generator=gen))
    x += torch.randn(t, h, 1, generator=gen)
    x.view(-1)[torch.randint(0, x.numel(), (t,), generator=gen)] *= 8
    return x


@pytest.mark.parametrize("sdt", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("centered", [False, True])
def test_buckets_match_the_float64_reference_but_at_float32_ties(device, sdt, centered):
    g = torch.Generator().manual_seed(11 + int(centered))
    x = _rows(g)
    h, d = x.shape[1], x.shape[2]
    rot = random_orthogonal(h, d, d, gen=g)
    mean = torch.randn(h, d, generator=g) if centered else None
    clip = torch.tensor([0.9, 0.96])
    packed, sz = quantize_kv_lloyd_max(x.to(device), rot.to(device), clip, d, sdt,
                                       mean=None if mean is None else mean.to(device))
    codes, z, scale, zero = ref_quantize_lloyd_max(kernel_rotated(x, rot, mean), clip, sdt)
    got = unpack_codes(packed.cpu())
    off = got != codes
    near = (z.abs() - torch.tensor(0.981065)).abs().minimum(z.abs()) < 1e-5   # at a boundary
    assert not (off & ~near).any(), "a code differs away from a bucket boundary"
    assert off.float().mean() < 1e-3
    assert sz.shape == (*x.shape[:2], 2) and sz.dtype == sdt
    tol = SCALE_TOL[sdt]
    torch.testing.assert_close(sz[..., 0].cpu().double(), scale.double(), rtol=tol, atol=0)
    torch.testing.assert_close(sz[..., 1].cpu().double(), zero.double(), rtol=tol, atol=tol)


def test_the_levels_are_the_specs_and_the_format_is_the_uniform_kernels(device):
    """Each row dequantizes to mu + {-1.751, -0.584, 0.584, 1.751} sigma of its clamped values,
    through the uniform dequantize kernel: the stored format is unchanged."""
    g = torch.Generator().manual_seed(3)
    x = _rows(g, t=64, h=2, d=128).to(device)
    packed, sz = quantize_kv_lloyd_max(x, None, 0.96, None)
    hat = dequantize_kv(packed, sz, None)
    assert torch.equal(hat, fake_quantize_kv_lloyd_max(x, None, 0.96, None))
    xr = x.cpu().double()
    thr = xr.abs().sort(-1).values[..., int(0.96 * 128)][..., None]
    xc = xr.clamp(-thr, thr)
    mu, sigma = xc.mean(-1, keepdim=True), xc.std(-1, unbiased=False, keepdim=True)
    levels = mu + sigma * torch.tensor([-1.751, -0.584, 0.584, 1.751], dtype=torch.float64)
    nearest = (hat.cpu().double()[..., None] - levels[..., None, :]).abs().min(-1).values
    assert (nearest <= 2e-3 * sigma).all()


def test_on_gaussian_rows_the_buckets_hold_lloyd_max_probabilities(device):
    # Lloyd-Max's 4 cells of N(0, 1): Phi(-0.981065), then 1/2 - that, mirrored
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4096, 1, 256, generator=g).to(device)
    codes = unpack_codes(quantize_kv_lloyd_max(x, None, 0.0, None)[0].cpu()).flatten()
    n = codes.numel()
    tail = 0.5 * math.erfc(0.981065 / math.sqrt(2))
    for c, p in enumerate([tail, 0.5 - tail, 0.5 - tail, tail]):
        got = float((codes == c).sum()) / n
        assert abs(got - p) < 5 * math.sqrt(p * (1 - p) / n) + 1e-3, (c, got, p)


def test_smaller_groups_are_refused_with_the_reason():
    with pytest.raises(InvalidInput, match="single-scale path: group_size must be head_dim"):
        quantize_kv_lloyd_max(torch.randn(4, 1, 64), None, 0.9, 32)


@pytest.mark.parametrize("fn", [quantize_kv_lloyd_max, fake_quantize_kv_lloyd_max])
def test_a_rotation_or_mean_of_the_wrong_shape_is_refused_as_quantize_kv_refuses_it(fn):
    # it was a RuntimeError from the matrix product (mean: a silent broadcast or one as well)
    x = torch.randn(4, 2, 64)
    with pytest.raises(InvalidInput, match="rotation must be"):
        fn(x, torch.eye(32), 0.9)
    with pytest.raises(InvalidInput, match="mean must be"):
        fn(x, None, 0.9, mean=torch.zeros(64))
