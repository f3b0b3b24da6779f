"""quantize_kv's common case on Hopper in Gluon: x tiles by TMA, refilled while a block computes.

The Triton kernel (quantize.py) waits for each block's x tile: Triton's pipeliner gives up on a
loop that holds the clip passes' loop, and prefetching in registers or a second shared buffer
costs the fourth program on the SM (kernels-notes.md). Here one x buffer is refilled by TMA as
soon as the tensor cores have read it, so the next tile is in flight during the passes, codes
and stores. Same arithmetic as quantize.py's fast path, bit for bit: one [BT, D] x [D, D]
product split into the packing order's quarters (registers of the same threads); k - 1 passes
down from the max (or from an estimate, for larger k); the tie count. A block that any row cannot vouch for redoes the passes in
place, from the true max with retries (rows with outliers), then, for rows with ties, an exact
float path (the first distinct value from the top with at least k values at or above it), so no
block leaves this kernel unchecked.

Taken for: CUDA capability 9.x, 16-bit x whose heads are contiguous (TMA), a rotation, d = 128,
one group per row; clip counts above quantize.KFAST start from quantize.py's estimate here too.
Everything else runs quantize.py. The CPU
interpreter cannot run Gluon: the kernel tests run this file on the GPU only.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import mbarrier, tma, warpgroup_mma, warpgroup_mma_wait
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ._launch import sm_count
# the asm of quantize.py's kernel: |v| - u as int32 bits, |v| >= u as 1.0 / 0.0, codes, and the
# scale/zero stores by the threads that hold them
from .quantize import ABS_GE, ABS_SUB, CODES0, CODES1, CODES2, CODES3, SGN_ABS_SUB, SZ_STORE32, SZ_STORE64

BLOCK_T = 64
NUM_WARPS = 4
MAXNREG = 128
# programs per SM in the grid: 4 reside (128 registers, ~51 KB shared memory each); a program
# loops over blocks beyond that. 4, 8, 16 and 64 measured within 0.01 ms of each other (H100)
PROGRAMS_PER_SM = 16


@gluon.jit
def _abs_sub(v, u):
    return gl.inline_asm_elementwise(ABS_SUB, "=r,f,f", [v, u], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _abs_ge(v, u):
    return gl.inline_asm_elementwise(ABS_GE, "=f,f,f", [v, u], dtype=gl.float32, is_pure=True, pack=1)


@gluon.jit
def _count_abs_ge(v0, v1, v2, v3, t):
    # how many of a row's |v| are >= t [BT]: int32 [BT]
    u = gl.broadcast(gl.expand_dims(t, 1), v0)[0]
    ge = _abs_ge(v0, u) + _abs_ge(v1, u) + _abs_ge(v2, u) + _abs_ge(v3, u)
    return gl.sum(ge, axis=1).to(gl.int32)


@gluon.jit
def _rows_max(v0, v1, v2, v3):
    return gl.max(gl.maximum(gl.maximum(v0, v1), gl.maximum(v2, v3)), axis=1)


@gluon.jit
def _rows_min(v0, v1, v2, v3):
    # min, not -max(-v): quantize.py's, so that the sign of a zero minimum is the same
    return gl.min(gl.minimum(gl.minimum(v0, v1), gl.minimum(v2, v3)), axis=1)


@gluon.jit
def _exact_threshold(v0, v1, v2, v3, kk, KMAX: gl.constexpr):
    """The k-th largest |v| of every row, ties counted: the first distinct value from the top
    with at least k values at or above it (inf for k = 0). The slow path: KMAX max passes."""
    a0 = gl.abs(v0)
    a1 = gl.abs(v1)
    a2 = gl.abs(v2)
    a3 = gl.abs(v3)
    upper = gl.full_like(gl.max(a0, axis=1), float("inf"))
    thr = upper
    for it in range(KMAX):
        ub = gl.broadcast(gl.expand_dims(upper, 1), a0)[0]
        m = _rows_max(gl.where(a0 < ub, a0, -1.0), gl.where(a1 < ub, a1, -1.0),
                      gl.where(a2 < ub, a2, -1.0), gl.where(a3 < ub, a3, -1.0))
        c = _count_abs_ge(v0, v1, v2, v3, m)
        thr = gl.where((thr == float("inf")) & (c >= kk) & (it < kk), m, thr)
        upper = m
    return thr


@gluon.jit
def _sgn_abs_sub(v, sg, nsu):
    return gl.inline_asm_elementwise(SGN_ABS_SUB, "=r,f,f,f", [v, sg, nsu], dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def _passes_from_estimate(v0, v1, v2, v3, kk, e1, e2, top, live, NCAP: gl.constexpr):
    """The k-th largest |v| of each row from a guess, as quantize.py's _passes_from_estimate:
    (thr [BT], good [BT]); a row whose guess is more than NCAP passes off is left not good."""
    s = gl.sum(gl.abs(v0) + gl.abs(v1) + gl.abs(v2) + gl.abs(v3), axis=1)           # [BT]
    t0 = s * e1
    c0 = _count_abs_ge(v0, v1, v2, v3, t0)
    # rows with outliers overshoot either way: keep t1 within (t0 / 4, max |v|]
    t1 = gl.maximum(gl.minimum(s * (e1 + (c0 - kk).to(gl.float32) * e2), top), 0.25 * t0)
    c1 = _count_abs_ge(v0, v1, v2, v3, t1)
    n0 = gl.where(c0 >= kk, c0 - kk + 1, kk - c0)
    n1 = gl.where(c1 >= kk, c1 - kk + 1, kk - c1)
    t = gl.where(n1 < n0, t1, t0)
    up = gl.where(n1 < n0, c1, c0) >= kk
    n = gl.minimum(n0, n1)
    good = ((t > 0) & (t < float("inf")) & (n <= NCAP)) | (kk == 0)
    n = gl.where(good & live & (kk > 0), n, 0)
    sg = gl.where(up, -1.0, 1.0)
    # up: start one float below t, so that the first pass finds a value equal to t too
    u = gl.where(up, (t.to(gl.int32, bitcast=True) - 1).to(gl.float32, bitcast=True), t)
    for it in range(gl.max(n, axis=0)):
        sgb = gl.broadcast(gl.expand_dims(sg, 1), v0)[0]
        nsu = gl.broadcast(gl.expand_dims(-sg * u, 1), v0)[0]
        dm = gl.min(gl.minimum(gl.minimum(_sgn_abs_sub(v0, sgb, nsu), _sgn_abs_sub(v1, sgb, nsu)),
                               gl.minimum(_sgn_abs_sub(v2, sgb, nsu), _sgn_abs_sub(v3, sgb, nsu))),
                    axis=1).to(gl.float32, bitcast=True)
        # a value beyond u was found (dm < 0), exactly (within u / 2 of u: Sterbenz)
        ok = (dm < 0) & (dm > -0.5 * u)
        act = it < n
        good = good & (ok | (act == 0))
        u = gl.where(act & ok, u + sg * dm, u)
    return u, good


@gluon.jit
def _passes_with_retries(v0, v1, v2, v3, top, kk, live):
    """The k-th largest |v| by passes down from the true max `top`, retrying a pass whose
    subtraction may have rounded (the next value below `up` is under up / 2: rows with outliers),
    as quantize.py's fallback does: (thr [BT], good [BT]); rows with ties are left not good."""
    thr = top
    up = top
    found = gl.full_like(top, 0, dtype=gl.int32)
    alive = live
    n = kk - kk
    while (gl.max(gl.where(alive & (found < kk - 1), 1, 0), axis=0) > 0) & (n < kk + 64):
        u = gl.broadcast(gl.expand_dims(up, 1), v0)[0]
        d = gl.min(gl.minimum(gl.minimum(_abs_sub(v0, u), _abs_sub(v1, u)),
                              gl.minimum(_abs_sub(v2, u), _abs_sub(v3, u))), axis=1).to(gl.float32, bitcast=True)
        m = up + d
        act = alive & (found < kk - 1)
        below = m < up
        adv = act & below & (d > -0.5 * up)
        thr = gl.where(adv, m, thr)
        found = found + adv.to(gl.int32)
        # m is within an ulp of `up` of the value: up' lies strictly between, the next pass finds it again
        up = gl.where(adv, m, gl.where(act & below, gl.fma(up, 2.0 ** -22, m), up))
        alive = alive & (below | (act == 0))
        n += 1
    thr = gl.where(kk > 0, thr, float("inf"))
    cnt = _count_abs_ge(v0, v1, v2, v3, thr)
    return thr, alive & (found >= kk - 1) & ((kk == 0) | (cnt == kk))


