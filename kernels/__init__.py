"""INT2 KV cache kernels in Triton, with float64 torch references.

Every kernel runs on CUDA tensors (compiled) and on CPU tensors (Triton's interpreter, chosen
per call: see `_launch.py`; no environment variable is needed, and TRITON_INTERPRET=1 also sends
CUDA tensors through the interpreter). Shapes: T tokens, H KV heads, Hq query heads, d head_dim
(a power of two >= 64), G = d / group_size groups per row. The rotated basis of a row x is
(x - mean) @ R for keys, x @ R for values.

quantize_kv(x, rotation, clip, group_size=None, scale_dtype=torch.float32, mean=None)
    x [T, H, d] float32/float16/bfloat16; rotation [d, d] | [H, d, d] | None (identity);
    clip: number | tensor [1], [H], [H, 1] or [1, H] (clip ratio per KV head, oscar-spec 2.9; <= 0
    disables); mean [H, d] | None (key centering, original basis; never pass it for V).
    One pass: rotate (x @ R; 16-bit x uses R rounded to x's dtype on the tensor cores, float32 x
    exact float32), subtract mean @ R, clamp each row at its sort-semantics |x| quantile,
    asymmetric min/max per group, codes 0..3, packed 4 per byte in OSCAR's quarter-strided order.
    -> (packed uint8 [T, H, d/4], scales_zeros [T, H, 2G] in scale_dtype, scale at 2g, zero at 2g+1)
    On a Hopper GPU the common case (16-bit x with contiguous heads, a rotation, d = 128, one
    group per row) runs quantize_hopper.py's Gluon kernel instead, with the same outputs bit for
    bit (x tiles by TMA while the previous block computes); where this Triton cannot build it
    (Gluon is experimental), a warning, then the Triton kernel.
    x must be finite: a row holding NaN or inf gets unspecified codes and scales (the reference
    gives NaN), as checking every value would cost the hot path; validate names such a layer.
    rotation may also be prepare_rotation's result (then no mean): see below.

prepare_rotation(rotation, mean=None, dtype=torch.bfloat16, device=None) -> PreparedRotation
    R cast to x's dtype and mean @ R (float64, rounded once), copies made once per layer instead
    of on every quantize_kv call (five small kernels): a call with it is one kernel launch for
    d <= 128 (H100: 1.56x faster at 8K rows, 1.04x at 262K). device defaults to the rotation's
    (else the mean's, else the CPU). The tensors are the caller's: keep them alive as long as a
    CUDA graph captured with them, and prepare again after changing R or the mean.

dequantize_kv(packed, scales_zeros, group_size=None)
    -> float32 [T, H, d] in the rotated basis: (code - zero) * scale in float32.

fake_quantize_kv(x, rotation, clip, group_size=None, mean=None, scale_dtype=torch.float32)
    quantize_kv then dequantize_kv -> float32 [T, H, d], rotated basis (un-rotate with R^T,
    and add mean back, to compare with x).

fake_quantize_kv_vectorized(x, rotation, clip, group_size=None, mean=None, scale_dtype=torch.float32)
    The same numbers as fake_quantize_kv from a few vectorised torch ops (vectorized.py): on a
    CPU, where the kernels run in Triton's interpreter, it is ~100x faster. Validation uses it there.

quantize_kv_lloyd_max(x, rotation, clip, group_size=None, scale_dtype=torch.float32, mean=None)
fake_quantize_kv_lloyd_max(x, rotation, clip, group_size=None, mean=None, scale_dtype=torch.float32)
    OSCAR's Lloyd-Max buckets (SGLANG_LLOYD_MAX=1, oscar-spec 5; lloyd_max.py) in quantize_kv's
    format with one group per row: codes from the standardized row at +-0.981065 and 0, uniform
    decode. torch ops (CPU or GPU): clip search and validation of Lloyd-Max models use them.

Int2KVCache (cache.py): one layer's mixed cache for a batch: BF16 sink + recent rows
    [B, H, sink + recent, d], paged INT2 history [pages, H, page_size, d/4] + [.., 2G], a block
    table [B, max_pages], the rotations. `Int2KVCache.from_dense(keys, values, k_rotation,
    v_rotation, k_clip, v_clip, group_size=None, scale_dtype=float32, sink=64, recent=256,
    page_size=64, mean=None)` builds it from per-sequence [len_b, H, d] tensors, centering keys in
    both tiers when `mean` is given. Built directly (a serving engine's buffers), it is checked
    when made: dtypes, shapes, one device, contiguous buffers, and every sequence's INT2 history
    within its block table row, existing pages and max_int2_len (cache.py's docstring).

decode_attention(q, cache, sm_scale=None, out=None)
    q [B, Hq, d] (original basis, on the cache's device) -> [B, Hq, d] in q's dtype: q @ R_k, split-K attention over the
    BF16 and INT2 tiers merged by log-sum-exp, then @ R_v^T. Key centering needs no argument
    here: softmax ignores the per-query constant q . mean. group_size >= d/4, page_size >= 16.

clip_counts(clip, heads, d) -> int32 [H]: how many of a row's largest |x| reach the threshold.

References (reference.py, float64): ref_quantize_kv, ref_quantize_rotated, ref_dequantize_kv,
ref_fake_quantize_kv, ref_clip_threshold, ref_rotate, ref_attention, ref_cache_to_dense,
ref_decode_attention, literal_codes, ref_quantize_lloyd_max; the module docstring says exactly what they compute.
"""

import torch

from .cache import Int2KVCache
from .decode import decode_attention
from .dequantize import dequantize_kv
from .prepared import PreparedRotation, prepare_rotation
from .quantize import clip_counts, quantize_kv
from .vectorized import fake_quantize_kv_vectorized
from .lloyd_max import fake_quantize_kv_lloyd_max, quantize_kv_lloyd_max
from .reference import (literal_codes, ref_attention, ref_cache_to_dense, ref_clip_threshold, ref_decode_attention,
                        ref_dequantize_kv, ref_fake_quantize_kv, ref_quantize_kv, ref_quantize_lloyd_max,
                        ref_quantize_rotated, ref_rotate)


def fake_quantize_kv(x, rotation, clip, group_size=None, mean=None, scale_dtype=torch.float32) -> torch.Tensor:
    """quantize_kv then dequantize_kv: float32 [T, H, d] in the rotated (centered) basis."""
    packed, sz = quantize_kv(x, rotation, clip, group_size, scale_dtype, mean=mean)
    return dequantize_kv(packed, sz, group_size)


__all__ = [
    "Int2KVCache", "PreparedRotation", "clip_counts", "decode_attention", "dequantize_kv", "fake_quantize_kv",
    "fake_quantize_kv_lloyd_max", "fake_quantize_kv_vectorized", "quantize_kv", "quantize_kv_lloyd_max",
    "literal_codes", "ref_attention", "ref_cache_to_dense", "ref_clip_threshold", "ref_decode_attention",
    "ref_dequantize_kv", "ref_fake_quantize_kv", "ref_quantize_kv", "ref_quantize_lloyd_max", "ref_quantize_rotated",
    "prepare_rotation", "ref_rotate",
]
