"""Independent float64 implementations of OSCAR's calibration formulas (oscar-spec 2.2-2.7, numpy)
and of its INT2 cache (2.9, 3.1, torch), written from the spec text, sharing no code with
calibrate/ or kernels/."""

from __future__ import annotations

import numpy as np
import torch


def qqt(q: np.ndarray, kv_heads: int) -> np.ndarray:
    """q: [T, Hq, d] -> per-KV-head C_h = Qg^T Qg / (T g): [H, d, d]."""
    t, hq, d = q.shape
    g = hq // kv_heads
    out = []
    for h in range(kv_heads):
        qg = q[:, h * g:(h + 1) * g, :].reshape(-1, d).astype(np.float64)
        out.append(qg.T @ qg / (t * g))
    return np.stack(out)


def sst(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Per head: w_t = k_t^T C_h k_t, normalised to mean 1, S = (v sqrt(w))^T (v sqrt(w)) / T."""
    t, kv_heads, d = k.shape
    c = qqt(q, kv_heads)
    out = []
    for h in range(kv_heads):
        kh, vh = k[:, h].astype(np.float64), v[:, h].astype(np.float64)
        w = np.array([kh[i] @ c[h] @ kh[i] for i in range(t)])
        w = w / max(w.sum(), 1e-12) * t
        vw = vh * np.sqrt(w)[:, None]
        out.append(vw.T @ vw / t)
    return np.stack(out)


def second_moment(x: np.ndarray) -> np.ndarray:
    """x: [T, H, d] -> sum_t x x^T / T per head."""
    x = x.astype(np.float64)
    return np.einsum("thd,the->hde", x, x) / x.shape[0]


def hadamard(d: int) -> np.ndarray:
    h = np.array([[1.0]])
    while h.shape[0] < d:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(d)


def bitrev_perm(eig: np.ndarray) -> np.ndarray:
    d = len(eig)
    bits = int(np.log2(d))
    order = np.argsort(-eig, kind="stable")
    perm = np.zeros(d, dtype=int)
    for i in range(d):
        rev = 0
        for b in range(bits):
            if i >> b & 1:
                rev |= 1 << (bits - 1 - b)
        perm[rev] = order[i]
    return np.eye(d)[:, perm]


def oscar_rotation(cov: np.ndarray):
    """(U, eigenvalues ascending, R = U H P) of one symmetric [d, d] matrix."""
    sym = (cov + cov.T) / 2
    eig, u = np.linalg.eigh(sym)
    return u, eig, u @ hadamard(len(eig)) @ bitrev_perm(eig)


def eigenvectors(rotation, eig: np.ndarray) -> np.ndarray:
    """U back from R = U H P, P ordered by `eig` (H is symmetric and its own inverse)."""
    return np.asarray(rotation, dtype=np.float64) @ bitrev_perm(eig).T @ hadamard(len(eig))


def int2_f64(x, rotation, clip, group: int, mean):
    """oscar-spec 2.9 and 3.1 in float64: (x - mean) R, per-row |x| clip by sort, per-group
    asymmetric min/max with round-half-up codes in 0..3, dequantized, back to the original basis.
    x: [T, H, d]; rotation [d, d] or [H, d, d]; clip [H]."""
    x = x.double() - (0 if mean is None else mean.double())
    r = rotation.double().expand(x.shape[1], *rotation.shape[-2:])
    xr = torch.einsum("thd,hde->the", x, r)
    t, h, d = xr.shape
    out = torch.empty_like(xr)
    for head in range(h):
        row = xr[:, head]
        if float(clip[head]) > 0:
            thr = row.abs().sort(-1).values[:, min(int(float(clip[head]) * d), d - 1)][:, None]
            row = torch.minimum(torch.maximum(row, -thr), thr)
        grouped = row.reshape(t, d // group, group)
        lo, hi = grouped.amin(-1, keepdim=True), grouped.amax(-1, keepdim=True)
        scale = (hi - lo).clamp_min(1e-8) / 3
        zero = -lo / scale
        code = torch.floor(grouped / scale + zero + 0.5).clamp(0, 3)
        out[:, head] = ((code - zero) * scale).reshape(t, d)
    back = torch.einsum("the,hde->thd", out, r)
    return back + (0 if mean is None else mean.double())