@gluon.jit
def _codes(v, t1, t2, t3, packed_f, I: gl.constexpr):
    # packed_f + code * 4^I in float32, code = #{j : v >= t_j}
    ins = [v, gl.broadcast(t1, v)[0], gl.broadcast(t2, v)[0], gl.broadcast(t3, v)[0], packed_f]
    if I == 0:
        return gl.inline_asm_elementwise(CODES0, "=f,f,f,f,f,f", ins, dtype=gl.float32, is_pure=True, pack=1)
    elif I == 1:
        return gl.inline_asm_elementwise(CODES1, "=f,f,f,f,f,f", ins, dtype=gl.float32, is_pure=True, pack=1)
    elif I == 2:
        return gl.inline_asm_elementwise(CODES2, "=f,f,f,f,f,f", ins, dtype=gl.float32, is_pure=True, pack=1)
    else:
        return gl.inline_asm_elementwise(CODES3, "=f,f,f,f,f,f", ins, dtype=gl.float32, is_pure=True, pack=1)


@gluon.jit
def _outside_to_inf(t, thr):
    # a code edge at or below -thr is passed by every clamped value, one above thr by none
    return gl.where(t <= -thr, float("-inf"), gl.where(t > thr, float("inf"), t))


@gluon.jit
def _quantize_hopper_kernel(
    x_desc, r_desc, mr_ptr, k_ptr, e_ptr, out_ptr, sz_ptr, T, H, NTB,
    D: gl.constexpr, BLOCK_T: gl.constexpr, KMAX: gl.constexpr, R_PER_HEAD: gl.constexpr,
    HAS_MEAN: gl.constexpr, SZ_KIND: gl.constexpr, EST: gl.constexpr, NCAP: gl.constexpr,
):
    # x_desc: x as [T, H * D], tiles [BT, D]; r_desc: R as [H_r * D, D], tiles [D, D]; mr
    # (mean @ R): [H, D] f32; k: [H] i32 clip counts; e: [H, 2] f32 the estimate's coefficients
    # (EST); out: [T, H, D/4] u8; sz: [T, H, 2].
    # Program (p, h) quantizes head h's token blocks p, p + P, ... of NTB.
    Q: gl.constexpr = D // 4
    mma_l: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, D, 16])
    # the packed bytes leave in 16-byte rows (a warp: 16 tokens x 32 bytes): a scattered byte
    # store per pair of columns would be slower than this one pass through shared memory
    st_l: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [4, 1], [1, 0])
    pid = gl.program_id(0)
    h = gl.program_id(1)
    nprog = gl.num_programs(0)

    x_smem = gl.allocate_shared_memory(x_desc.dtype, [BLOCK_T, D], x_desc.layout)
    r_smem = gl.allocate_shared_memory(r_desc.dtype, [D, D], r_desc.layout)
    bars = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    bar_r = bars.index(0)
    bar_x = bars.index(1)
    mbarrier.init(bar_r, count=1)
    mbarrier.init(bar_x, count=1)

    r_row = h * D if R_PER_HEAD else 0
    mbarrier.expect(bar_r, r_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(r_desc, [r_row, 0], bar_r, r_smem)
    mbarrier.expect(bar_x, x_desc.block_type.nbytes, pred=pid < NTB)
    tma.async_copy_global_to_shared(x_desc, [pid * BLOCK_T, h * D], bar_x, x_smem, pred=pid < NTB)
    mbarrier.wait(bar_r, 0)

    kk = gl.load(k_ptr + h)
    e1 = gl.load(e_ptr + 2 * h)
    e2 = gl.load(e_ptr + 2 * h + 1)
    # mean @ R in shared memory, read back per block: held in registers across the loop it
    # would take 32 per thread (or their addresses, spilled)
    mr_smem = gl.allocate_shared_memory(gl.float32, [D], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    if HAS_MEAN:
        mr_smem.store(gl.load(mr_ptr + h * D + gl.arange(0, D, layout=gl.BlockedLayout([1], [32], [4], [0]))))
    gl.thread_barrier()
    zero = gl.zeros([BLOCK_T, D], gl.float32, mma_l)
    phase = 0
    for tb in range(pid, NTB, nprog):
        # ---- rotate and center: v = x @ R - mean @ R ------------------------------------ [BT, D]
        mbarrier.wait(bar_x, phase)
        phase ^= 1
        acc = warpgroup_mma(x_smem, r_smem, zero, use_acc=False, is_async=True)
        v = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        # every warp is past its wait: the tile is read, refill it for the program's next block
        gl.thread_barrier()
        nxt = tb + nprog
        mbarrier.expect(bar_x, x_desc.block_type.nbytes, pred=nxt < NTB)
        tma.async_copy_global_to_shared(x_desc, [nxt * BLOCK_T, h * D], bar_x, x_smem, pred=nxt < NTB)
        if HAS_MEAN:
            v = v - gl.expand_dims(mr_smem.load(gl.SliceLayout(0, mma_l)), 0)
        # quarter i is columns [iQ, (i+1)Q): registers of the same threads, so the split moves no data
        va, vb = gl.split(gl.permute(gl.reshape(v, [BLOCK_T, 2, 2, Q]), (0, 3, 2, 1)))
        v0, v1 = gl.split(va)
        v2, v3 = gl.split(vb)
        acc_l: gl.constexpr = v0.type.layout
        row_l: gl.constexpr = gl.SliceLayout(1, acc_l)

        rows = tb * BLOCK_T + gl.arange(0, BLOCK_T, layout=row_l)                # [BT]
        rmask = rows < T

        # ---- row max and min through the bit patterns (see quantize.py) ------------------
        b0 = v0.to(gl.int32, bitcast=True)
        b1 = v1.to(gl.int32, bitcast=True)
        b2 = v2.to(gl.int32, bitcast=True)
        b3 = v3.to(gl.int32, bitcast=True)
        smax = gl.max(gl.maximum(gl.maximum(b0, b1), gl.maximum(b2, b3)), axis=1)
        umax = gl.max(gl.maximum(gl.maximum(b0.to(gl.uint32, bitcast=True), b1.to(gl.uint32, bitcast=True)),
                                 gl.maximum(b2.to(gl.uint32, bitcast=True), b3.to(gl.uint32, bitcast=True))), axis=1)
        vmax = smax.to(gl.float32, bitcast=True)                                  # [BT]
        vmin = umax.to(gl.float32, bitcast=True)
        signs = (smax >= 0) & (umax >= 0x80000000)      # a row of both signs: these are its own
        top = gl.maximum(vmax, -vmin)                   # exact either way

        # ---- clip threshold: k - 1 passes down from max |v| (k <= KFAST) or from an estimate;
        # `walked`: every pass was exact, so the walk ended on a value of the row
        if EST:
            thr, walked = _passes_from_estimate(v0, v1, v2, v3, kk, e1, e2, top, rmask, NCAP)
        else:
            thr = top
            walked = rows >= 0
            for it in range(kk - 1):
                u = gl.broadcast(gl.expand_dims(thr, 1), v0)[0]
                dm = gl.min(gl.minimum(gl.minimum(_abs_sub(v0, u), _abs_sub(v1, u)),
                                       gl.minimum(_abs_sub(v2, u), _abs_sub(v3, u))), axis=1)
                d = dm.to(gl.float32, bitcast=True)
                m = thr + d
                walked = walked & (d > -0.5 * thr) & (m < thr)     # m < thr: some value was below
                thr = m
        thr = gl.where(kk > 0, thr, float("inf"))
        # ties among the top k (or fewer than k distinct values) leave more than k values >= thr
        good = walked & ((kk == 0) | (_count_abs_ge(v0, v1, v2, v3, thr) == kk))
        if gl.max(gl.where(rmask & ((good & signs) == 0), 1, 0), axis=0) > 0:
            # a rare row in the block (see quantize.py, in the same order): of one sign, the
            # bit-pattern max and min were not its own; a wide spread among the top k, which the
            # estimate's walk through the middle of the row does not meet; then passes from the
            # max with retries; ties, only the float path counts multiplicities
            vmax = _rows_max(v0, v1, v2, v3)
            vmin = _rows_min(v0, v1, v2, v3)
            if not EST:
                if gl.max(gl.where(rmask & (good == 0), 1, 0), axis=0) > 0:
                    thr, walked = _passes_from_estimate(v0, v1, v2, v3, kk, e1, e2, top, rmask, NCAP)
                    thr = gl.where(kk > 0, thr, float("inf"))
                    good = walked & ((kk == 0) | (_count_abs_ge(v0, v1, v2, v3, thr) == kk))
            if gl.max(gl.where(rmask & (good == 0), 1, 0), axis=0) > 0:
                if gl.max(gl.where(rmask & (walked == 0), 1, 0), axis=0) > 0:
                    thr, good = _passes_with_retries(v0, v1, v2, v3, top, kk, rmask)
                if gl.max(gl.where(rmask & (good == 0), 1, 0), axis=0) > 0:
                    thr = _exact_threshold(v0, v1, v2, v3, kk, KMAX)

        # ---- one group per row: scale / zero from the clamped max and min ---------------- [BT]
        mx = gl.minimum(vmax, thr)
        mn = gl.maximum(vmin, -thr)
        # scale = max(mx - mn, 1e-8) / 3 correctly rounded in float64 without a division (see
        # quantize.py); the constants are float64 bit patterns
        a64 = gl.maximum(mx.to(gl.float64) - mn.to(gl.float64),
                         gl.full([BLOCK_T], 0x3E45798EE2308C3A, gl.int64, row_l).to(gl.float64, bitcast=True))
        third = gl.full([BLOCK_T], 0x3FD5555555555555, gl.int64, row_l).to(gl.float64, bitcast=True)
        q0 = a64 * third
        scale32 = gl.fma(gl.fma(-q0, 3.0, a64), third, q0).to(gl.float32)
        if SZ_KIND == 1:      # float16: keep scale a normal number, zero finite
            scale32 = gl.minimum(gl.maximum(scale32, 6.103515625e-05), 65504.0)
            scale_s = scale32.to(gl.float16)
        elif SZ_KIND == 2:
            scale_s = scale32.to(gl.bfloat16, fp_downcast_rounding="rtne")
        else:
            scale_s = scale32
        zero32 = gl.div_rn(-mn, scale_s.to(gl.float32))
        if SZ_KIND == 1:
            zero32 = gl.minimum(gl.maximum(zero32, -65504.0), 65504.0)
            zero_s = zero32.to(gl.float16)
        elif SZ_KIND == 2:
            zero_s = zero32.to(gl.bfloat16, fp_downcast_rounding="rtne")
        else:
            zero_s = zero32
        if SZ_KIND == 0:
            s64 = scale_s.to(gl.float64)
            z64 = zero_s.to(gl.float64)
            t1 = ((0.5 - z64) * s64).to(gl.float32)
            t2 = ((1.5 - z64) * s64).to(gl.float32)
            t3 = ((2.5 - z64) * s64).to(gl.float32)
        else:
            s32 = scale_s.to(gl.float32)
            zs = -(zero_s.to(gl.float32) * s32)
            t1 = gl.fma(0.5, s32, zs)
            t2 = gl.fma(1.5, s32, zs)
            t3 = gl.fma(2.5, s32, zs)
        t1 = gl.expand_dims(_outside_to_inf(t1, thr), 1)
        t2 = gl.expand_dims(_outside_to_inf(t2, thr), 1)
        t3 = gl.expand_dims(_outside_to_inf(t3, thr), 1)

        # ---- codes, packed as 2^23 + sum code_i 4^i in float32 (its low mantissa byte) -------
        packed_f = gl.full([BLOCK_T, Q], 8388608.0, gl.float32, acc_l)
        packed_f = _codes(v0, t1, t2, t3, packed_f, 0)
        packed_f = _codes(v1, t1, t2, t3, packed_f, 1)
        packed_f = _codes(v2, t1, t2, t3, packed_f, 2)
        packed_f = _codes(v3, t1, t2, t3, packed_f, 3)
        packed = gl.convert_layout((packed_f.to(gl.int32, bitcast=True) & 0xFF).to(gl.uint8), st_l)
        rows_s = tb * BLOCK_T + gl.arange(0, BLOCK_T, layout=gl.SliceLayout(1, st_l))
        cols_s = gl.arange(0, Q, layout=gl.SliceLayout(0, st_l))
        out_row = out_ptr + (gl.expand_dims(rows_s.to(gl.int64), 1) * H + h) * Q
        gl.store(out_row + gl.expand_dims(cols_s, 0), packed, mask=gl.expand_dims(rows_s < T, 1))

        # scale and zero side by side, by the four threads that hold the row (one write)
        sz_row = sz_ptr + (rows.to(gl.int64) * H + h) * 2
        if SZ_KIND == 0:
            gl.inline_asm_elementwise(SZ_STORE64, "=r,l,r,r,r", [sz_row, scale_s.to(gl.int32, bitcast=True),
                                      zero_s.to(gl.int32, bitcast=True), rmask.to(gl.int32)],
                                      dtype=gl.int32, is_pure=False, pack=1)
        else:
            pair = ((scale_s.to(gl.int16, bitcast=True).to(gl.int32) & 0xFFFF)
                    | (zero_s.to(gl.int16, bitcast=True).to(gl.int32) << 16))
            gl.inline_asm_elementwise(SZ_STORE32, "=r,l,r,r", [sz_row.to(gl.pointer_type(gl.int32)), pair,
                                      rmask.to(gl.int32)], dtype=gl.int32, is_pure=False, pack=1)
    mbarrier.invalidate(bar_r)
    mbarrier.invalidate(bar_x)


_GL_DTYPE = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}
_SZ_KIND = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}


