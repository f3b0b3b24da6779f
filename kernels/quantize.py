"""Fused rotate (+center) + clip + INT2 quantize + pack, one pass over K or V.

A program quantizes blocks of BLOCK_T tokens of one KV head (R loaded into shared memory once).
The head_dim is handled as four quarters of d/4 (the packing order puts dims j, j+d/4, j+d/2,
j+3d/4 in byte j). The rotation is one [BLOCK_T, d] x [d, d] product (one tensor-core wait, not
four); each thread holds the same columns of every quarter, so splitting the result into
quarters moves no data and they are already in byte order.

Hopper's ALU pipe runs at half rate, so the common case keeps work on the FMA pipes and in
3-input integer min/max. Clip threshold (sort semantics, exact): the k-th largest
|x| of the row, k = d - idx (6 for ratio 0.96 at d=128). Both paths walk the row's distinct
|x| one per pass, each pass the nearest value below (or above) `u` from d = +-(|x| - u) in
float (exact sign; exact value by Sterbenz when it lies within u / 2 of u):
- k <= KFAST: k - 1 passes down from max |x| (from the row's min and max);
- larger k: from a guess. The row's mean |x| gives a gaussian quantile t0, a count of |x| >= t0
  one Newton step t1; from the better of the two, |count - k| (+ 1) passes up or down, about
  five a block whatever k is, where passes from the max would need k - 1.
Rows a path cannot vouch for (ties among the top k, a row of one sign, a wide spread among the
top values, a guess too far off) make their block redo min/max, try the estimate (if that was
not the path already: its walk does not meet the top's wide gaps), then the passes from the max,
now repeating a pass that may have rounded from just above the value it found (rows with
outliers: a few passes more, not a slow path); rows still in doubt (ties) take an exact float
path that counts multiplicities. A threshold is only ever accepted as an exact value of the
row with exactly k values at or above it. Codes are counted against three per-group
thresholds (see reference.py), which also folds the clamp in.
"""

from __future__ import annotations

import math
import warnings

import torch
import triton
import triton.language as tl
from triton.compiler.errors import CompilationError

from oscar_zoo.zoo.errors import InvalidInput

from . import _args
from ._launch import interpreted, kernel, new_buffer, sm_count
from .prepared import PreparedRotation, operands


# packed + code * 4^i in float32 (exact small integers): three compares to 1.0 / 0.0, three FMAs.
# FSET runs on the ALU pipe (half rate) and FFMA on the FMA pipes: the split keeps both busy.
_CODES = ("{ .reg .f32 a, b, c, p; set.ge.f32.f32 a, $1, $2; set.ge.f32.f32 b, $1, $3; set.ge.f32.f32 c, $1, $4; "
          "fma.rn.f32 p, a, %s, $5; fma.rn.f32 p, b, %s, p; fma.rn.f32 $0, c, %s, p; }")
CODES0 = tl.constexpr(_CODES % (("0f3F800000",) * 3))   # 1.0
CODES1 = tl.constexpr(_CODES % (("0f40800000",) * 3))   # 4.0
CODES2 = tl.constexpr(_CODES % (("0f41800000",) * 3))   # 16.0
CODES3 = tl.constexpr(_CODES % (("0f42800000",) * 3))   # 64.0
# |v| - u as int32 bits (FADD with an abs operand), and |v| >= u as 1.0 / 0.0: written as asm so
# that the compiler cannot hoist |v| out of the pass loop into 64 more registers
ABS_SUB = tl.constexpr("{ .reg .f32 t; abs.f32 t, $1; sub.f32 t, t, $2; mov.b32 $0, t; }")
# s * |v| - s * u as int32 bits (FFMA with an abs operand): s = +1 walks down from u, -1 up
SGN_ABS_SUB = tl.constexpr("{ .reg .f32 t; abs.f32 t, $1; fma.rn.f32 t, t, $2, $3; mov.b32 $0, t; }")
ABS_GE = tl.constexpr("{ .reg .f32 t; abs.f32 t, $1; set.ge.f32.f32 $0, t, $2; }")
# a group's scale and zero side by side in one store, by the threads that hold them: tl.store
# would first gather each through shared memory, behind two barriers. The four threads holding a
# row store the same bytes to the same address (one write); $0 is a dummy, inline asm needs a result
SZ_STORE32 = tl.constexpr("{ .reg .pred p; setp.ne.b32 p, $3, 0; @p st.global.b32 [$1], $2; mov.u32 $0, 0; }")
SZ_STORE64 = tl.constexpr("{ .reg .pred p; setp.ne.b32 p, $4, 0; @p st.global.v2.b32 [$1], {$2, $3}; mov.u32 $0, 0; }")


