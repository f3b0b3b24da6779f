"""Float64 torch references for the INT2 kernels: slow, obvious, independent of Triton.

What "the reference" computes, precisely (the kernels must agree bit for bit where stated):

- Rotation and centering: `(x - mean) @ R` per KV head in float64, held in float32 (the
  kernels keep the rotated row in float32 registers): `fp32(x @ R) - fp32(mean @ R)`, the
  subtraction in float32. Bit-exact with the kernel only when `x @ R` is exact in float32
  (identity, signed permutations); with a general R the kernel's matrix product rounds
  differently (bf16 inputs use a bf16 R on the tensor cores, as serving does).
- Clip (oscar-spec 2.9, sort semantics): per (token, head) row over the full head_dim,
  idx = int(ratio * d) clamped to [0, d-1], thr = sort(|x|)[idx]; ratio <= 0: no clip.
- Per group: mx, mn of the clamped values; scale = max(mx - mn, 1e-8) / 3 in float64, stored
  in scale_dtype (rounded through float32; float16 clamps scale to >= 2**-14 and zero to
  +-65504 so neither becomes 0 or inf); zero = -mn / scale_stored in float64, stored likewise.
- Codes: trunc(x/scale + zero + 1/2) clamped to [0, 3], evaluated as #{j in 1..3 : x >= t_j}
  with t_j = fp32((j - 1/2 - zero) * scale) (float64 product of the stored values). In exact
  arithmetic the two are the same; this form does not depend on FMA contraction or division
  rounding, so kernel and reference agree exactly. `literal_codes` evaluates the spec formula
  in float64 for the tests to show they differ only at rounding ties.
- Packing: byte j holds dims j, j+d/4, j+d/2, j+3d/4 at bits [1:0], [3:2], [5:4], [7:6].
- Dequant: (code - zero) * scale, in float64 (or in float32 with the kernel's two roundings).
- Attention: exact softmax attention in float64 with GQA (query head h reads KV head
  h // (q_heads / kv_heads)).
"""

from __future__ import annotations

import math

import torch

from ._args import clip_ratios, group_count

F16_MAX = 65504.0
F16_TINY = 2.0 ** -14


def ref_rotate(x: torch.Tensor, rotation: torch.Tensor | None, mean: torch.Tensor | None = None) -> torch.Tensor:
    """(x - mean) @ R per KV head in float64. x: [tokens, kv_heads, d]; R: [d, d] | [kv_heads, d, d]
    | None (identity); mean: [kv_heads, d] | None."""
    x = x.double()
    if mean is not None:
        x = x - mean.double()
    if rotation is None:
        return x
    r = rotation.double()
    return x @ r if r.dim() == 2 else torch.einsum("thd,hde->the", x, r)


def kernel_rotated(x, rotation, mean=None) -> torch.Tensor:
    """The rotated, centered rows as the quantize kernel holds them: float32 [tokens, kv_heads, d]."""
    xr = ref_rotate(x, rotation).float()
    if mean is not None:
        mr = ref_rotate(mean[None], rotation)[0].float()       # [kv_heads, d]
        xr = xr - mr
    return xr


def ref_clip_threshold(xr: torch.Tensor, clip) -> torch.Tensor:
    """Per-row clip threshold, float64 [tokens, kv_heads]; +inf where clipping is off."""
    t, h, d = xr.shape
    ratio = clip_ratios(clip, h)                                       # [h] float64
    idx = torch.clamp(torch.floor(ratio * d), 0, d - 1).long()         # int(ratio*d), clamped
    srt = xr.double().abs().sort(dim=-1).values                        # ascending |x|
    thr = srt.gather(-1, idx.to(xr.device)[None, :, None].expand(t, h, 1))[..., 0]
    return torch.where((ratio <= 0).to(xr.device)[None, :], torch.inf, thr)


def to_storage(v: torch.Tensor, dtype: torch.dtype, kind: str) -> torch.Tensor:
    """float64 -> float32 -> scale dtype, with float16's range guards (kind: 'scale' | 'zero')."""
    f = v.float()
    if dtype == torch.float16:
        f = f.clamp(F16_TINY, F16_MAX) if kind == "scale" else f.clamp(-F16_MAX, F16_MAX)
    return f.to(dtype)


