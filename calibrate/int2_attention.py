"""Attention as a serving engine computes it over OSCAR's mixed cache, exact per query.

Query i sees key j from the BF16 tier when j < sink or i - j < recent, otherwise from the INT2
tier: (k - mean) @ R_k, clipped and quantized, then dequantized; V likewise with R_v, never
centered. Logits of both tiers are computed in the original basis, which is the same math as
the engine's rotated one: (q R)((k - mean) R)^T + q.mean = q k^T, since R is orthogonal; the
q.mean term is constant per query, so adding it back to both tiers changes nothing for softmax.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

# quantizer(x [T, H, d], rotation, clip [H], group_size, mean [H, d] | None) -> x_hat [T, H, d]
# in the rotated basis (quantize + dequantize through the INT2 kernels).
Quantizer = Callable[..., torch.Tensor]


@dataclass
class CacheSpec:
    """One layer's INT2 cache settings (a bundle's, or a baseline's)."""

    rot_k: torch.Tensor            # [d,d] or [H,d,d]
    rot_v: torch.Tensor
    clip_k: torch.Tensor           # [H]
    clip_v: torch.Tensor           # [H]
    mean: torch.Tensor | None      # [H, d] key mean, original basis
    group_size: int


def int2_backend(device: torch.device | str) -> str:
    """triton or vectorized, from the int2_backend setting (auto: triton on CUDA only)."""
    from oscar_zoo.zoo import settings

    choice = settings.get("int2_backend")   # one of its choices (settings refuses the others)
    if choice == "auto":
        return "triton" if torch.device(device).type == "cuda" else "vectorized"
    return choice


def kernel_quantizer(scale_dtype: torch.dtype = torch.float32, device=None,
                     lloyd_max: bool = False) -> Quantizer:
    """The INT2 round trip of the kernels (or their bit-exact torch twin on CPUs) for tensors on
    `device` (default: CUDA when present). lloyd_max: OSCAR's Lloyd-Max buckets instead of
    uniform ones (torch on either device; one group per row)."""
    from oscar_zoo import kernels

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if lloyd_max:
        fn, backend = kernels.fake_quantize_kv_lloyd_max, "lloyd-max torch"
    else:
        backend = int2_backend(device)
        fn = kernels.fake_quantize_kv if backend == "triton" else kernels.fake_quantize_kv_vectorized

    def q(x, rotation, clip, group_size, mean):
        return fn(x, rotation, clip, group_size, mean=mean, scale_dtype=scale_dtype)

    q.backend = backend
    q.kind = "lloyd_max" if lloyd_max else "uniform"
    return q


def bundle_quantizer(manifest, device=None) -> Quantizer:
    """The quantizer a bundle is served with (its quantization section): the scale dtype, and
    Lloyd-Max buckets where it asks for them, on the layers whose rows are one group, and only
    when its K or V clip ratio is on (OSCAR applies them only in its single-scale clip kernel,
    oscar-spec 5)."""
    from oscar_zoo.zoo.recipes import lloyd_max_ignored_for

    q, c, geo = manifest.quantization, manifest.clip, manifest.geometry
    dtype = getattr(torch, q.scale_dtype)
    dims = {geo.head_dim, *geo.head_dim_by_layer.values()}
    if not q.lloyd_max or lloyd_max_ignored_for(q.group_size, dims, c.k_global, c.v_global):
        return kernel_quantizer(dtype, device)
    lloyd = kernel_quantizer(dtype, device, lloyd_max=True)
    if q.group_size >= max(dims):
        return lloyd
    # mixed head dims: layers whose head_dim exceeds the group go through the grouped kernel
    uniform = kernel_quantizer(dtype, device)

    def per_layer(x, rotation, clip, group_size, mean):
        if group_size is None or group_size >= x.shape[-1]:
            return lloyd(x, rotation, clip, None, mean)
        return uniform(x, rotation, clip, group_size, mean)

    per_layer.backend = f"{lloyd.backend} + {uniform.backend}"
    per_layer.kind = "lloyd_max"
    return per_layer


def dequantized(x: torch.Tensor, rotation: torch.Tensor, clip: torch.Tensor, group_size: int,
                mean: torch.Tensor | None, quantizer: Quantizer) -> torch.Tensor:
    """x [B, H, T, d] -> what the INT2 tier returns, in the original basis: [B, H, T, d]."""
    b, h, t, d = x.shape
    rot = rotation.to(x.device, torch.float32)
    out = []
    for i in range(b):
        rows = x[i].transpose(0, 1).float()                                   # [T, H, d]
        hat = quantizer(rows, rot, clip.to(x.device), group_size,
                        None if mean is None else mean.to(x.device, torch.float32))
        back = _unrotate(hat.float(), rot)                                    # [T, H, d]
        if mean is not None:
            back = back + mean.to(x.device, torch.float32)
        out.append(back.transpose(0, 1))
    return torch.stack(out).to(x.dtype)


