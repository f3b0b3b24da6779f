"""Lloyd-Max INT2 buckets (OSCAR's SGLANG_LLOYD_MAX=1, oscar-spec 5), as a few torch ops.

OSCAR serves some models (catalog `lloyd_max`) with this variant of its single-scale quantizer
(one group per row). After the clip, each row is standardized, z = (x - mu) / sigma with mu the
row mean and sigma = sqrt(var + 1e-8) (population variance over the row), and bucketed at the
4-level Lloyd-Max boundaries of N(0, 1): code = [z >= -B] + [z >= 0] + [z >= B], B = 0.981065.
Decode is the uniform formula, (code - zero) * scale, with scale = SPAN / 3 * RATIO * sigma and
zero = 1.5 - mu / scale: the levels are mu + {-1.751, -0.584, 0.584, 1.751} sigma, and the
stored format (packed codes, one scale/zero pair per row) is the uniform kernel's, so
dequantize_kv and decode_attention read it unchanged.

Why torch and not a Triton kernel: only clip search and validation simulate it (serving runs
OSCAR's own kernel), it is a few row reductions after the clamp, and the uniform kernel's
instruction budget is spent (bench/results/kernels-notes.md). float32 arithmetic, as a kernel
keeps rows in registers; reference.ref_quantize_lloyd_max is the float64 reference.
"""

from __future__ import annotations

import torch

from oscar_zoo.zoo.errors import InvalidInput
from ._args import check_mean, check_rotation, check_scale_dtype, check_x, group_count
from .reference import pack_codes, to_storage
from .vectorized import rotated_clamped

BOUNDARY = 0.981065          # Lloyd-Max decision boundary of N(0, 1) at 4 levels, as OSCAR has it
SPAN = 2 * 1.5095586         # OSCAR's LM_SPAN: twice (about) the outer Lloyd-Max centroid
RATIO = 1.16                 # OSCAR's LM_RATIO: the production-stable widening of the levels
EPS = 1e-8


def _single_scale(d: int, group_size: int | None) -> None:
    if group_count(d, group_size) != 1:
        raise InvalidInput(f"Lloyd-Max buckets are OSCAR's single-scale path: group_size must be "
                           f"head_dim ({d}), got {group_size}; use uniform INT2 for smaller groups")


def _buckets(xc: torch.Tensor, scale_dtype: torch.dtype):
    """xc: clamped rows f32 [T, H, d] -> codes u8 [T, H, d], scale and zero [T, H] in scale_dtype."""
    mu = xc.mean(-1, keepdim=True)                                        # [T, H, 1]
    sigma = torch.sqrt(((xc - mu) ** 2).mean(-1, keepdim=True) + EPS)
    z = (xc - mu) / sigma
    codes = ((z >= -BOUNDARY).to(torch.uint8) + (z >= 0).to(torch.uint8)
             + (z >= BOUNDARY).to(torch.uint8))
    scale = to_storage(sigma[..., 0].double() * (SPAN / 3 * RATIO), scale_dtype, "scale")
    zero = to_storage(1.5 - mu[..., 0].double() / scale.double(), scale_dtype, "zero")
    return codes, scale, zero


def _checked_buckets(x, rotation, clip, group_size, mean, scale_dtype):
    """quantize_kv's argument checks, then the buckets of the rotated, clamped rows."""
    t, h, d = check_x(x)
    check_scale_dtype(scale_dtype)
    check_rotation(rotation, h, d)
    check_mean(mean, h, d)
    _single_scale(d, group_size)
    return _buckets(rotated_clamped(x, rotation, clip, mean), scale_dtype)


def quantize_kv_lloyd_max(x, rotation, clip, group_size=None, scale_dtype=torch.float32,
                          mean=None):
    """quantize_kv's arguments and output format (G = 1): packed uint8 [T, H, d/4] and
    scales_zeros [T, H, 2] in scale_dtype."""
    codes, scale, zero = _checked_buckets(x, rotation, clip, group_size, mean, scale_dtype)
    return pack_codes(codes), torch.stack([scale, zero], dim=-1)


def fake_quantize_kv_lloyd_max(x, rotation, clip, group_size=None, mean=None,
                               scale_dtype=torch.float32) -> torch.Tensor:
    """quantize_kv_lloyd_max then the uniform dequant, in float32 as dequantize_kv computes it:
    [T, H, d] in the rotated (centered) basis."""
    codes, scale, zero = _checked_buckets(x, rotation, clip, group_size, mean, scale_dtype)
    return (codes.float() - zero.float()[..., None]) * scale.float()[..., None]