def applies(x: torch.Tensor, r: torch.Tensor | None, ng: int) -> bool:
    """Whether quantize_kv's call on a Hopper GPU is this kernel's: 16-bit x with contiguous heads
    and tokens that do not overlap (a TMA tile is [tokens, H * D]), 16-byte aligned, a rotation,
    d = 128, one group per row."""
    return (x.dtype in _GL_DTYPE and r is not None and x.shape[-1] == 128 and ng == 1
            and x.stride(2) == 1 and x.stride(1) == x.shape[2] and x.stride(0) >= x.shape[1] * x.shape[2]
            and (x.stride(0) * 2) % 16 == 0
            and x.data_ptr() % 16 == 0 and r.data_ptr() % 16 == 0)


def quantize(x, r, mr, kk_dev, e_dev, kmax: int, est: bool, ncap: int, packed, sz, scale_dtype: torch.dtype) -> None:
    """Fill packed [T, H, D/4] and sz [T, H, 2] (see quantize.quantize_kv, which makes the clip
    counts, the estimate's coefficients and chooses between the two starts)."""
    t, h, d = x.shape
    gdt = _GL_DTYPE[x.dtype]
    x_desc = TensorDescriptor(x, [t, h * d], [x.stride(0), 1], [BLOCK_T, d],
                              gl.NVMMASharedLayout.get_default_for([BLOCK_T, d], gdt))
    r2 = r.reshape(-1, d)                                   # [H_r * D, D]
    r_desc = TensorDescriptor(r2, list(r2.shape), [d, 1], [d, d], gl.NVMMASharedLayout.get_default_for([d, d], gdt))
    ntb = triton.cdiv(t, BLOCK_T)
    grid = (max(1, min(ntb, sm_count(x.device) * PROGRAMS_PER_SM // h)), h)
    _quantize_hopper_kernel[grid](
        x_desc, r_desc, mr if mr is not None else x, kk_dev, e_dev, packed, sz, t, h, ntb,
        D=d, BLOCK_T=BLOCK_T, KMAX=kmax, R_PER_HEAD=r.dim() == 3, HAS_MEAN=mr is not None,
        SZ_KIND=_SZ_KIND[scale_dtype], EST=est, NCAP=ncap, num_warps=NUM_WARPS, maxnreg=MAXNREG,
    )
