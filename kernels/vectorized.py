"""The INT2 round trip (quantize_kv then dequantize_kv) as a few vectorised torch ops.

Why it exists: on a CPU the Triton kernels run in Triton's interpreter, ~0.2 s per call of
2048 tokens x 3 heads; validating a model makes thousands of such calls. This twin computes the
same numbers (tests/kernels/test_vectorized.py checks it against the compiled or interpreted
kernels bit for bit) in a few milliseconds. Packing is skipped: it is lossless.

Arithmetic, as in the kernel: the row rotation in float32; the clip threshold by sort semantics
(oscar-spec 2.9); scale and zero from float32 min/max, rounded into scale_dtype exactly as
reference.to_storage does; codes as #{j : x >= t_j}; dequant (code - zero) * scale in float32.
"""

from __future__ import annotations

import torch

from ._args import check_mean, check_rotation, check_scale_dtype, check_x, clip_ratios, group_count
from .reference import to_storage


def _rotated(x: torch.Tensor, rotation, mean) -> torch.Tensor:
    # x: [T, H, d] -> (x - mean) @ R in float32, centering subtracted after the rotation
    xr = x.float()
    if rotation is not None:
        r = rotation.to(device=x.device, dtype=x.dtype).float()   # rounded to x's dtype, as the kernel's tensor cores take it
        xr = xr @ r if r.dim() == 2 else torch.einsum("thd,hde->the", xr, r)
    if mean is not None:   # mean @ R with the exact R in float64, then float32, as quantize_kv
        m = mean.double().to(x.device)
        if rotation is not None:
            r64 = rotation.double().to(x.device)
            m = m @ r64 if r64.dim() == 2 else torch.einsum("hd,hde->he", m, r64)
        xr = xr - m.float()
    return xr


def rotated_clamped(x: torch.Tensor, rotation, clip, mean=None) -> torch.Tensor:
    """(x - mean) @ R in float32, each row clamped at its sort-semantics |x| quantile (oscar-spec
    2.9), as the kernel holds it before the codes: [T, H, d] f32."""
    t, h, d = x.shape
    xr = _rotated(x, rotation, mean)                                       # [T, H, d] f32
    ratio = clip_ratios(clip, h)                                           # [H] f64
    idx = torch.clamp(torch.floor(ratio * d), 0, d - 1).long()             # [H]
    srt = xr.abs().sort(dim=-1).values
    thr = srt.gather(-1, idx.to(x.device)[None, :, None].expand(t, h, 1))  # [T, H, 1]
    thr = torch.where((ratio <= 0).to(x.device)[None, :, None], torch.inf, thr)
    return torch.maximum(torch.minimum(xr, thr), -thr)


def fake_quantize_kv_vectorized(x, rotation, clip, group_size=None, mean=None,
                                scale_dtype=torch.float32) -> torch.Tensor:
    """float32 [T, H, d] in the rotated (centered) basis, like kernels.fake_quantize_kv."""
    t, h, d = check_x(x)
    check_scale_dtype(scale_dtype)
    check_rotation(rotation, h, d)
    check_mean(mean, h, d)
    ng = group_count(d, group_size)
    xg = rotated_clamped(x, rotation, clip, mean).view(t, h, ng, d // ng)
    mx, mn = xg.amax(-1).double(), xg.amin(-1).double()                    # [T, H, G]
    scale = to_storage(torch.clamp(mx - mn, min=1e-8) / 3.0, scale_dtype, "scale")
    zero = to_storage(-mn / scale.double(), scale_dtype, "zero")
    s64, z64 = scale.double(), zero.double()
    codes = torch.zeros_like(xg)
    for j in (1, 2, 3):
        codes += (xg >= ((j - 0.5 - z64) * s64).float()[..., None]).float()
    out = (codes - zero.float()[..., None]) * scale.float()[..., None]
    return out.view(t, h, d)
