"""Streaming accumulation equals the direct float64 formulas over all tokens at once."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oscar_zoo.calibrate.moments import LayerMoments

from . import reference as ref


def _chunks(rng, sizes, hq, h, d):
    """Random chunks [B, H, T, d] with a common key offset (like real post-RoPE keys)."""
    out = []
    for b, t in sizes:
        q = rng.standard_normal((b, hq, t, d)) * rng.random(d) * 3
        k = rng.standard_normal((b, h, t, d)) + rng.standard_normal(d) * 2
        v = rng.standard_normal((b, h, t, d)) * rng.random(d)
        out.append(tuple(torch.from_numpy(x).float() for x in (q, k, v)))
    return out


def _rows(x):  # [B, H, T, d] -> [B*T, H, d]
    return x.permute(0, 2, 1, 3).reshape(-1, x.shape[1], x.shape[3]).double().numpy()


@pytest.mark.parametrize("seed", range(3))
def test_streaming_moments_equal_direct_computation(seed):
    rng = np.random.default_rng(seed)
    hq, h, d = 9, 3, 16
    chunks = _chunks(rng, [(2, 7), (1, 33), (3, 5)], hq, h, d)
    m = LayerMoments(h, d, want_ktk=True, want_vtv=True)
    for q, k, v in chunks:
        m.update_pass1(q, k, v)
    for q, k, v in chunks:
        m.update_pass2(k, v)
    q_all = np.concatenate([_rows(q) for q, _, _ in chunks])
    k_all = np.concatenate([_rows(k) for _, k, _ in chunks])
    v_all = np.concatenate([_rows(v) for _, _, v in chunks])
    np.testing.assert_allclose(m.q_cov().numpy(), ref.qqt(q_all, h), rtol=1e-10)
    np.testing.assert_allclose(m.sst_cov().numpy(), ref.sst(q_all, k_all, v_all), rtol=1e-9)
    np.testing.assert_allclose(m.k_cov().numpy(), ref.second_moment(k_all), rtol=1e-10)
    np.testing.assert_allclose(m.v_cov().numpy(), ref.second_moment(v_all), rtol=1e-10)
    np.testing.assert_allclose(m.k_mean().numpy(), k_all.mean(0), rtol=1e-10)
    assert m.q_cov().dtype == torch.float64


def test_strided_inputs_as_attention_hands_them_give_the_same_moments():
    # Attention receives q, k, v as [B, H, T, d] views of [B, T, H, d] projections.
    rng = np.random.default_rng(7)
    hq, h, d = 6, 2, 8
    (q, k, v), = _chunks(rng, [(3, 11)], hq, h, d)
    strided = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v)]
    assert not strided[0].is_contiguous()
    a, b = LayerMoments(h, d, want_ktk=True, want_vtv=True), LayerMoments(h, d, want_ktk=True, want_vtv=True)
    a.update_pass1(q, k, v)
    b.update_pass1(*strided)
    a.update_pass2(k, v)
    b.update_pass2(*strided[1:])
    for name in ("m_q", "k_sum", "m_k", "m_v", "s_v", "e_sum"):
        torch.testing.assert_close(getattr(b, name), getattr(a, name), rtol=1e-12, atol=1e-12)
    if torch.cuda.is_available():
        c = LayerMoments(h, d, want_ktk=True, want_vtv=True)
        c.update_pass1(*(x.cuda() for x in strided))
        c.update_pass2(*(x.cuda() for x in strided[1:]))
        for name in ("m_q", "m_k", "s_v"):
            torch.testing.assert_close(getattr(c, name).cpu(), getattr(a, name), rtol=1e-10, atol=1e-9)
