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
