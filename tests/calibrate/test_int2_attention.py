"""INT2-cache attention emulation against a float64 per-query reference on fresh random data."""

from __future__ import annotations

import pytest
import torch

from oscar_zoo.calibrate.int2_attention import mixed_attention, tier_mask


def reference(q, k, v, k2, v2, allowed, scaling, sink, recent):
    """Each query i, one at a time: key j from the BF16 tier if j < sink or i - j < recent."""
    b, hq, t, d = q.shape
    g = hq // k.shape[1]
    out = torch.zeros(b, t, hq, d, dtype=torch.float64)
    for bi in range(b):
        for h in range(hq):
            kh = h // g
            for i in range(t):
                keys = [j for j in range(t) if allowed[min(bi, allowed.shape[0] - 1), 0, i, j]]
                fp = [j < sink or i - j < recent for j in keys]
                kk = torch.stack([(k if f else k2)[bi, kh, j] for j, f in zip(keys, fp)]).double()
                vv = torch.stack([(v if f else v2)[bi, kh, j] for j, f in zip(keys, fp)]).double()
                p = torch.softmax(kk @ q[bi, h, i].double() * scaling, 0)
                out[bi, i, h] = p @ vv
    return out


@pytest.mark.parametrize("window", [None, 5])
def test_matches_per_query_reference(window):
    g = torch.Generator().manual_seed(0 if window is None else 1)
    b, hq, h, t, d = 2, 6, 2, 23, 8
    q, k, v = (torch.randn(b, n, t, d, generator=g) for n in (hq, h, h))
    k2, v2 = k + 0.3 * torch.randn(k.shape, generator=g), v + 0.3 * torch.randn(v.shape, generator=g)
    i, j = torch.arange(t)[:, None], torch.arange(t)[None, :]
    allowed = (j <= i) if window is None else (j <= i) & (i - j < window)
    allowed = allowed[None, None]
    got = mixed_attention(q, k, v, allowed, 0.35, k2, v2, sink=3, recent=4, block=7)
    want = reference(q, k, v, k2, v2, allowed, 0.35, 3, 4)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    rows = torch.tensor([2, 9, 22])
    part = mixed_attention(q, k, v, allowed, 0.35, k2, v2, sink=3, recent=4, rows=rows)
    torch.testing.assert_close(part.double(), want[:, rows], rtol=1e-5, atol=1e-5)
    exact = mixed_attention(q, k, v, allowed, 0.35, k, v, sink=3, recent=4)
    torch.testing.assert_close(exact.double(), reference(q, k, v, k, v, allowed, 0.35, 3, 4),
                               rtol=1e-5, atol=1e-5)


def test_tier_mask():
    m = tier_mask(torch.tensor([0, 5, 9]), 10, sink=2, recent=3)
    assert m[2].tolist() == [True, True] + [False] * 5 + [True] * 3
    assert m[1].tolist() == [True, True, False] + [True] * 7    # keys after the query: masked later


@pytest.mark.parametrize("per_head, centered", [(False, False), (True, True)])
def test_dequantized_matches_a_float64_round_trip(per_head, centered):
    """The INT2 tier in the original basis: (x - mean) R, per-row |x| clip per KV head (0 = off),
    per-group min/max codes, dequantized, then R^T and + mean; oscar-spec 2.9 and 3.1 in float64."""
    from oscar_zoo.calibrate.int2_attention import dequantized, kernel_quantizer

    g = torch.Generator().manual_seed(3 + per_head)
    b, h, t, d, group = 2, 3, 17, 64, 16
    x = torch.randn(b, h, t, d, generator=g) * torch.linspace(0.2, 3.0, d)
    rot = torch.linalg.qr(torch.randn(*((h,) if per_head else ()), d, d, generator=g, dtype=torch.float64))[0]
    clip = torch.tensor([0.9, 0.0, 0.7])
    mean = torch.randn(h, d, generator=g) if centered else None
    got = dequantized(x, rot.float(), clip, group, mean, kernel_quantizer(device="cpu"))

    r = rot.expand(h, d, d)
    xc = x.double() - (0 if mean is None else mean.double()[None, :, None])
    xr = torch.einsum("bhtd,hde->bhte", xc, r)
    for head, c in enumerate(clip.tolist()):
        if c > 0:
            thr = xr[:, head].abs().sort(-1).values[..., int(c * d)][..., None]
            xr[:, head] = torch.minimum(torch.maximum(xr[:, head], -thr), thr)
    grouped = xr.reshape(b, h, t, d // group, group)
    lo, hi = grouped.amin(-1, keepdim=True), grouped.amax(-1, keepdim=True)
    scale = (hi - lo).clamp_min(1e-8) / 3
    code = torch.floor(grouped / scale - lo / scale + 0.5).clamp(0, 3)
    want = torch.einsum("bhte,hde->bhtd", ((code + lo / scale) * scale).reshape(b, h, t, d), r)
    want = want + (0 if mean is None else mean.double()[None, :, None])
    # a code may flip at a rounding tie (float32 vs float64): bound the rows that differ
    close = torch.isclose(got.double(), want, rtol=1e-4, atol=1e-4).all(-1)
    assert close.float().mean() > 0.99, close.float().mean()
    assert got.shape == x.shape and got.dtype == x.dtype