@triton.jit
def _count_abs_ge(v0, v1, v2, v3, t, BLOCK_T: tl.constexpr, Q: tl.constexpr, INTERP: tl.constexpr):
    """How many of a row's |v| (four [BT, Q] quarters) are >= t [BT]: int32 [BT]. Compiled, a
    value costs FSET.BF + FADD, both off the integer pipe."""
    u = tl.broadcast_to(t[:, None], [BLOCK_T, Q])
    if INTERP:
        ge = ((tl.abs(v0) >= u).to(tl.float32) + (tl.abs(v1) >= u).to(tl.float32)
              + (tl.abs(v2) >= u).to(tl.float32) + (tl.abs(v3) >= u).to(tl.float32))
    else:
        ge = (tl.inline_asm_elementwise(ABS_GE, "=f,f,f", [v0, u], dtype=tl.float32, is_pure=True, pack=1)
              + tl.inline_asm_elementwise(ABS_GE, "=f,f,f", [v1, u], dtype=tl.float32, is_pure=True, pack=1)
              + tl.inline_asm_elementwise(ABS_GE, "=f,f,f", [v2, u], dtype=tl.float32, is_pure=True, pack=1)
              + tl.inline_asm_elementwise(ABS_GE, "=f,f,f", [v3, u], dtype=tl.float32, is_pure=True, pack=1))
    return tl.sum(ge, axis=1).to(tl.int32)


@triton.jit
def _sgn_abs_sub(v, sg, nsu, INTERP: tl.constexpr):
    # sg * |v| - sg * u as int32 bits, rounded once (sg = +-1, nsu = -sg * u): [BT, Q]
    if INTERP:
        return (sg * tl.abs(v) + nsu).to(tl.int32, bitcast=True)
    return tl.inline_asm_elementwise(SGN_ABS_SUB, "=r,f,f,f", [v, sg, nsu], dtype=tl.int32, is_pure=True, pack=1)


@triton.jit
def _passes_from_estimate(v0, v1, v2, v3, kk, e1, e2, top, good, rmask,
                          BLOCK_T: tl.constexpr, Q: tl.constexpr, NCAP: tl.constexpr, INTERP: tl.constexpr):
    """The k-th largest |v| of each row from a guess: (thr [BT], good [BT]). e1 and e2 turn the
    row's sum of |v| into a gaussian quantile and the slope of a Newton step on the count (see
    _estimate_coefficients). A row whose guess is more than NCAP passes off is left not good."""
    s = tl.sum(tl.abs(v0) + tl.abs(v1) + tl.abs(v2) + tl.abs(v3), axis=1)          # [BT]
    t0 = s * e1
    c0 = _count_abs_ge(v0, v1, v2, v3, t0, BLOCK_T, Q, INTERP)
    # rows with outliers overshoot either way: keep t1 within (t0 / 4, max |v|]
    t1 = tl.maximum(tl.minimum(s * (e1 + (c0 - kk).to(tl.float32) * e2), top), 0.25 * t0)
    c1 = _count_abs_ge(v0, v1, v2, v3, t1, BLOCK_T, Q, INTERP)
    # from count c at t: the c-th largest is the smallest value >= t, then c - k passes up; or
    # k - c passes down from t
    n0 = tl.where(c0 >= kk, c0 - kk + 1, kk - c0)
    n1 = tl.where(c1 >= kk, c1 - kk + 1, kk - c1)
    t = tl.where(n1 < n0, t1, t0)
    up = tl.where(n1 < n0, c1, c0) >= kk
    n = tl.minimum(n0, n1)
    # (k = 0, no clip: nothing to find, and nothing to hand to the fallback)
    good = good & (((t > 0) & (t < float("inf")) & (n <= NCAP)) | (kk == 0))
    n = tl.where(good & rmask & (kk > 0), n, 0)
    sg = tl.where(up, -1.0, 1.0)
    # up: start one float below t, so that the first pass finds a value equal to t too
    u = tl.where(up, (t.to(tl.int32, bitcast=True) - 1).to(tl.float32, bitcast=True), t)
    for it in range(tl.max(n, axis=0)):
        sgb = tl.broadcast_to(sg[:, None], [BLOCK_T, Q])
        nsu = tl.broadcast_to((-sg * u)[:, None], [BLOCK_T, Q])
        dm = tl.min(tl.minimum(tl.minimum(_sgn_abs_sub(v0, sgb, nsu, INTERP), _sgn_abs_sub(v1, sgb, nsu, INTERP)),
                               tl.minimum(_sgn_abs_sub(v2, sgb, nsu, INTERP), _sgn_abs_sub(v3, sgb, nsu, INTERP))),
                    axis=1).to(tl.float32, bitcast=True)
        # a value beyond u was found (dm < 0), exactly (within u / 2 of u: Sterbenz)
        ok = (dm < 0) & (dm > -0.5 * u)
        act = it < n
        good = good & (ok | (act == 0))
        u = tl.where(act & ok, u + sg * dm, u)
    return u, good


@triton.jit
def _bf16_rne(x):
    # float32 -> bfloat16 rounded to nearest even by hand: the interpreter truncates. NaN stays
    # NaN (torch's 0x7FC0): rounding a NaN with a full payload would carry into -0.0
    b = x.to(tl.uint32, bitcast=True)
    b = tl.where(x != x, 0x7FC00000, b)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return b.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _outside_to_inf(t, thr):
    # a code edge at or below -thr is passed by every clamped value, one above thr by none
    return tl.where(t <= -thr, float("-inf"), tl.where(t > thr, float("inf"), t))