def ref_quantize_rotated(xr: torch.Tensor, clip, group_size=None, scale_dtype=torch.float32):
    """Quantize rows already rotated (float32 [tokens, kv_heads, d]).
    Returns packed uint8 [tokens, kv_heads, d/4] and scales_zeros [tokens, kv_heads, 2*groups]."""
    t, h, d = xr.shape
    ng = group_count(d, group_size)
    thr = ref_clip_threshold(xr, clip)[..., None]                     # [t, h, 1]
    xc = torch.maximum(torch.minimum(xr.double(), thr), -thr)         # symmetric clamp
    xg = xc.view(t, h, ng, d // ng)
    mx, mn = xg.amax(-1), xg.amin(-1)                                 # [t, h, G]
    scale = to_storage(torch.clamp(mx - mn, min=1e-8) / 3.0, scale_dtype, "scale")
    zero = to_storage(-mn / scale.double(), scale_dtype, "zero")
    s64, z64 = scale.double(), zero.double()
    codes = torch.zeros_like(xg, dtype=torch.uint8)
    for j in (1, 2, 3):
        t_j = ((j - 0.5 - z64) * s64).float().double()[..., None]
        codes += (xg >= t_j).to(torch.uint8)
    packed = pack_codes(codes.view(t, h, d))
    sz = torch.stack([scale, zero], dim=-1).view(t, h, 2 * ng)
    return packed, sz


def literal_codes(xr: torch.Tensor, clip, scales_zeros: torch.Tensor) -> torch.Tensor:
    """The spec's formula trunc(x/scale + zero + 1/2) clamped to [0, 3], all in float64, with the
    stored scale/zero. uint8 [tokens, kv_heads, d] (not packed)."""
    t, h, d = xr.shape
    ng = scales_zeros.shape[-1] // 2
    thr = ref_clip_threshold(xr, clip)[..., None]
    xc = torch.maximum(torch.minimum(xr.double(), thr), -thr).view(t, h, ng, d // ng)
    s = scales_zeros[..., 0::2].double()[..., None]
    z = scales_zeros[..., 1::2].double()[..., None]
    return torch.clamp(torch.trunc(xc / s + z + 0.5), 0, 3).to(torch.uint8).view(t, h, d)


def ref_quantize_kv(x, rotation, clip, group_size=None, scale_dtype=torch.float32, mean=None):
    """Reference of `quantize_kv`: rotate (+center), clip, quantize, pack."""
    return ref_quantize_rotated(kernel_rotated(x, rotation, mean), clip, group_size, scale_dtype)


def pack_codes(codes: torch.Tensor) -> torch.Tensor:
    """uint8 codes [..., d] in 0..3 -> packed [..., d/4], quarter-strided."""
    q = codes.shape[-1] // 4
    c = codes.to(torch.uint8)
    return c[..., :q] | (c[..., q:2 * q] << 2) | (c[..., 2 * q:3 * q] << 4) | (c[..., 3 * q:] << 6)


def unpack_codes(packed: torch.Tensor) -> torch.Tensor:
    """packed uint8 [..., d/4] -> codes uint8 [..., d]."""
    return torch.cat([(packed >> (2 * i)) & 3 for i in range(4)], dim=-1)


def ref_dequantize_kv(packed, scales_zeros, group_size=None, dtype=torch.float64):
    """(code - zero) * scale per group. dtype float64 (exact) or float32 (the kernel's two
    float32 roundings). Returns [tokens, kv_heads, d]."""
    codes = unpack_codes(packed)
    d = codes.shape[-1]
    ng = group_count(d, group_size)
    if scales_zeros.shape[-1] != 2 * ng:
        raise ValueError(f"scales_zeros has {scales_zeros.shape[-1]} values per row, expected {2 * ng}")
    s = scales_zeros[..., 0::2].to(dtype).repeat_interleave(d // ng, dim=-1)
    z = scales_zeros[..., 1::2].to(dtype).repeat_interleave(d // ng, dim=-1)
    return (codes.to(dtype) - z) * s


def ref_fake_quantize_kv(x, rotation, clip, group_size=None, scale_dtype=torch.float32, mean=None):
    """Reference of `fake_quantize_kv`: float64 [tokens, kv_heads, d] in the rotated basis."""
    packed, sz = ref_quantize_kv(x, rotation, clip, group_size, scale_dtype, mean)
    return ref_dequantize_kv(packed, sz, group_size)


def ref_attention(q: torch.Tensor, keys, values, sm_scale: float) -> torch.Tensor:
    """Exact GQA decode attention in float64.
    q: [batch, q_heads, d]; keys/values: per sequence [len_b, kv_heads, d]. Returns [batch, q_heads, d]."""
    b, hq, d = q.shape
    out = torch.empty(b, hq, d, dtype=torch.float64, device=q.device)
    for i in range(b):
        k, v = keys[i].double(), values[i].double()                   # [L, hkv, d]
        grp = hq // k.shape[1]
        kk = k.repeat_interleave(grp, dim=1).transpose(0, 1)          # [hq, L, d]
        vv = v.repeat_interleave(grp, dim=1).transpose(0, 1)
        s = torch.einsum("hd,hld->hl", q[i].double(), kk) * sm_scale
        out[i] = torch.einsum("hl,hld->hd", torch.softmax(s, dim=-1), vv)
    return out


def rotate_heads(x: torch.Tensor, rotation, transpose: bool = False, group: int = 1) -> torch.Tensor:
    """x [..., heads, d] @ R (or R^T) per head in float64; query head h uses R[h // group]."""
    if rotation is None:
        return x.double()
    r = rotation.double()
    if transpose:
        r = r.transpose(-1, -2)
    if r.dim() == 2:
        return x.double() @ r
    r = r.repeat_interleave(group, dim=0)                             # [heads, d, d]
    return torch.einsum("...hd,hde->...he", x.double(), r)


def ref_cache_to_dense(cache):
    """Per sequence, the cache's keys and values in the rotated basis as float64
    [len_b, kv_heads, d]: BF16 rows exactly, INT2 rows dequantized in float64."""
    keys, values = [], []
    lens = cache.seq_lens.tolist()
    p = cache.page_size
    for b, n in enumerate(lens):
        n_hp = min(n, cache.sink + cache.recent)
        n_sink = min(n, cache.sink)
        n_rec, n_q = n_hp - n_sink, n - n_hp
        rows = torch.arange(n_q, device=cache.block_table.device)
        pages = cache.block_table[b, rows // p].long()
        out = []
        for hp, qp, sz in ((cache.hp_k, cache.k_packed, cache.k_sz), (cache.hp_v, cache.v_packed, cache.v_sz)):
            hp = hp[b].transpose(0, 1).double()                       # [S+R, hkv, d]
            mid = ref_dequantize_kv(qp[pages, :, rows % p], sz[pages, :, rows % p], cache.group_size)
            out.append(torch.cat([hp[:n_sink], mid, hp[cache.sink:cache.sink + n_rec]], dim=0))
        keys.append(out[0])
        values.append(out[1])
    return keys, values


def ref_decode_attention(q: torch.Tensor, cache, sm_scale: float | None = None) -> torch.Tensor:
    """Reference of `decode_attention` over the same (dequantized) cache, float64 [batch, q_heads, d]:
    q @ R_k, attention in the rotated basis, output @ R_v^T."""
    b, hq, d = q.shape
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else sm_scale
    grp = hq // cache.hp_k.shape[1]
    keys, values = ref_cache_to_dense(cache)
    q_rot = rotate_heads(q, cache.k_rotation, group=grp)
    o_rot = ref_attention(q_rot, keys, values, sm_scale)
    return rotate_heads(o_rot, cache.v_rotation, transpose=True, group=grp)


# --- Lloyd-Max buckets (oscar-spec 5) -------------------------------------------------------------
# Restated from the spec rather than imported, so that the reference does not share a typo with
# kernels/lloyd_max.py: boundaries +-0.981065 and 0 on z = (x - mu) / sqrt(var + 1e-8); levels
# mu + (code - 1.5) * (2 * 1.5095586 / 3) * 1.16 * sigma.
LM_BOUNDARY = 0.981065
LM_STEP = 2 * 1.5095586 / 3 * 1.16


def ref_quantize_lloyd_max(xr: torch.Tensor, clip, scale_dtype=torch.float32):
    """Lloyd-Max buckets of rows already rotated (float32 [tokens, kv_heads, d]), one scale per
    row, in float64. Returns (codes uint8 [t, h, d], z float64 [t, h, d], scale [t, h],
    zero [t, h]) with scale and zero in scale_dtype."""
    thr = ref_clip_threshold(xr, clip)[..., None]
    xc = torch.maximum(torch.minimum(xr.double(), thr), -thr)
    mu = xc.mean(-1, keepdim=True)
    sigma = torch.sqrt(((xc - mu) ** 2).mean(-1, keepdim=True) + 1e-8)
    z = (xc - mu) / sigma
    codes = sum((z >= b).to(torch.uint8) for b in (-LM_BOUNDARY, 0.0, LM_BOUNDARY))
    scale = to_storage(LM_STEP * sigma[..., 0], scale_dtype, "scale")
    zero = to_storage(1.5 - mu[..., 0] / scale.double(), scale_dtype, "zero")
    return codes, z, scale, zero
