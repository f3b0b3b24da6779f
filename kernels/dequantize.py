"""INT2 unpack + dequantize back to the rotated basis: x = (code - zero) * scale, in float32."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import _args
from ._launch import interpreted, kernel, new_buffer


@kernel
def _dequantize_kernel(
    p_ptr, sz_ptr, out_ptr, T, H,
    D: tl.constexpr, NG: tl.constexpr, BLOCK_T: tl.constexpr,
):
    # p: [T, H, D/4] u8; sz: [T, H, 2*NG]; out: [T, H, D] f32
    Q: tl.constexpr = D // 4
    GS: tl.constexpr = D // NG
    pid_t = tl.program_id(0)
    h = tl.program_id(1)
    rows = (pid_t * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)               # [BT]
    rmask = rows < T
    cq = tl.arange(0, Q)
    byte = tl.load(p_ptr + (rows[:, None] * H + h) * Q + cq[None, :], mask=rmask[:, None], other=0)
    byte = byte.to(tl.int32)                                                     # [BT, Q]
    sz_row = sz_ptr + (rows[:, None] * H + h) * (2 * NG)
    out_row = out_ptr + (rows[:, None] * H + h) * D
    for i in tl.static_range(4):
        grp = (i * Q + cq[None, :]) // GS                                        # [1, Q]
        scale = tl.load(sz_row + 2 * grp, mask=rmask[:, None], other=1.0).to(tl.float32)
        zero = tl.load(sz_row + 2 * grp + 1, mask=rmask[:, None], other=0.0).to(tl.float32)
        code = ((byte >> (2 * i)) & 3).to(tl.float32)
        tl.store(out_row + i * Q + cq[None, :], (code - zero) * scale, mask=rmask[:, None])


def dequantize_kv(packed: torch.Tensor, scales_zeros: torch.Tensor, group_size: int | None = None) -> torch.Tensor:
    """packed uint8 [tokens, kv_heads, d/4] + scales_zeros [tokens, kv_heads, 2*groups] ->
    float32 [tokens, kv_heads, d] in the rotated (and centered) basis."""
    if packed.dim() != 3 or packed.dtype != torch.uint8:
        raise _args.InvalidInput(f"packed must be uint8 [tokens, kv_heads, d/4], got {packed.dtype} "
                                 f"{tuple(packed.shape)}.")
    t, h, q = packed.shape
    d = 4 * q
    _args.check_head_dim(d)
    ng = _args.group_count(d, group_size)
    _args.check_scale_dtype(scales_zeros.dtype)
    if tuple(scales_zeros.shape) != (t, h, 2 * ng):
        raise _args.InvalidInput(f"scales_zeros must be [{t}, {h}, {2 * ng}] for group_size={d // ng}, "
                                 f"got {tuple(scales_zeros.shape)}.")
    if scales_zeros.device != packed.device:
        raise _args.InvalidInput(f"scales_zeros is on {scales_zeros.device} but packed on {packed.device}: "
                                 f"move one with .to() so both are on the same device.")
    packed, scales_zeros = packed.contiguous(), scales_zeros.contiguous()
    out = new_buffer((t, h, d), torch.float32, packed.device)
    if t:
        bt = max(16, min(triton.next_power_of_2(t), 2048)) if interpreted(packed.device) else 64
        _dequantize_kernel.on(packed.device)[(triton.cdiv(t, bt), h)](
            packed, scales_zeros, out, t, h, D=d, NG=ng, BLOCK_T=bt)
    return out