@kernel
def _quantize_kernel(
    x_ptr, r_ptr, mr_ptr, k_ptr, e_ptr, out_ptr, sz_ptr,
    T, stride_xt, stride_xh, H, NTB,
    D: tl.constexpr, NG: tl.constexpr, BLOCK_T: tl.constexpr, KMAX: tl.constexpr,
    HAS_R: tl.constexpr, R_PER_HEAD: tl.constexpr, HAS_MEAN: tl.constexpr,
    SZ_KIND: tl.constexpr, DOT_PREC: tl.constexpr, INTERP: tl.constexpr, EST: tl.constexpr,
    NCAP: tl.constexpr,
):
    # x: [T, H, D]; r: [D, D] or [H, D, D]; mr (mean @ R): [H, D] f32; k: [H] i32 clip counts;
    # e: [H, 2] f32 the estimate's coefficients (EST)
    # out: [T, H, D/4] u8; sz: [T, H, 2*NG]. Program (p, h) quantizes head h's token blocks p,
    # p + P, p + 2P, ... of NTB, with R loaded once into shared memory.
    Q: tl.constexpr = D // 4
    GS: tl.constexpr = D // NG                 # group size
    SUB: tl.constexpr = GS if GS < Q else Q    # group part inside one quarter
    NSUB: tl.constexpr = Q // SUB              # groups per quarter (1 when a group spans quarters)
    QPG: tl.constexpr = GS // SUB              # quarters per group (1 when groups are <= a quarter)
    pid_t = tl.program_id(0)
    h = tl.program_id(1)
    cq = tl.arange(0, Q)
    cd = tl.arange(0, D)
    if HAS_R:
        r_base = r_ptr + (h * D * D if R_PER_HEAD else 0)
        r = tl.load(r_base + cd[:, None] * D + cd[None, :])     # [D, D] in x's dtype (16-bit x: the tensor cores')
        if INTERP:    # the interpreter multiplies bf16 bit patterns as integers: upcast first
            r = r.to(tl.float32)
    kk = tl.load(k_ptr + h)
    e1 = tl.load(e_ptr + 2 * h)
    e2 = tl.load(e_ptr + 2 * h + 1)
    for tb in range(pid_t, NTB, tl.num_programs(0)):
        rows = tb * BLOCK_T + tl.arange(0, BLOCK_T)                           # [BT]
        rmask = rows < T
        rows64 = rows.to(tl.int64)
        x_row = x_ptr + rows64[:, None] * stride_xt + h * stride_xh           # [BT, 1]

        # ---- rotate and center: v = x @ R - mean @ R, quarters v_i = v[:, iQ:(i+1)Q] -------- [BT, Q]
        if HAS_R:
            x = tl.load(x_row + cd[None, :], mask=rmask[:, None], other=0.0)   # [BT, D]
            if INTERP:
                x = x.to(tl.float32)
            v = tl.dot(x, r, input_precision=DOT_PREC)                            # [BT, D]
            if HAS_MEAN:
                v = v - tl.load(mr_ptr + h * D + cd)[None, :]
            # quarter i is columns [iQ, (i+1)Q): registers of the same threads in the tensor cores'
            # layout, so the split moves no data
            va, vb = tl.split(tl.permute(tl.reshape(v, [BLOCK_T, 2, 2, Q]), (0, 3, 2, 1)))
            v0, v1 = tl.split(va)
            v2, v3 = tl.split(vb)
        else:
            v0 = tl.load(x_row + 0 * Q + cq[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
            v1 = tl.load(x_row + 1 * Q + cq[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
            v2 = tl.load(x_row + 2 * Q + cq[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
            v3 = tl.load(x_row + 3 * Q + cq[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
            if HAS_MEAN:
                m_row = mr_ptr + h * D + cq
                v0 = v0 - tl.load(m_row + 0 * Q)[None, :]
                v1 = v1 - tl.load(m_row + 1 * Q)[None, :]
                v2 = v2 - tl.load(m_row + 2 * Q)[None, :]
                v3 = v3 - tl.load(m_row + 3 * Q)[None, :]

        # ---- row (or group) max and min of v ----------------------------------------------------
        # One group per row: through the bit patterns as int32, a 3-input integer max per two
        # values instead of one float min or max per value. Among non-negative floats the bits
        # order like signed ints, among negative ones like unsigned ints, so the signed max is
        # max(v) when the row holds a value >= +0 and the unsigned max is min(v) when it holds
        # one with the sign bit set; other rows (of one sign) get theirs below. max |v| is exact
        # either way: a row of one sign has its largest magnitude at both maxima.
        if QPG == 4:
            b0 = v0.to(tl.int32, bitcast=True)
            b1 = v1.to(tl.int32, bitcast=True)
            b2 = v2.to(tl.int32, bitcast=True)
            b3 = v3.to(tl.int32, bitcast=True)
            smax = tl.max(tl.maximum(tl.maximum(b0, b1), tl.maximum(b2, b3)), axis=1)
            umax = tl.max(tl.maximum(tl.maximum(b0.to(tl.uint32, bitcast=True), b1.to(tl.uint32, bitcast=True)),
                                     tl.maximum(b2.to(tl.uint32, bitcast=True), b3.to(tl.uint32, bitcast=True))), axis=1)
            vmax = smax.to(tl.float32, bitcast=True)                                # [BT]
            vmin = umax.to(tl.float32, bitcast=True)
            signs = (smax >= 0) & (umax >= 0x80000000)
            good = rows >= 0
            top = tl.maximum(vmax, -vmin)                                           # max |v|
        else:
            gmx0 = tl.max(tl.reshape(v0, [BLOCK_T, NSUB, SUB]), axis=2)             # [BT, NSUB]
            gmx1 = tl.max(tl.reshape(v1, [BLOCK_T, NSUB, SUB]), axis=2)
            gmx2 = tl.max(tl.reshape(v2, [BLOCK_T, NSUB, SUB]), axis=2)
            gmx3 = tl.max(tl.reshape(v3, [BLOCK_T, NSUB, SUB]), axis=2)
            gmn0 = tl.min(tl.reshape(v0, [BLOCK_T, NSUB, SUB]), axis=2)
            gmn1 = tl.min(tl.reshape(v1, [BLOCK_T, NSUB, SUB]), axis=2)
            gmn2 = tl.min(tl.reshape(v2, [BLOCK_T, NSUB, SUB]), axis=2)
            gmn3 = tl.min(tl.reshape(v3, [BLOCK_T, NSUB, SUB]), axis=2)
            top = tl.max(tl.maximum(tl.maximum(tl.maximum(gmx0, -gmn0), tl.maximum(gmx1, -gmn1)),
                                    tl.maximum(tl.maximum(gmx2, -gmn2), tl.maximum(gmx3, -gmn3))), axis=1)
            good = rows >= 0

        # ---- clip threshold: the k-th largest |v| of the row (k = 0: no clip) -------------- [BT]
        if EST:
            thr, good = _passes_from_estimate(v0, v1, v2, v3, kk, e1, e2, top, good, rmask, BLOCK_T, Q, NCAP, INTERP)
        else:
            # k - 1 passes down from max |v|, each the next distinct value below `up`, found in
            # float: d = |v| - up (FMA pipe, sign exact) is negative exactly for the values below
            # `up`, and as int32 the negative floats order by -|d|, so the signed min picks the
            # one closest below. up + d is that value exactly when it is >= up / 2 (Sterbenz);
            # rows where that fails are marked and redone below.
            thr = top
            for it in range(kk - 1):
                u = tl.broadcast_to(thr[:, None], [BLOCK_T, Q])
                if INTERP:
                    d0 = (tl.abs(v0) - u).to(tl.int32, bitcast=True)
                    d1 = (tl.abs(v1) - u).to(tl.int32, bitcast=True)
                    d2 = (tl.abs(v2) - u).to(tl.int32, bitcast=True)
                    d3 = (tl.abs(v3) - u).to(tl.int32, bitcast=True)
                else:
                    d0 = tl.inline_asm_elementwise(ABS_SUB, "=r,f,f", [v0, u], dtype=tl.int32, is_pure=True, pack=1)
                    d1 = tl.inline_asm_elementwise(ABS_SUB, "=r,f,f", [v1, u], dtype=tl.int32, is_pure=True, pack=1)
                    d2 = tl.inline_asm_elementwise(ABS_SUB, "=r,f,f", [v2, u], dtype=tl.int32, is_pure=True, pack=1)
                    d3 = tl.inline_asm_elementwise(ABS_SUB, "=r,f,f", [v3, u], dtype=tl.int32, is_pure=True, pack=1)
                dm = tl.min(tl.minimum(tl.minimum(d0, d1), tl.minimum(d2, d3)), axis=1)
                d = dm.to(tl.float32, bitcast=True)
                m = thr + d
                good = good & (d > -0.5 * thr) & (m < thr)   # m < thr: some value was below
                thr = m
        thr = tl.where(kk > 0, thr, float("inf"))
        # ties among the top k (or fewer than k distinct values) leave more than k values >= thr
        cnt = _count_abs_ge(v0, v1, v2, v3, thr, BLOCK_T, Q, INTERP)
        walked = good           # the row's walk ended on an exact value of the row
        good = walked & ((kk == 0) | (cnt == kk))
        rare = good & signs if QPG == 4 else good       # one block-wide test on the common path
        if tl.max(tl.where(rmask & (rare == 0), 1, 0), axis=0) > 0:
            if QPG == 4:    # a row of one sign: the bit-pattern max and min were not its own
                vmax = tl.max(tl.maximum(tl.maximum(v0, v1), tl.maximum(v2, v3)), axis=1)
                vmin = tl.min(tl.minimum(tl.minimum(v0, v1), tl.minimum(v2, v3)), axis=1)
            # a rare row in the block (ties, a wide spread among the top k, a guess far off)
            redo = tl.max(tl.where(rmask & (good == 0), 1, 0), axis=0) > 0
            if not EST:
                if redo:
                    # most often a wide spread among the top k (heavy tails, outlier channels),
                    # which the estimate's walk through the middle of the row does not meet
                    thr, walked = _passes_from_estimate(v0, v1, v2, v3, kk, e1, e2, top, rmask, rmask,
                                                        BLOCK_T, Q, NCAP, INTERP)
                    thr = tl.where(kk > 0, thr, float("inf"))
                    cnt = _count_abs_ge(v0, v1, v2, v3, thr, BLOCK_T, Q, INTERP)
                    good = walked & ((kk == 0) | (cnt == kk))
                    redo = tl.max(tl.where(rmask & (good == 0), 1, 0), axis=0) > 0
            if redo:
                # a walk that ended on an exact value with other than k values at or above it met
                # a tie, as passes from the max would: only the float path counts multiplicities
                to_float = tl.max(tl.where(rmask & (walked == 0), 1, 0), axis=0) == 0
                if to_float == 0:
                    # The passes again, from the true max, with retries. A pass whose subtraction may
                    # have rounded (the next value below `up` is under up / 2: rows with outliers)
                    # still gives m within an ulp of `up` of that value, so up' = m + up * 2^-22 lies
                    # strictly between the two and the next pass finds the value again, exactly once
                    # it is >= up' / 2. Rows left with fewer than k distinct values (ties) go on below.
                    thr = top
                    up = top
                    found = tl.zeros([BLOCK_T], tl.int32)
                    alive = rmask
                    n = kk - kk     # the pass count, an int32 scalar like kk (a Python 0 cannot be loop-carried)
                    while (tl.max(tl.where(alive & (found < kk - 1), 1, 0), axis=0) > 0) & (n < kk + 64):
                        d = tl.min(tl.minimum(tl.minimum((tl.abs(v0) - up[:, None]).to(tl.int32, bitcast=True),
                                                         (tl.abs(v1) - up[:, None]).to(tl.int32, bitcast=True)),
                                              tl.minimum((tl.abs(v2) - up[:, None]).to(tl.int32, bitcast=True),
                                                         (tl.abs(v3) - up[:, None]).to(tl.int32, bitcast=True))),
                                   axis=1).to(tl.float32, bitcast=True)
                        m = up + d
                        act = alive & (found < kk - 1)
                        below = m < up
                        adv = act & below & (d > -0.5 * up)
                        thr = tl.where(adv, m, thr)
                        found = found + adv.to(tl.int32)
                        up = tl.where(adv, m, tl.where(act & below, tl.fma(up, 2.0 ** -22, m), up))
                        alive = alive & (below | (act == 0))
                        n += 1
                    thr = tl.where(kk > 0, thr, float("inf"))
                    cnt = _count_abs_ge(v0, v1, v2, v3, thr, BLOCK_T, Q, INTERP)
                    good = alive & (found >= kk - 1) & ((kk == 0) | (cnt == kk))
                    to_float = tl.max(tl.where(rmask & (good == 0), 1, 0), axis=0) > 0
                if to_float:
                    # the float path, exact for every row: the threshold is the first distinct value,
                    # from the top, with at least k values at or above it
                    upper = tl.full([BLOCK_T], float("inf"), tl.float32)
                    thr = tl.full([BLOCK_T], float("inf"), tl.float32)
                    for it in range(KMAX):
                        m = tl.max(tl.maximum(tl.maximum(tl.where(tl.abs(v0) < upper[:, None], tl.abs(v0), -1.0),
                                                         tl.where(tl.abs(v1) < upper[:, None], tl.abs(v1), -1.0)),
                                              tl.maximum(tl.where(tl.abs(v2) < upper[:, None], tl.abs(v2), -1.0),
                                                         tl.where(tl.abs(v3) < upper[:, None], tl.abs(v3), -1.0))), axis=1)
                        c = _count_abs_ge(v0, v1, v2, v3, m, BLOCK_T, Q, INTERP)
                        thr = tl.where((thr == float("inf")) & (c >= kk) & (it < kk), m, thr)
                        upper = m

        # ---- group min / max of the clamped row: clamp(max) and clamp(min) ---------- [BT, NSUB]
        if QPG == 4:
            mx0 = tl.minimum(vmax, thr)[:, None]
            mn0 = tl.maximum(vmin, -thr)[:, None]
            mx1 = mx0
            mx2 = mx0
            mx3 = mx0
            mn1 = mn0
            mn2 = mn0
            mn3 = mn0
        else:
            # both ends on both sides: a group may lie wholly above thr (or below -thr)
            hi = thr[:, None]
            mx0 = tl.minimum(tl.maximum(gmx0, -hi), hi)
            mx1 = tl.minimum(tl.maximum(gmx1, -hi), hi)
            mx2 = tl.minimum(tl.maximum(gmx2, -hi), hi)
            mx3 = tl.minimum(tl.maximum(gmx3, -hi), hi)
            mn0 = tl.maximum(tl.minimum(gmn0, hi), -hi)
            mn1 = tl.maximum(tl.minimum(gmn1, hi), -hi)
            mn2 = tl.maximum(tl.minimum(gmn2, hi), -hi)
            mn3 = tl.maximum(tl.minimum(gmn3, hi), -hi)
            if QPG == 2:    # quarters (0, 1) and (2, 3)
                mx0 = tl.maximum(mx0, mx1)
                mx2 = tl.maximum(mx2, mx3)
                mn0 = tl.minimum(mn0, mn1)
                mn2 = tl.minimum(mn2, mn3)
                mx1 = mx0
                mx3 = mx2
                mn1 = mn0
                mn3 = mn2

        # ---- per quarter: scale/zero, codes; store groups that start in this quarter ---------
        sz_row = sz_ptr + (rows64[:, None] * H + h) * (2 * NG)                  # [BT, 1]
        gsub = tl.arange(0, NSUB)[None, :]                                       # [1, NSUB]
        smask = rmask[:, None] & (gsub >= 0)
        packed = tl.zeros([BLOCK_T, Q], dtype=tl.int32)
        packed_f = tl.full([BLOCK_T, Q], 8388608.0, tl.float32)
        for i in tl.static_range(4):
            if i == 0:
                v = v0
                mx = mx0
                mn = mn0
            elif i == 1:
                v = v1
                mx = mx1
                mn = mn1
            elif i == 2:
                v = v2
                mx = mx2
                mn = mn2
            else:
                v = v3
                mx = mx3
                mn = mn3
            # scale = max(mx - mn, 1e-8) / 3 in float64 without a division (a subroutine, ~100 cycles
            # of dependent fp64 work): a * RN(1 / 3) is within an ulp, and Markstein's correction
            # step makes it the correctly rounded quotient, as the reference's division is (the
            # ulp rarely survives the rounding to float32, but can). The constants are float64 bit
            # patterns: Python floats become float32.
            a64 = tl.maximum(mx.to(tl.float64) - mn.to(tl.float64), tl.full([], 0x3E45798EE2308C3A, tl.int64).to(tl.float64, bitcast=True))
            third = tl.full([], 0x3FD5555555555555, tl.int64).to(tl.float64, bitcast=True)
            q0 = a64 * third
            scale = tl.fma(tl.fma(-q0, 3.0, a64), third, q0)                     # [BT, NSUB] f64
            scale32 = scale.to(tl.float32)
            if SZ_KIND == 1:      # float16: keep scale a normal number, zero finite
                scale32 = tl.minimum(tl.maximum(scale32, 6.103515625e-05), 65504.0)
                scale_s = scale32.to(tl.float16)
            elif SZ_KIND == 2:
                scale_s = _bf16_rne(scale32)
            else:
                scale_s = scale32
            # zero = fp32(fp64(-mn / s)) is the correctly rounded float32 quotient: with s stored (a
            # float32 or narrower) the exact quotient is never within 2^-50 of a float32 midpoint
            # unless on it, so float64's rounding cannot move it across one
            zero32 = tl.math.div_rn(-mn, scale_s.to(tl.float32))
            if SZ_KIND == 1:
                zero32 = tl.minimum(tl.maximum(zero32, -65504.0), 65504.0)
                zero_s = zero32.to(tl.float16)
            elif SZ_KIND == 2:
                zero_s = _bf16_rne(zero32)
            else:
                zero_s = zero32
            # code = #{j : clamp(v) >= t_j} with t_j = fp32((j - 1/2 - zero) * scale); a t_j outside
            # (-thr, thr] is always / never passed
            if SZ_KIND == 0:
                s64 = scale_s.to(tl.float64)
                z64 = zero_s.to(tl.float64)
                t1 = ((0.5 - z64) * s64).to(tl.float32)
                t2 = ((1.5 - z64) * s64).to(tl.float32)
                t3 = ((2.5 - z64) * s64).to(tl.float32)
            else:   # 16-bit scale and zero: zero * scale and (j - 1/2) * scale are exact in float32,
                # so one FMA rounds the exact product once, as the float64 product does
                s32 = scale_s.to(tl.float32)
                zs = -(zero_s.to(tl.float32) * s32)
                t1 = tl.fma(0.5, s32, zs)
                t2 = tl.fma(1.5, s32, zs)
                t3 = tl.fma(2.5, s32, zs)
            t1 = _outside_to_inf(t1, thr[:, None])
            t2 = _outside_to_inf(t2, thr[:, None])
            t3 = _outside_to_inf(t3, thr[:, None])
            v3d = tl.reshape(v, [BLOCK_T, NSUB, SUB])
            if INTERP:
                code = ((v3d >= t1[:, :, None]).to(tl.int32) + (v3d >= t2[:, :, None]).to(tl.int32)
                        + (v3d >= t3[:, :, None]).to(tl.int32))
                packed = packed | (tl.reshape(code, [BLOCK_T, Q]) << (2 * i))
            else:   # packed_f = 2^23 + sum_i code_i 4^i: its low mantissa byte is the packed byte
                ins = [v3d, t1[:, :, None], t2[:, :, None], t3[:, :, None], tl.reshape(packed_f, [BLOCK_T, NSUB, SUB])]
                if i == 0:
                    p3 = tl.inline_asm_elementwise(CODES0, "=f,f,f,f,f,f", ins, dtype=tl.float32, is_pure=True, pack=1)
                elif i == 1:
                    p3 = tl.inline_asm_elementwise(CODES1, "=f,f,f,f,f,f", ins, dtype=tl.float32, is_pure=True, pack=1)
                elif i == 2:
                    p3 = tl.inline_asm_elementwise(CODES2, "=f,f,f,f,f,f", ins, dtype=tl.float32, is_pure=True, pack=1)
                else:
                    p3 = tl.inline_asm_elementwise(CODES3, "=f,f,f,f,f,f", ins, dtype=tl.float32, is_pure=True, pack=1)
                packed_f = tl.reshape(p3, [BLOCK_T, Q])
            if i % QPG == 0:
                grp = (i // QPG) * NSUB + gsub                                    # [1, NSUB]
                if INTERP:
                    tl.store(sz_row + 2 * grp, scale_s, mask=smask)
                    tl.store(sz_row + 2 * grp + 1, zero_s, mask=smask)
                elif SZ_KIND == 0:
                    tl.inline_asm_elementwise(SZ_STORE64, "=r,l,r,r,r", [sz_row + 2 * grp, scale_s.to(tl.int32, bitcast=True),
                                              zero_s.to(tl.int32, bitcast=True), smask.to(tl.int32)],
                                              dtype=tl.int32, is_pure=False, pack=1)
                else:
                    pair = ((scale_s.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF)
                            | (zero_s.to(tl.int16, bitcast=True).to(tl.int32) << 16))
                    tl.inline_asm_elementwise(SZ_STORE32, "=r,l,r,r", [(sz_row + 2 * grp).to(tl.pointer_type(tl.int32)),
                                              pair, smask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)
        out_row = out_ptr + (rows64[:, None] * H + h) * Q
        if not INTERP:
            packed = packed_f.to(tl.int32, bitcast=True) & 0xFF
        tl.store(out_row + cq[None, :], packed.to(tl.uint8), mask=rmask[:, None])


_SZ_KIND = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def clip_counts(clip, heads: int, d: int) -> torch.Tensor:
    """How many of the largest |x| sit at or above the threshold, per head: k = d - idx with
    idx = int(ratio * d) clamped to [0, d-1]; 0 where nothing is clipped (ratio <= 0, or
    idx = d-1, whose threshold is max |x|). int32 [kv_heads] on the CPU."""
    ratio = _args.clip_ratios(clip, heads)
    idx = torch.clamp(torch.floor(ratio * d), 0, d - 1)
    k = (d - idx).to(torch.int32)
    return torch.where((ratio <= 0) | (k == 1), 0, k).to(torch.int32)


def _estimate_coefficients(kk: torch.Tensor, d: int) -> torch.Tensor:
    """Per head (e1, e2), float32 [H, 2], for the guess of the k-th largest |v| of a row from
    its sum s of |v|: t0 = s e1, the |gaussian| quantile k / d at the sigma the mean |v|
    gives (mean |v| = sigma sqrt(2 / pi)); t1 = s (e1 + (c0 - k) e2), one Newton step on the
    count c0 of |v| >= t0 (the row's density of |v| there is d 2 phi(z) / sigma)."""
    p = kk.double().clamp(min=1) / (2 * d)
    z = torch.special.ndtri(1 - p)
    phi = torch.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    a = math.sqrt(math.pi / 2) / d
    e = torch.stack([a * z, a / (2 * d * phi)], dim=1)
    return torch.where((kk > 0)[:, None], e, 0.0).float().contiguous()


_TABLES: dict = {}


def _tables(kk: torch.Tensor, d: int, dev: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(clip counts int32 [H], estimate coefficients f32 [H, 2]) on `dev`, made and uploaded once
    per distinct counts (no host-to-device copy per call, so quantize_kv can be captured in a
    CUDA graph; and no ndtri per call either)."""
    key = (str(dev), d, tuple(kk.tolist()))
    if key not in _TABLES:
        if len(_TABLES) > 256:
            _TABLES.clear()
        _TABLES[key] = (kk.to(dev), _estimate_coefficients(kk, d).to(dev))
    return _TABLES[key]


# Tuning (CUDA): rows per program step, warps, register cap (None: the compiler's choice), and
# programs per SM in the grid (a program loops over blocks beyond that; at <= 128 registers 4
# programs of 4 warps reside per SM)
BLOCK_T = 64
NUM_WARPS = 4
MAXNREG = 128
PROGRAMS_PER_SM = 64
# clip counts above KFAST start from an estimate (two counts, then about five passes a block
# whatever k is) instead of walking k - 1 passes down from the max. On an H100 the two tie at
# k = 10; at k = 20 the estimate is 1.4x faster, at 39 and up 1.7-1.9x (kernels-h100.md). At
# d = 128 the passes from the max take ratios >= 0.925, shipped K 0.96 among them
KFAST = 10
# a row whose estimate lands more than NCAP passes from its threshold goes to the fallback
NCAP = 16
# the common case on Hopper runs quantize_hopper.py's kernel (x tiles by TMA, in flight while a
# block computes); False runs this file's everywhere (the bench times both)
HOPPER = True
# R stays in shared memory beside the x tile up to d = 128; at 256 it alone is 256 KB in
# float32 (H100: 227 KB per block), so larger head dims are rotated by a matmul first
FUSED_MAX_D = 128


def _block_t(device: torch.device, tokens: int) -> int:
    if interpreted(device):     # few, large programs: numpy does the work
        return max(16, min(triton.next_power_of_2(max(tokens, 1)), 2048))
    return BLOCK_T


def _programs(device: torch.device, blocks: int, heads: int) -> int:
    """Programs per head: every block gets its own while they fit on the GPU at once; beyond
    that, as many as stay resident, each looping over blocks (R loaded once per program)."""
    if interpreted(device):
        return blocks
    return max(1, min(blocks, sm_count(device) * PROGRAMS_PER_SM // heads))


def quantize_kv(x: torch.Tensor, rotation: torch.Tensor | PreparedRotation | None, clip,
                group_size: int | None = None, scale_dtype: torch.dtype = torch.float32,
                mean: torch.Tensor | None = None):
    """Rotate, center, clip and INT2-quantize K or V rows. See the package docstring.
    Returns (packed uint8 [tokens, kv_heads, d/4], scales_zeros [tokens, kv_heads, 2*groups])."""
    t, h, d = _args.check_x(x)
    ng = _args.group_count(d, group_size)
    _args.check_scale_dtype(scale_dtype)
    dev = x.device
    if isinstance(rotation, PreparedRotation):
        if mean is not None:
            raise InvalidInput("a prepared rotation holds its mean: pass the mean to prepare_rotation, "
                               "not to quantize_kv")
        rotation.check(x, h, d)
        r, mr = rotation.r, rotation.mr
    else:
        _args.check_rotation(rotation, h, d)
        _args.check_mean(mean, h, d)
        r, mr = operands(rotation, mean, x.dtype, dev)
    if r is not None and d > FUSED_MAX_D:
        # R no longer fits in shared memory beside x: one matmul ahead of the kernel, with R as
        # the fused path's tensor cores would take it, then only the centering in the kernel
        xr = x.float() @ r.float() if r.dim() == 2 else torch.einsum("thd,hde->the", x.float(), r.float())
        return quantize_kv(xr, PreparedRotation(None, mr, torch.float32, dev), clip, group_size, scale_dtype)
    if x.stride(-1) != 1:
        x = x.contiguous()
    packed = new_buffer((t, h, d // 4), torch.uint8, dev)
    sz = new_buffer((t, h, 2 * ng), scale_dtype, dev)
    if t == 0:
        return packed, sz
    kk = clip_counts(clip, h, d)
    kk_dev, e_dev = _tables(kk, d, dev)
    kmax = int(kk.max())
    est = kmax > KFAST
    if HOPPER and _hopper_applies(x, r, ng) and _quantize_hopper(x, r, mr, kk_dev, e_dev, kmax, est, packed, sz,
                                                                 scale_dtype):
        return packed, sz
    bt = _block_t(dev, t)
    ntb = triton.cdiv(t, bt)
    grid = (_programs(dev, ntb, h), h)
    _quantize_kernel.on(dev)[grid](
        x, r if r is not None else x, mr if mr is not None else x, kk_dev, e_dev, packed, sz,
        t, x.stride(0), x.stride(1), h, ntb,
        D=d, NG=ng, BLOCK_T=bt, KMAX=kmax, HAS_R=r is not None, R_PER_HEAD=r is not None and r.dim() == 3,
        HAS_MEAN=mr is not None, SZ_KIND=_SZ_KIND[scale_dtype],
        DOT_PREC="ieee" if x.dtype == torch.float32 else "tf32", INTERP=interpreted(dev),
        EST=est, NCAP=NCAP,
        **({} if interpreted(dev) else _launch_options()),
    )
    return packed, sz


def _hopper_applies(x: torch.Tensor, r: torch.Tensor | None, ng: int) -> bool:
    global HOPPER
    if not x.is_cuda or interpreted(x.device) or torch.cuda.get_device_capability(x.device)[0] != 9:
        return False
    try:
        from . import quantize_hopper     # Gluon: imported only where it can run
    except (ImportError, AttributeError) as e:
        HOPPER = False
        _warn_no_gluon(e)
        return False
    return quantize_hopper.applies(x, r, ng)


def _quantize_hopper(x, r, mr, kk_dev, e_dev, kmax, est, packed, sz, scale_dtype) -> bool:
    """Run quantize_hopper.py's kernel; False (and this file's kernel from then on) where this
    Triton cannot compile it: it compiles before it launches, so nothing was written."""
    global HOPPER
    from . import quantize_hopper
    try:
        quantize_hopper.quantize(x, r, mr, kk_dev, e_dev, kmax, est, NCAP, packed, sz, scale_dtype)
    except CompilationError as e:
        HOPPER = False
        _warn_no_gluon(e)
        return False
    return True


def _warn_no_gluon(e: Exception) -> None:
    # Gluon is experimental and its API moves between Triton releases: this file's kernel
    # computes the same bits, only slower
    warnings.warn(f"oscar_zoo: the Hopper quantize kernel needs Triton's Gluon as in Triton 3.6 "
                  f"(triton {triton.__version__}: {type(e).__name__}: {(str(e).strip().splitlines() or [''])[-1]}); "
                  f"using the portable kernel (same bits, about 15% slower). `pip install triton==3.6.0` "
                  f"restores it", RuntimeWarning, stacklevel=4)


def _launch_options() -> dict:
    return {"num_warps": NUM_WARPS, **({"maxnreg": MAXNREG} if MAXNREG else {})}
