"""GQA decode attention over the mixed BF16 + INT2 cache: split-K, log-sum-exp merge, un-rotate.

Three launches. _rotate_q: q @ R_k per KV head in float32, plus stage 1's tensor-core operand
(below), once per (sequence, KV head). Stage 1, grid (batch * kv_heads, int2_splits + 1): program
(b, h, s) serves the GQA group of query heads of KV head h; split 0 covers the BF16 sink + recent
rows, splits s >= 1 stream a slice of the paged INT2 history. Each writes its normalised partial
output and its base-2 log-sum-exp (-inf when it had no tokens). Stage 2, one program per query
row: merges the splits with their LSEs and multiplies by R_v^T.

The INT2 history is never dequantized element by element. With one (scale s, zero z) per group,
q . k_hat = s * (q . c - z * sum(q)), and sum_n p_n v_hat_n = sum_n (p_n s_n) c_n - sum_n p_n s_n z_n,
so the tensor cores multiply raw codes c (0..3) and the scale/zero work is per token. Tokens are
the MMA's M dimension (s^T = codes @ q^T, o^T = codes^T @ (p s)^T), so the 4 GQA heads pad N to 8
instead of M to 16. A code becomes an fp16 operand with one LOP3 per two codes: crumb i is
masked in place, and the bits read as an fp16 subnormal, 4^i c * 2^-24, exact and without an
offset; quarter i of q is pre-scaled by 4^-i, and the 2^24 is taken out with the scale. V's
operand needs token pairs where a byte holds dims: its codes are loaded as 16-bit byte pairs,
transposed by ldmatrix, and each quarter is split into even and odd dims (VE*/VO* below), so V
never goes through shared memory as fp16.

One warp per program: the online softmax never reduces across warps, and the sums are rescaled
only when the running max grows by more than 2^TAU. Stage 1 prefetches the INT2 history into L2
a chunk of tiles ahead, so its loads wait for L2 rather than DRAM. On Hopper the three launches
are chained with programmatic dependent launch, so each one's start overlaps the previous
kernel's tail. On an H100 this is 5.4x faster than BF16 SDPA at batch 32 / 128K and 3.3x at
batch 1 / 128K (bench/results/kernels-h100.md), against a 2.25-bit byte floor of ~7x.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
import triton.language.extra.cuda  # noqa: F401  (tl.extra.cuda.gdc_*: imported for the kernels)

from oscar_zoo.zoo.errors import InvalidInput

from . import _args
from .cache import Int2KVCache
from ._launch import interpreted, kernel, new_buffer, sm_count

LOG2E = 1.4426950408889634
# Tuning (CUDA), from the H100 sweep in bench/results/kernels-h100.md. One warp per program: the
# softmax state is per warp, so no reduction crosses warps; split length aims at about
# SPLIT_PROGRAMS_PER_SM programs per SM in all.
BLOCK_N = 32
NUM_WARPS = 1
NUM_STAGES = 2
SPLIT_PROGRAMS_PER_SM = 32
MIN_SPLIT = 512
MAXNREG = 128        # register cap per thread: 16 one-warp programs per SM (None: the compiler's choice)
STAGE2_WARPS = 8     # stage 2: warps, splits per step, pipelined steps
STAGE2_WARPS_MANY = 4  # stage 2 warps when there are at least 2 query rows per SM (batch 32: 34 -> 12-17 us)
USE_PDL = True       # programmatic dependent launch (Hopper and later): a launch overlaps the previous kernel's tail
STAGE2_BLOCK_S = 32
STAGE2_STAGES = 3
PF_CHUNK = 2         # stage 1 prefetches the INT2 history to L2 in chunks of this many tiles (0: off)...
PF_AHEAD = 1         # ...this many chunks ahead of the tile it reads
TAU = 3.0            # stage 1 rescales its sums only when the running max grows past 2^TAU (0: whenever it grows)

# crumb i of four packed bytes -> four fp16 subnormals 4^i * code * 2^-24: spread bytes (0, 1)
# and (2, 3) into 16-bit halves and keep the crumb's two bits (exponent field 0). An earlier
# version ORed in 0x6400 (1024 + 4^i c): the offset, 1024x quarter 0's signal, drowned it in the
# tensor cores' fp32 accumulation error at long context (34% error at 128K).
# Byte order is kept, so the layout Triton picks for the operand does not matter.
_ASM = ("{ .reg .b32 t; prmt.b32 t, $2, 0, 0x4140; and.b32 $0, t, %s; "
        "prmt.b32 t, $2, 0, 0x4342; and.b32 $1, t, %s; }")
UNPACK0 = tl.constexpr(_ASM % ("0x00030003", "0x00030003"))
UNPACK1 = tl.constexpr(_ASM % ("0x000C000C", "0x000C000C"))
UNPACK2 = tl.constexpr(_ASM % ("0x00300030", "0x00300030"))
UNPACK3 = tl.constexpr(_ASM % ("0x00C000C0", "0x00C000C0"))
# V's codes reach the tensor cores as 16-bit pairs of bytes, transposed by ldmatrix: a register then
# holds bytes [b(n, 2c), b(n, 2c+1), b(n+1, 2c), b(n+1, 2c+1)] of tokens n, n+1. The even dim 2c of
# quarter i is crumb i of bytes 0 and 2, the odd dim 2c+1 crumb i of bytes 1 and 3: one byte spread
# and one AND give the fp16 token pair the operand needs. Each output half depends only on its own
# 16-bit input half, so this is elementwise whatever the packing.
_VASM = "{ .reg .b32 t; prmt.b32 t, $1, 0, %s; and.b32 $0, t, %s; }"
VE0 = tl.constexpr(_VASM % ("0x4240", "0x00030003"))
VE1 = tl.constexpr(_VASM % ("0x4240", "0x000C000C"))
VE2 = tl.constexpr(_VASM % ("0x4240", "0x00300030"))
VE3 = tl.constexpr(_VASM % ("0x4240", "0x00C000C0"))
VO0 = tl.constexpr(_VASM % ("0x4341", "0x00030003"))
VO1 = tl.constexpr(_VASM % ("0x4341", "0x000C000C"))
VO2 = tl.constexpr(_VASM % ("0x4341", "0x00300030"))
VO3 = tl.constexpr(_VASM % ("0x4341", "0x00C000C0"))
# L2 bulk prefetch of four byte ranges ($1..$4; sizes $5 for the codes, $6 for scale/zero), lane 0 only
PREFETCH_L2 = tl.constexpr(
    "{ .reg .pred p; .reg .u32 l; mov.u32 l, %laneid; setp.eq.u32 p, l, 0; "
    "@p cp.async.bulk.prefetch.L2.global [$1], $5; @p cp.async.bulk.prefetch.L2.global [$2], $5; "
    "@p cp.async.bulk.prefetch.L2.global [$3], $6; @p cp.async.bulk.prefetch.L2.global [$4], $6; mov.u32 $0, 0; }")


@kernel
def _stage1(
    q_ptr, qh_ptr, qv_ptr, lens_ptr, bt_ptr, stride_bt,
    kq_ptr, ksz_ptr, vq_ptr, vsz_ptr, hk_ptr, hv_ptr,
    o_ptr, lse_ptr, Hkv, qk_scale, SPLIT_LEN, NSPL,
    D: tl.constexpr, GQA: tl.constexpr, BLOCK_H: tl.constexpr, NG: tl.constexpr, P: tl.constexpr,
    SINK: tl.constexpr, RECENT: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_HP: tl.constexpr, INTERP: tl.constexpr,
    PDL: tl.constexpr, TRIGGER: tl.constexpr, PF_CHUNK: tl.constexpr, PF_AHEAD: tl.constexpr,
    TAU: tl.constexpr,
):
    # q: [B, Hq, D] f32, already @ R_k; qh: [B*Hkv, 4, D/4, BH] f16 and qv: [B*Hkv, 8, BH] f32, the
    # tensor-core operand _rotate_q made of it (compiled only); lens: [B] i32; bt: [B, *] i32
    # kq/vq: [NP, Hkv, P, D/4] u8; ksz/vsz: [NP, Hkv, P, 2*NG]; hk/hv: [B, Hkv, SINK+RECENT, D] bf16
    # o: [B, Hq, NSPL+1, D] f32; lse: [B, Hq, NSPL+1] f32 (base 2); split 0 is the BF16 tier
    Q: tl.constexpr = D // 4
    HPW: tl.constexpr = SINK + RECENT
    pid = tl.program_id(0)
    split = tl.program_id(1)
    b = pid // Hkv
    hk = pid % Hkv
    seq_len = tl.load(lens_ptr + b)
    if PDL:
        # Launched before _rotate_q finished (programmatic dependent launch): wait for its q.
        tl.extra.cuda.gdc_wait()
        if TRIGGER:     # one wave: stage 2's programs may take SM slots as soon as these free them
            tl.extra.cuda.gdc_launch_dependents()
    n_hp = tl.minimum(seq_len, HPW)
    n_sink = tl.minimum(seq_len, SINK)
    n_rec = n_hp - n_sink
    n_q = seq_len - n_hp
    heads = tl.arange(0, BLOCK_H)
    hmask = heads < GQA
    row_bh = b * (Hkv * GQA) + hk * GQA + heads                                 # [BH] query rows
    cq = tl.arange(0, Q)
    cd = tl.arange(0, D)
    lse_row = lse_ptr + row_bh.to(tl.int64) * (NSPL + 1) + split
    o_row = o_ptr + (row_bh.to(tl.int64) * (NSPL + 1) + split) * D               # [BH]

    if split == 0:
        # ---------------- BF16 sink + recent ----------------
        q = tl.load(q_ptr + row_bh[:, None] * D + cd[None, :], mask=hmask[:, None], other=0.0)   # [BH, D]
        if not INTERP:
            q = q.to(tl.bfloat16)
        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        acc = tl.zeros([BLOCK_H, D], tl.float32)
        hp_base = (b * Hkv + hk).to(tl.int64) * HPW * D
        for start in range(0, HPW, BLOCK_HP):
            r = start + tl.arange(0, BLOCK_HP)
            valid = (r < n_sink) | ((r >= SINK) & (r < SINK + n_rec))
            k = tl.load(hk_ptr + hp_base + r[:, None] * D + cd[None, :], mask=valid[:, None], other=0.0)
            v = tl.load(hv_ptr + hp_base + r[:, None] * D + cd[None, :], mask=valid[:, None], other=0.0)
            if INTERP:
                k = k.to(tl.float32)
                v = v.to(tl.float32)
            s = tl.dot(q, tl.trans(k)) * qk_scale
            s = tl.where(valid[None, :], s, float("-inf"))                          # [BH, BHP]
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_use)
            p = tl.exp2(s - m_use[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            if INTERP:
                acc = acc * alpha[:, None] + tl.dot(p, v)
            else:
                acc = acc * alpha[:, None] + tl.dot(p.to(tl.bfloat16), v)
            m_i = m_new
        l_use = tl.where(l_i == 0.0, 1.0, l_i)
        tl.store(o_row[:, None] + cd[None, :], acc / l_use[:, None], mask=hmask[:, None])
        tl.store(lse_row, tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(l_use)), mask=hmask)
    else:
        # ---------------- INT2 history, tokens [start, end) ----------------
        # Scores with tokens as the MMA's M dimension: s^T [BN, BH] = codes [BN, D] @ q^T [D, BH],
        # output transposed too: o^T [D, BH] += codes^T [D, BN] @ (p * scale)^T [BN, BH], per
        # quarter as its even and its odd dims ([D/8, BN] operands from 16-bit byte pairs).
        # Compiled, a code enters the tensor cores as the fp16 subnormal 4^i c UNIT (quarter i,
        # UNIT = 2^-24): quarter i of q is pre-scaled by 4^-i (and the program by a power of two
        # sig so max |q| < 2^14), and 4^-i / UNIT is taken out per quarter at the end (V) or
        # folded into the key scale (K). Interpreted: codes as float32.
        if INTERP:
            UNIT = 1.0
            F1 = 1.0
            F2 = 1.0
            F3 = 1.0
        else:
            UNIT = 5.9604644775390625e-08
            F1 = 0.25
            F2 = 0.0625
            F3 = 0.015625
        start = (split - 1) * SPLIT_LEN
        end = tl.minimum(start + SPLIT_LEN, n_q)
        if INTERP:
            qT = q_ptr + row_bh[None, :] * D + cq[:, None]                      # [Q, BH] (q transposed)
            q0 = tl.load(qT + 0 * Q, mask=hmask[None, :], other=0.0)
            q1 = tl.load(qT + 1 * Q, mask=hmask[None, :], other=0.0)
            q2 = tl.load(qT + 2 * Q, mask=hmask[None, :], other=0.0)
            q3 = tl.load(qT + 3 * Q, mask=hmask[None, :], other=0.0)
            qs0 = tl.sum(q0, 0)                                                  # [BH]
            qs1 = tl.sum(q1, 0)
            qs2 = tl.sum(q2, 0)
            qs3 = tl.sum(q3, 0)
            sig = 1.0
        else:       # made once per (sequence, KV head) by _rotate_q
            qh = qh_ptr + pid.to(tl.int64) * (4 * Q * BLOCK_H) + cq[:, None] * BLOCK_H + heads[None, :]
            q0 = tl.load(qh + 0 * Q * BLOCK_H)
            q1 = tl.load(qh + 1 * Q * BLOCK_H)
            q2 = tl.load(qh + 2 * Q * BLOCK_H)
            q3 = tl.load(qh + 3 * Q * BLOCK_H)
            qv = qv_ptr + pid.to(tl.int64) * (8 * BLOCK_H) + heads
            qs0 = tl.load(qv + 0 * BLOCK_H)
            qs1 = tl.load(qv + 1 * BLOCK_H)
            qs2 = tl.load(qv + 2 * BLOCK_H)
            qs3 = tl.load(qv + 3 * BLOCK_H)
            sig = tl.load(qv_ptr + pid.to(tl.int64) * (8 * BLOCK_H) + 4 * BLOCK_H)
        ksc = qk_scale / (sig * UNIT)
        zero = tl.zeros([BLOCK_N, BLOCK_H], tl.float32)
        if NG == 1:
            init0 = zero
            zq0 = (qs0 + qs1 / F1 + qs2 / F2 + qs3 / F3) * UNIT                # UNIT sig sum(q)
        elif NG == 2:
            init0 = zero
            init1 = zero
            zq0 = (qs0 + qs1 / F1) * UNIT
            zq1 = (qs2 / F2 + qs3 / F3) * UNIT
        else:
            init0 = zero
            init1 = zero
            init2 = zero
            init3 = zero
            zq0 = qs0 * UNIT
            zq1 = qs1 / F1 * UNIT
            zq2 = qs2 / F2 * UNIT
            zq3 = qs3 / F3 * UNIT
        m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_H], tl.float32)
        w2a = tl.zeros([BLOCK_H], tl.float32)     # sum_n p_n s_n z_n, per group
        w2b = tl.zeros([BLOCK_H], tl.float32)
        w2c = tl.zeros([BLOCK_H], tl.float32)
        w2d = tl.zeros([BLOCK_H], tl.float32)
        Q2: tl.constexpr = Q // 2
        acc0 = tl.zeros([Q2, BLOCK_H], tl.float32)              # o^T per quarter, its even dims (acc0: 0, 2, ...)
        acc1 = tl.zeros([Q2, BLOCK_H], tl.float32)
        acc2 = tl.zeros([Q2, BLOCK_H], tl.float32)
        acc3 = tl.zeros([Q2, BLOCK_H], tl.float32)
        odd0 = tl.zeros([Q2, BLOCK_H], tl.float32)              # ... and its odd dims
        odd1 = tl.zeros([Q2, BLOCK_H], tl.float32)
        odd2 = tl.zeros([Q2, BLOCK_H], tl.float32)
        odd3 = tl.zeros([Q2, BLOCK_H], tl.float32)
        cq2 = tl.arange(0, Q2)
        vq16 = vq_ptr.to(tl.pointer_type(tl.uint16))
        tn = tl.arange(0, BLOCK_N)
        for t0 in range(start, end, BLOCK_N):
            # a tile never crosses a page (page_size % BLOCK_N == 0, splits are whole tiles):
            # one page lookup, then BLOCK_N * d/4 contiguous bytes
            tmask = t0 + tn < end
            page = tl.load(bt_ptr + b * stride_bt + t0 // P)
            base = (page.to(tl.int64) * Hkv + hk) * P + t0 % P                       # first (page, head, slot) row
            if PF_CHUNK > 0:
                # A warp waits for each tile's loads (cp.async one tile ahead, the scales where used)
                # with too little in flight to hide DRAM's latency. So at each chunk of PF_CHUNK tiles
                # (and at the first tile, for the chunks before that) the chunk PF_AHEAD ahead goes to
                # L2, one bulk prefetch per array, and the loads wait for L2 instead. Chunks are
                # aligned, so they never cross a page.
                CT: tl.constexpr = PF_CHUNK * BLOCK_N
                if (t0 % CT == 0) | (t0 == start):
                    for c in tl.static_range(PF_AHEAD + 1):
                        tc = t0 - t0 % CT + c * CT
                        if ((c == PF_AHEAD) | (t0 == start)) & (tc < end):
                            pg = tl.load(bt_ptr + b * stride_bt + tc // P)
                            row = (pg.to(tl.int64) * Hkv + hk) * P + tc % P
                            tl.inline_asm_elementwise(PREFETCH_L2, "=r,l,l,l,l,r,r", [
                                (kq_ptr + row * Q).to(tl.int64), (vq_ptr + row * Q).to(tl.int64),
                                (ksz_ptr + row * 2 * NG).to(tl.int64), (vsz_ptr + row * 2 * NG).to(tl.int64),
                                CT * Q, CT * 2 * NG * (ksz_ptr.dtype.element_ty.primitive_bitwidth // 8)],
                                dtype=tl.int32, is_pure=False, pack=1)
            kb = tl.load(kq_ptr + base * Q + tn[:, None] * Q + cq[None, :], mask=tmask[:, None], other=0)
            # [Q2, BN]: loaded transposed, so the 16-bit pairs reach the operand through ldmatrix.trans
            vt = tl.load(vq16 + base * Q2 + tn[None, :] * Q2 + cq2[:, None], mask=tmask[None, :], other=0)
            sz_row = (base + tn) * (2 * NG)                                              # [BN]
            if INTERP:
                kb = kb.to(tl.int32)
                k0 = (kb & 3).to(tl.float32)
                k1 = ((kb >> 2) & 3).to(tl.float32)
                k2 = ((kb >> 4) & 3).to(tl.float32)
                k3 = ((kb >> 6) & 3).to(tl.float32)
            else:
                k0 = tl.inline_asm_elementwise(UNPACK0, '=r,=r,r', [kb], dtype=tl.float16, is_pure=True, pack=4)
                k1 = tl.inline_asm_elementwise(UNPACK1, '=r,=r,r', [kb], dtype=tl.float16, is_pure=True, pack=4)
                k2 = tl.inline_asm_elementwise(UNPACK2, '=r,=r,r', [kb], dtype=tl.float16, is_pure=True, pack=4)
                k3 = tl.inline_asm_elementwise(UNPACK3, '=r,=r,r', [kb], dtype=tl.float16, is_pure=True, pack=4)
            bias = tl.where(tmask, 0.0, float("-inf"))[:, None]                           # masked tokens: -inf
            ks0 = tl.load(ksz_ptr + sz_row, mask=tmask, other=0.0).to(tl.float32) * ksc
            kz0 = tl.load(ksz_ptr + sz_row + 1, mask=tmask, other=0.0).to(tl.float32)
            if NG == 1:
                s = tl.dot(k3, q3, tl.dot(k2, q2, tl.dot(k1, q1, tl.dot(k0, q0, init0))))
                s = (s - kz0[:, None] * zq0[None, :]) * ks0[:, None] + bias
            elif NG == 2:
                ks1 = tl.load(ksz_ptr + sz_row + 2, mask=tmask, other=0.0).to(tl.float32) * ksc
                kz1 = tl.load(ksz_ptr + sz_row + 3, mask=tmask, other=0.0).to(tl.float32)
                sa = tl.dot(k1, q1, tl.dot(k0, q0, init0))
                sb = tl.dot(k3, q3, tl.dot(k2, q2, init1))
                s = ((sa - kz0[:, None] * zq0[None, :]) * ks0[:, None]
                     + (sb - kz1[:, None] * zq1[None, :]) * ks1[:, None] + bias)
            else:
                ks1 = tl.load(ksz_ptr + sz_row + 2, mask=tmask, other=0.0).to(tl.float32) * ksc
                kz1 = tl.load(ksz_ptr + sz_row + 3, mask=tmask, other=0.0).to(tl.float32)
                ks2 = tl.load(ksz_ptr + sz_row + 4, mask=tmask, other=0.0).to(tl.float32) * ksc
                kz2 = tl.load(ksz_ptr + sz_row + 5, mask=tmask, other=0.0).to(tl.float32)
                ks3 = tl.load(ksz_ptr + sz_row + 6, mask=tmask, other=0.0).to(tl.float32) * ksc
                kz3 = tl.load(ksz_ptr + sz_row + 7, mask=tmask, other=0.0).to(tl.float32)
                s = ((tl.dot(k0, q0, init0) - kz0[:, None] * zq0[None, :]) * ks0[:, None]
                     + (tl.dot(k1, q1, init1) - kz1[:, None] * zq1[None, :]) * ks1[:, None]
                     + (tl.dot(k2, q2, init2) - kz2[:, None] * zq2[None, :]) * ks2[:, None]
                     + (tl.dot(k3, q3, init3) - kz3[:, None] * zq3[None, :]) * ks3[:, None] + bias)
            # The running max moves only when a score passes it by more than TAU (base 2), so most
            # tiles skip the rescale (TAU 0: whenever it grows); p <= 2^TAU stays well inside fp16
            # once multiplied by the V scale. Exact either way: the max cancels between sums and l.
            m_tile = tl.max(s, 0)
            if tl.max(m_tile - m_i, 0) > TAU:
                m_new = tl.maximum(m_i, m_tile)
                alpha = tl.exp2(m_i - m_new)          # 0 at the first tile (m_i = -inf)
                l_i = l_i * alpha
                w2a = w2a * alpha
                w2b = w2b * alpha
                w2c = w2c * alpha
                w2d = w2d * alpha
                acc0 = acc0 * alpha[None, :]
                acc1 = acc1 * alpha[None, :]
                acc2 = acc2 * alpha[None, :]
                acc3 = acc3 * alpha[None, :]
                odd0 = odd0 * alpha[None, :]
                odd1 = odd1 * alpha[None, :]
                odd2 = odd2 * alpha[None, :]
                odd3 = odd3 * alpha[None, :]
                m_i = m_new
            p = tl.exp2(s - m_i[None, :])
            l_i = l_i + tl.sum(p, 0)
            if INTERP:
                vt = vt.to(tl.int32)
                e0 = (vt & 3).to(tl.float32)
                e1 = ((vt >> 2) & 3).to(tl.float32)
                e2 = ((vt >> 4) & 3).to(tl.float32)
                e3 = ((vt >> 6) & 3).to(tl.float32)
                o0 = ((vt >> 8) & 3).to(tl.float32)
                o1 = ((vt >> 10) & 3).to(tl.float32)
                o2 = ((vt >> 12) & 3).to(tl.float32)
                o3 = ((vt >> 14) & 3).to(tl.float32)
            else:
                e0 = tl.inline_asm_elementwise(VE0, '=r,r', [vt], dtype=tl.float16, is_pure=True, pack=2)
                e1 = tl.inline_asm_elementwise(VE1, '=r,r', [vt], dtype=tl.float16, is_pure=True, pack=2)
                e2 = tl.inline_asm_elementwise(VE2, '=r,r', [vt], dtype=tl.float16, is_pure=True, pack=2)
                e3 = tl.inline_asm_elementwise(VE3, '=r,r', [vt], dtype=tl.float16, is_pure=True, pack=2)
                o0 = tl.inline_asm_elementwise(VO0, '=r,r', [vt], dtype=tl.float16, is_pure=True, pack=2)
                o1 = tl.inline_asm_elementwise(VO1, '=r,r', [vt], dtype=tl.float16, is_pure=True, pack=2)
                o2 = tl.inline_asm_elementwise(VO2, '=r,r', [vt], dtype=tl.float16, is_pure=True, pack=2)
                o3 = tl.inline_asm_elementwise(VO3, '=r,r', [vt], dtype=tl.float16, is_pure=True, pack=2)
            vs0 = tl.load(vsz_ptr + sz_row, mask=tmask, other=0.0).to(tl.float32)
            vz0 = tl.load(vsz_ptr + sz_row + 1, mask=tmask, other=0.0).to(tl.float32)
            if INTERP:
                pa = p * vs0[:, None]
            else:
                pa = (p * vs0[:, None]).to(tl.float16)
            paf = pa.to(tl.float32)
            w2a = w2a + tl.sum(paf * vz0[:, None], 0)
            acc0 = tl.dot(e0, pa, acc0)
            odd0 = tl.dot(o0, pa, odd0)
            if NG == 1:
                acc1 = tl.dot(e1, pa, acc1)
                odd1 = tl.dot(o1, pa, odd1)
                acc2 = tl.dot(e2, pa, acc2)
                odd2 = tl.dot(o2, pa, odd2)
                acc3 = tl.dot(e3, pa, acc3)
                odd3 = tl.dot(o3, pa, odd3)
            else:
                vs1 = tl.load(vsz_ptr + sz_row + 2, mask=tmask, other=0.0).to(tl.float32)
                vz1 = tl.load(vsz_ptr + sz_row + 3, mask=tmask, other=0.0).to(tl.float32)
                if INTERP:
                    pb = p * vs1[:, None]
                else:
                    pb = (p * vs1[:, None]).to(tl.float16)
                pbf = pb.to(tl.float32)
                w2b = w2b + tl.sum(pbf * vz1[:, None], 0)
                if NG == 2:
                    acc1 = tl.dot(e1, pa, acc1)
                    odd1 = tl.dot(o1, pa, odd1)
                    acc2 = tl.dot(e2, pb, acc2)
                    odd2 = tl.dot(o2, pb, odd2)
                    acc3 = tl.dot(e3, pb, acc3)
                    odd3 = tl.dot(o3, pb, odd3)
                else:
                    vs2 = tl.load(vsz_ptr + sz_row + 4, mask=tmask, other=0.0).to(tl.float32)
                    vz2 = tl.load(vsz_ptr + sz_row + 5, mask=tmask, other=0.0).to(tl.float32)
                    vs3 = tl.load(vsz_ptr + sz_row + 6, mask=tmask, other=0.0).to(tl.float32)
                    vz3 = tl.load(vsz_ptr + sz_row + 7, mask=tmask, other=0.0).to(tl.float32)
                    if INTERP:
                        pc = p * vs2[:, None]
                        pd = p * vs3[:, None]
                    else:
                        pc = (p * vs2[:, None]).to(tl.float16)
                        pd = (p * vs3[:, None]).to(tl.float16)
                    pcf = pc.to(tl.float32)
                    pdf = pd.to(tl.float32)
                    w2c = w2c + tl.sum(pcf * vz2[:, None], 0)
                    w2d = w2d + tl.sum(pdf * vz3[:, None], 0)
                    acc1 = tl.dot(e1, pb, acc1)
                    odd1 = tl.dot(o1, pb, odd1)
                    acc2 = tl.dot(e2, pc, acc2)
                    odd2 = tl.dot(o2, pc, odd2)
                    acc3 = tl.dot(e3, pd, acc3)
                    odd3 = tl.dot(o3, pd, odd3)
        # quarter i: acc_i 4^-i / UNIT - w2 over the quarter's group, then / l
        if NG == 1:
            w2b = w2a
            w2c = w2a
            w2d = w2a
        elif NG == 2:
            w2d = w2b
            w2c = w2b
            w2b = w2a
        l_use = tl.where(l_i == 0.0, 1.0, l_i)
        o_q = o_row[None, :] + 2 * cq2[:, None]                                           # [Q2, BH]: even dims
        G0 = 1.0 / UNIT
        G1 = F1 / UNIT
        G2 = F2 / UNIT
        G3 = F3 / UNIT
        tl.store(o_q + 0 * Q, (acc0 * G0 - w2a[None, :]) / l_use[None, :], mask=hmask[None, :])
        tl.store(o_q + 0 * Q + 1, (odd0 * G0 - w2a[None, :]) / l_use[None, :], mask=hmask[None, :])
        tl.store(o_q + 1 * Q, (acc1 * G1 - w2b[None, :]) / l_use[None, :], mask=hmask[None, :])
        tl.store(o_q + 1 * Q + 1, (odd1 * G1 - w2b[None, :]) / l_use[None, :], mask=hmask[None, :])
        tl.store(o_q + 2 * Q, (acc2 * G2 - w2c[None, :]) / l_use[None, :], mask=hmask[None, :])
        tl.store(o_q + 2 * Q + 1, (odd2 * G2 - w2c[None, :]) / l_use[None, :], mask=hmask[None, :])
        tl.store(o_q + 3 * Q, (acc3 * G3 - w2d[None, :]) / l_use[None, :], mask=hmask[None, :])
        tl.store(o_q + 3 * Q + 1, (odd3 * G3 - w2d[None, :]) / l_use[None, :], mask=hmask[None, :])
        tl.store(lse_row, tl.where(l_i == 0.0, float("-inf"), m_i + tl.log2(l_use)), mask=hmask)


@kernel
def _rotate_q(
    q_ptr, r_ptr, out_ptr, qh_ptr, qv_ptr, Hkv,
    D: tl.constexpr, GQA: tl.constexpr, BLOCK_H: tl.constexpr, HAS_R: tl.constexpr, R_PER_HEAD: tl.constexpr,
    PDL: tl.constexpr,
):
    # q: [B, Hq, D] any float; r: [D, D] or [Hkv, D, D] f32. Program (b * Hkv + hk, i) writes
    # quarter i of q @ R_k for the GQA group: out [B, Hq, D] f32, and stage 1's tensor-core operand:
    # qh [B*Hkv, 4, D/4, BH] f16 = (q @ R_k) * sig * 4^-i transposed, qv [B*Hkv, 8, BH] f32 with the
    # sums of qh's rows (the rounded values) in rows 0..3 and sig in row 4. sig is a power of two
    # with max ||q_h|| * sig < 2^14, so no |q @ R_k| (R_k orthogonal) overflows fp16.
    Q: tl.constexpr = D // 4
    if PDL:         # stage 1 may launch now; it waits for this grid before it reads q
        tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0)
    i = tl.program_id(1)
    hk = pid % Hkv
    heads = tl.arange(0, BLOCK_H)
    hmask = heads < GQA
    cd = tl.arange(0, D)
    cq = tl.arange(0, Q)
    rows = (pid * GQA + heads).to(tl.int64)
    q = tl.load(q_ptr + rows[:, None] * D + cd[None, :], mask=hmask[:, None], other=0.0).to(tl.float32)
    nrm = tl.sqrt(tl.max(tl.sum(q * q, axis=1), axis=0))
    ex = tl.minimum(tl.maximum((nrm.to(tl.int32, bitcast=True) >> 23) & 0xFF, 14), 254)
    sig = ((267 - ex) << 23).to(tl.float32, bitcast=True)                  # 2^(140 - ex), exact
    if HAS_R:
        r = tl.load(r_ptr + (hk * D * D if R_PER_HEAD else 0) + cd[:, None] * D + (i * Q + cq)[None, :])  # [D, Q]
        qi = tl.dot(q, r, input_precision="ieee")                                        # [BH, Q]
    else:
        qi = tl.load(q_ptr + rows[:, None] * D + (i * Q + cq)[None, :], mask=hmask[:, None], other=0.0).to(tl.float32)
    tl.store(out_ptr + rows[:, None] * D + (i * Q + cq)[None, :], qi, mask=hmask[:, None])
    fi = ((127 - 2 * i) << 23).to(tl.float32, bitcast=True)                               # 4^-i
    qh = (qi * (sig * fi)).to(tl.float16)
    base = pid.to(tl.int64) * (4 * Q * BLOCK_H) + i * (Q * BLOCK_H)
    tl.store(qh_ptr + base + cq[None, :] * BLOCK_H + heads[:, None], qh)
    qv = qv_ptr + pid.to(tl.int64) * (8 * BLOCK_H)
    tl.store(qv + i * BLOCK_H + heads, tl.sum(qh.to(tl.float32), axis=1))
    if i == 0:
        tl.store(qv + 4 * BLOCK_H + heads, tl.zeros([BLOCK_H], tl.float32) + sig)


@kernel
def _stage2(
    o_ptr, lse_ptr, rv_ptr, out_ptr, Hq, NS,
    D: tl.constexpr, GQA: tl.constexpr, BLOCK_S: tl.constexpr,
    HAS_RV: tl.constexpr, RV_PER_HEAD: tl.constexpr, STAGES: tl.constexpr, PDL: tl.constexpr,
):
    # o: [B*Hq, NS, D] f32; lse: [B*Hq, NS]; rv: [D, D] or [Hkv, D, D] f32; out: [B*Hq, D] (any float)
    pid = tl.program_id(0)
    hk = (pid % Hq) // GQA
    cd = tl.arange(0, D)
    lse_row = lse_ptr + pid.to(tl.int64) * NS
    if HAS_RV:      # issued first: its latency overlaps the merge
        r = tl.load(rv_ptr + (hk * D * D if RV_PER_HEAD else 0) + cd[:, None] * D + cd[None, :])    # [D, D]: R_v[e, d]
    if PDL:         # launched before stage 1 finished: wait for its partial outputs
        tl.extra.cuda.gdc_wait()
    # the largest LSE first (NS floats), then one streaming pass with fixed weights: no rescaling and
    # no reduction across warps until the end
    m = tl.full([1024], float("-inf"), tl.float32)
    for s0 in range(0, NS, 1024):
        s = s0 + tl.arange(0, 1024)
        m = tl.maximum(m, tl.load(lse_row + s, mask=s < NS, other=float("-inf")))
    m_use = tl.max(m, axis=0)
    m_use = tl.where(m_use == float("-inf"), 0.0, m_use)
    acc2 = tl.zeros([BLOCK_S, D], tl.float32)
    l2 = tl.zeros([BLOCK_S], tl.float32)
    for s0 in tl.range(0, NS, BLOCK_S, num_stages=STAGES):     # loads of later blocks in flight
        s = s0 + tl.arange(0, BLOCK_S)
        lse = tl.load(lse_row + s, mask=s < NS, other=float("-inf"))
        o = tl.load(o_ptr + (pid.to(tl.int64) * NS + s)[:, None] * D + cd[None, :], mask=(s < NS)[:, None], other=0.0)
        w = tl.where(lse == float("-inf"), 0.0, tl.exp2(lse - m_use))              # [BS]
        acc2 += w[:, None] * tl.where((lse > float("-inf"))[:, None], o, 0.0)    # empty splits may hold anything
        l2 += w
    acc = tl.sum(acc2, axis=0)
    l_sum = tl.sum(l2, axis=0)
    acc = acc / tl.where(l_sum == 0.0, 1.0, l_sum)                                    # [D], rotated basis
    out_row = out_ptr + pid.to(tl.int64) * D
    if HAS_RV:      # out = acc @ R_v^T: out[e] = sum_d acc[d] R_v[e, d]
        tl.store(out_row + cd, tl.sum(r * acc[None, :], axis=1))
    else:
        tl.store(out_row + cd, acc)


def _pdl(device: torch.device) -> bool:
    return USE_PDL and _pdl_capable(torch.cuda.current_device() if device.index is None else device.index)


@functools.lru_cache(maxsize=None)
def _pdl_capable(index: int) -> bool:
    """Programmatic dependent launch: Hopper or later, and a Triton that passes it to the driver.
    Asked once per GPU, not on every decode step."""
    if torch.cuda.get_device_capability(index)[0] < 9:
        return False
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:     # pragma: no cover - a Triton without the NVIDIA backend
        return False
    return "launch_pdl" in CUDAOptions.__dataclass_fields__


def _pf_chunk(page_size: int, block_n: int) -> int:
    """Tiles per L2 prefetch: at most PF_CHUNK, and a chunk never crosses a page."""
    tiles = page_size // block_n
    return next((c for c in range(min(PF_CHUNK, tiles), 0, -1) if tiles % c == 0), 0)


def _splits(cache: Int2KVCache, pairs: int, block_n: int, device: torch.device) -> tuple[int, int]:
    """(number of INT2 splits, tokens per split): enough programs to fill the GPU."""
    n = cache.max_int2_len
    if n == 0:
        return 0, block_n
    if interpreted(device):
        per = max(triton.next_power_of_2(n), block_n)
        return triton.cdiv(n, per), per
    want = max(1, SPLIT_PROGRAMS_PER_SM * sm_count(device) // max(pairs, 1))
    per = max(MIN_SPLIT, triton.cdiv(n, want))
    per = triton.cdiv(per, block_n) * block_n
    return triton.cdiv(n, per), per


def _check_q_out(q: torch.Tensor, out: torch.Tensor | None) -> None:
    if q.dim() != 3 or q.dtype not in _args.FLOAT_DTYPES:
        raise InvalidInput(f"q must be a float32, float16 or bfloat16 [batch, q_heads, head_dim] "
                           f"tensor, got {q.dtype} of shape {tuple(q.shape)}.")
    if out is not None and (out.shape != q.shape or not out.dtype.is_floating_point):
        raise InvalidInput(f"out must be a float tensor of q's shape {tuple(q.shape)}, got {out.dtype} "
                           f"of shape {tuple(out.shape)}.")


def decode_attention(q: torch.Tensor, cache: Int2KVCache, sm_scale: float | None = None,
                     out: torch.Tensor | None = None) -> torch.Tensor:
    """One decode step of GQA attention over `cache`. q: [batch, q_heads, d] (original basis).
    Returns [batch, q_heads, d] in q's dtype (or writes `out`)."""
    _check_q_out(q, out)
    if q.device != cache.hp_k.device:
        raise InvalidInput(f"q is on {q.device} but the cache on {cache.hp_k.device}: move q there with "
                           f"q.to('{cache.hp_k.device}'), or build the cache on q's device.")
    bsz, hq, d = q.shape
    hkv = cache.hp_k.shape[1]
    if hq % hkv or tuple(cache.hp_k.shape[0::3]) != (bsz, d):
        raise InvalidInput(f"q {tuple(q.shape)} does not match the cache: batch {cache.hp_k.shape[0]}, "
                           f"{hkv} KV heads, head_dim {cache.hp_k.shape[3]}.")
    ng = d // cache.group_size
    if ng > 4:
        raise InvalidInput(f"decode_attention needs group_size >= head_dim/4 ({d // 4}), got {cache.group_size}.")
    if cache.page_size < 16:
        raise InvalidInput(f"decode_attention needs page_size >= 16 (a tile of 16 tokens feeds the tensor "
                           f"cores and never crosses a page), got {cache.page_size}.")
    gqa = hq // hkv
    dev = q.device
    sm_scale = 1.0 / math.sqrt(d) if sm_scale is None else float(sm_scale)
    interp = interpreted(dev)
    # q @ R_k per KV head in float32; stage 1 rounds it for the tensor cores
    block_h = triton.next_power_of_2(gqa) if interp else max(8, triton.next_power_of_2(gqa))
    q_rot = new_buffer((bsz, hq, d), torch.float32, dev)
    qh = new_buffer((bsz * hkv, 4, d // 4, block_h), torch.float16, dev)
    qv = new_buffer((bsz * hkv, 8, block_h), torch.float32, dev)
    rk = cache.k_rotation
    pdl = not interp and _pdl(dev)
    _rotate_q.on(dev)[(bsz * hkv, 4)](
        q.contiguous(), rk if rk is not None else q_rot, q_rot, qh, qv, hkv, D=d, GQA=gqa,
        BLOCK_H=block_h, HAS_R=rk is not None, R_PER_HEAD=rk is not None and rk.dim() == 3, PDL=pdl)
    block_n = min(64 if interp else BLOCK_N, cache.page_size)
    nspl, split_len = _splits(cache, bsz * hkv, block_n, dev)
    ns = nspl + 1
    o_part = new_buffer((bsz, hq, ns, d), torch.float32, dev)
    lse = new_buffer((bsz, hq, ns), torch.float32, dev)
    extra = {} if interp else {"num_warps": NUM_WARPS, "num_stages": NUM_STAGES}
    if MAXNREG and not interp:
        extra["maxnreg"] = MAXNREG
    sms = 0 if interp else sm_count(dev)
    resident = 65536 // (32 * NUM_WARPS * (MAXNREG or 255))     # stage-1 programs an SM holds (registers)
    one_wave = not interp and bsz * hkv * ns <= resident * sms
    _stage1.on(dev)[(bsz * hkv, ns)](
        q_rot, qh, qv, cache.seq_lens, cache.block_table, cache.block_table.stride(0),
        cache.k_packed, cache.k_sz, cache.v_packed, cache.v_sz, cache.hp_k, cache.hp_v,
        o_part, lse, hkv, sm_scale * LOG2E, split_len, nspl,
        D=d, GQA=gqa, BLOCK_H=block_h, NG=ng, P=cache.page_size, SINK=cache.sink, RECENT=cache.recent,
        BLOCK_N=block_n,
        BLOCK_HP=16 if not interp else max(16, min(64, triton.next_power_of_2(max(cache.sink + cache.recent, 1)))),
        INTERP=interp, PDL=pdl, TRIGGER=one_wave, PF_CHUNK=0 if interp else _pf_chunk(cache.page_size, block_n),
        PF_AHEAD=PF_AHEAD, TAU=TAU, **extra, **({"launch_pdl": True} if pdl else {}),
    )
    direct = out is not None and out.is_contiguous() and out.shape == q.shape and out.device == dev
    res = out if direct else new_buffer((bsz, hq, d), q.dtype, dev)
    rv = cache.v_rotation
    _stage2.on(dev)[(bsz * hq,)](
        o_part, lse, rv if rv is not None else o_part, res, hq, ns,
        D=d, GQA=gqa, BLOCK_S=min(STAGE2_BLOCK_S, triton.next_power_of_2(ns)),
        HAS_RV=rv is not None, RV_PER_HEAD=rv is not None and rv.dim() == 3, STAGES=STAGE2_STAGES, PDL=pdl,
        **({} if interp else {"num_warps": STAGE2_WARPS if bsz * hq < 2 * sms else STAGE2_WARPS_MANY}),
        **({"launch_pdl": True} if pdl else {}),
    )
    if out is None or direct:
        return res
    out.copy_(res)
    return out