def _unrotate(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    # x: [T, H, d] rotated rows; rot: [d,d] or [H,d,d]. Rows were stored as x_orig @ R.
    if rot.dim() == 2:
        return x @ rot.T
    return torch.einsum("thd,hed->the", x, rot)


def tier_mask(rows: torch.Tensor, keys: int, sink: int, recent: int) -> torch.Tensor:
    """[len(rows), keys] True where query row i reads key j from the BF16 tier."""
    j = torch.arange(keys, device=rows.device)
    return (j[None, :] < sink) | (rows[:, None] - j[None, :] < recent)


def mixed_attention(q, k, v, allowed, scaling: float, k_int2, v_int2, sink: int, recent: int,
                    rows: torch.Tensor | None = None, block: int = 512) -> torch.Tensor:
    """Attention output [B, len(rows), Hq, d] for the query positions `rows` (default all).

    q: [B, Hq, T, d]; k, v: [B, H, T, d] as the model made them; k_int2, v_int2: the same after
    the INT2 round trip (or k, v themselves for a tier kept in full precision); allowed: bool
    [B|1, 1, T, T] model mask (causal, sliding window).
    """
    t = q.shape[2]
    rows = torch.arange(t, device=q.device) if rows is None else rows.to(q.device)
    return _attention(q, k, v, allowed, scaling, k_int2, v_int2, sink, recent, rows, rows,
                      is_causal(allowed, t), block)


def row_attention(q, k, v, allowed, scaling: float, k_int2, v_int2, sink: int, recent: int,
                  rows: torch.Tensor, causal: bool, block: int = 512) -> torch.Tensor:
    """mixed_attention(q_all, k, v, allowed_all, ..., rows), bit for bit, from the rows alone,
    for callers that keep queries a while (the clip search's KV-shared readers).

    q = q_all[:, :, rows]: [B, Hq, R, d]; allowed = allowed_all[:, :, rows]: [B|1, 1, R, T];
    causal = is_causal(allowed_all, T): decided on the whole mask as mixed_attention decides it,
    so that both attend over the same keys (a slice of the mask could say causal where the
    whole does not). Returns [B, R, Hq, d].
    """
    at = torch.arange(len(rows), device=q.device)
    return _attention(q, k, v, allowed, scaling, k_int2, v_int2, sink, recent,
                      rows.to(q.device), at, causal, block)


def _attention(q, k, v, allowed, scaling, k_int2, v_int2, sink, recent, rows, at, causal, block):
    # q: [B, Hq, Q, d] and allowed: [B|1, 1, Q, T] hold query position rows[i] at index at[i]:
    # Q = T and at = rows for a whole window, Q = R and at = arange(R) for its rows alone
    g = q.shape[1] // k.shape[1]
    t = k.shape[2]
    exact = k_int2 is k and v_int2 is v                      # the all-BF16 reference
    ex = lambda x: x.float().repeat_interleave(g, dim=1)                       # noqa: E731
    kf, vf = ex(k), ex(v)
    ki, vi = (kf, vf) if exact else (ex(k_int2), ex(v_int2))
    outs = []
    for start in range(0, len(rows), block):                 # bound the [B, Hq, rows, T] logits
        r, i = rows[start:start + block], at[start:start + block]
        n = int(r.max()) + 1 if causal else t                 # keys <= last row
        qr = q[:, :, i].float()
        logits = qr @ kf[:, :, :n].transpose(-1, -2)
        if not exact:
            fp = tier_mask(r, n, sink, recent)                                 # [R, n]
            logits = torch.where(fp, logits, qr @ ki[:, :, :n].transpose(-1, -2))
        logits = (logits * scaling).masked_fill(~allowed[:, :, i, :n], float("-inf"))
        p = torch.softmax(logits, dim=-1)
        if exact:
            o = p @ vf[:, :, :n]
        else:
            o = p @ vi[:, :, :n] + (p * fp) @ (vf[:, :, :n] - vi[:, :, :n])    # [B, Hq, R, d]
        outs.append(o.transpose(1, 2))
    return torch.cat(outs, dim=1).to(q.dtype)


def is_causal(allowed: torch.Tensor, t: int) -> bool:
    """Whether the mask [B|1, 1, t, T] of t queries lets none see a later key (checked on its
    upper triangle): then a block of rows attends only to the keys up to its last row."""
    if allowed.shape[-2] != t:
        return False
    keys = allowed.shape[-1]
    upper = torch.ones(keys, keys, dtype=torch.bool, device=allowed.device).triu(1)
    return not bool((allowed & upper).any())
