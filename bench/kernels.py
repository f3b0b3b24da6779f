"""INT2 kernels on the GPU: decode attention beside BF16 SDPA, quantize beside a device copy.

    python bench/kernels.py [--quick] [--sweep] [--variants] [--parts] [--repeat N]

Qwen3-8B attention geometry (32 query heads, 8 KV heads, head_dim 128), one decode query per
sequence, batch 1/8/32 at context 8K/32K/128K. Our cache: BF16 sink 64 + recent 256, INT2
history with fp16 scale/zero (2.25 bits/element) in pages of 256 tokens, per-head rotations.
Inputs are random (codes uniform over 0..255 bytes, positive scales); speed does not depend on
the values. Times are medians of CUDA-graph replays (our decode is three launches: the q
rotation, stage 1, stage 2); small working sets are replicated until they exceed L2 several
times, so no case is timed out of cache. Bandwidth counts the bytes each method must read:
SDPA the BF16 K and V; ours the INT2 bytes, scales, BF16 windows (q and outputs are ignored).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from oscar_zoo.kernels import Int2KVCache, decode, prepare_rotation, quantize_kv
from oscar_zoo.kernels import quantize as quantize_mod

HQ, HKV, D = 32, 8, 128
SINK, RECENT, PAGE = 64, 256, 256
CASES = [(b, n) for n in (8192, 32768, 131072) for b in (1, 8, 32)]


def graph_time(fn, copies: int, reps: int = 30) -> float:
    """Median ms of one call, from CUDA-graph replays of `copies` calls."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times) / copies


def synthetic_cache(bsz: int, n: int, gen: torch.Generator) -> Int2KVCache:
    dev = "cuda"
    n_q = max(n - SINK - RECENT, 0)
    ppseq = -(-n_q // PAGE)
    pages = max(ppseq * bsz, 1)
    table = (torch.arange(ppseq)[None, :] * bsz + torch.arange(bsz)[:, None]).int().to(dev)
    rb = lambda *s: torch.randint(0, 256, s, dtype=torch.uint8, device=dev)  # noqa: E731

    def sz():
        s = torch.empty(pages, HKV, PAGE, 2, device=dev)
        s[..., 0].uniform_(0.02, 0.2)
        s[..., 1].uniform_(0.0, 3.0)
        return s.half()
    hp = lambda: torch.randn(bsz, HKV, SINK + RECENT, D, device=dev, dtype=torch.bfloat16)  # noqa: E731
    rot = lambda: torch.linalg.qr(torch.randn(HKV, D, D, device=dev))[0].contiguous()  # noqa: E731
    return Int2KVCache(torch.full((bsz,), n, dtype=torch.int32, device=dev), hp(), hp(),
                       rb(pages, HKV, PAGE, D // 4), sz(), rb(pages, HKV, PAGE, D // 4), sz(), table, rot(), rot(),
                       SINK, RECENT, D, PAGE, n_q)


def int2_bytes(bsz: int, n: int) -> int:
    n_q = max(n - SINK - RECENT, 0)
    return bsz * HKV * (2 * n_q * (D // 4 + 4) + 2 * min(n, SINK + RECENT) * D * 2)


def copies_for(nbytes: int) -> int:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(1, math.ceil(4 * l2 / nbytes))


def time_int2(bsz, n, gen, cfg=None) -> float:
    if cfg:
        decode.BLOCK_N, decode.NUM_WARPS, decode.NUM_STAGES, decode.SPLIT_PROGRAMS_PER_SM, decode.MAXNREG = cfg
    c = copies_for(int2_bytes(bsz, n))
    caches = [synthetic_cache(bsz, n, gen) for _ in range(c)]
    q = torch.randn(bsz, HQ, D, device="cuda", dtype=torch.bfloat16)
    outs = [torch.empty_like(q) for _ in range(c)]

    def fn():
        for cache, out in zip(caches, outs):
            decode.decode_attention(q, cache, out=out)
    t = graph_time(fn, c)
    del caches
    return t


def time_sdpa(bsz, n) -> float:
    nbytes = bsz * HKV * n * D * 2 * 2
    c = copies_for(nbytes)
    kv = [(torch.randn(bsz, HKV, n, D, device="cuda", dtype=torch.bfloat16),
           torch.randn(bsz, HKV, n, D, device="cuda", dtype=torch.bfloat16)) for _ in range(c)]
    q = torch.randn(bsz, HQ, 1, D, device="cuda", dtype=torch.bfloat16)

    def fn():
        for k, v in kv:
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    t = graph_time(fn, c)
    del kv
    return t


def quantize_call(tokens: int = 262144, clip: float = 0.96, rows: str = "gaussian"):
    """The benched quantize_kv call (bf16 keys, per-head rotation and centering prepared once, as
    a serving engine holds them, fp16 scale/zero) and
    its input. `rows` other than gaussian put outliers where the kernel sees them (after R):
    "sink rows", one row in 997 with one huge value, like attention-sink tokens; "outlier
    channels", two large channels in every row, like K without a rotation; "heavy tails",
    laplace rows (the k largest |x| spread wider than a gaussian's)."""
    r = torch.linalg.qr(torch.randn(HKV, D, D, device="cuda"))[0].contiguous()
    if rows == "gaussian":
        x = torch.randn(tokens, HKV, D, device="cuda", dtype=torch.bfloat16)
    else:
        y = torch.randn(tokens, HKV, D, device="cuda")          # y: [tokens, heads, d], after R
        if rows == "sink rows":
            y[::997, :, 0] *= 40
        elif rows == "outlier channels":
            y[:, :, :2] *= 20
        elif rows == "heavy tails":
            y = torch.distributions.Laplace(0.0, 1.0).sample(y.shape).cuda()
        else:
            raise ValueError(f"rows: gaussian, sink rows, outlier channels or heavy tails, not {rows!r}")
        x = torch.einsum("thd,hed->the", y, r).bfloat16()     # y @ R^T: the kernel's x @ R is y again
    mean = torch.randn(HKV, D, device="cuda")
    clip = torch.full((HKV,), clip)
    prep = prepare_rotation(r, mean, dtype=torch.bfloat16)
    return (lambda: quantize_kv(x, prep, clip, None, torch.float16)), x


def bench_quantize(tokens: int = 262144, clip: float = 0.96, rows: str = "gaussian",
                   hopper: bool = True) -> tuple[float, float, int, int]:
    call, x = quantize_call(tokens, clip, rows)
    quantize_mod.HOPPER = hopper
    try:
        tq = graph_time(call, 1)
    finally:
        quantize_mod.HOPPER = True
    y = torch.empty_like(x)
    tc = graph_time(lambda: y.copy_(x), 1)
    q_bytes = x.numel() * 2 + tokens * HKV * (D // 4 + 4)
    return tq, tc, q_bytes, 2 * x.numel() * 2


# OSCAR's shipped K and V ratios, ones the clip search picks on the test model (K median 0.89),
# a low one, and no clip
QCLIPS = [(0.96, "shipped K"), (0.92, "shipped V"), (0.89, "searched"), (0.85, "searched"), (0.7, "low"),
          (1.0, "no clip")]
HOPPER_PROGRAMS = [4, 8, 16, 64]   # the Hopper kernel's programs per SM in the grid
QCONFIGS = [(64, 4, 128, 64), (128, 8, 128, 64), (64, 4, 120, 64), (64, 4, 168, 64)]   # BLOCK_T, warps, register cap, programs/SM
S2CONFIGS = [(8, 32, 3), (8, 64, 3), (8, 32, 4), (8, 16, 4)]   # stage 2: warps, splits per step, stages


def decode_parts(bsz: int, n: int, gen) -> list[tuple[str, float]]:
    """Mean CUDA time per call of each kernel that one decode step launches (no graph)."""
    cache = synthetic_cache(bsz, n, gen)
    q = torch.randn(bsz, HQ, D, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        decode.decode_attention(q, cache)
    torch.cuda.synchronize()
    reps = 20
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            decode.decode_attention(q, cache)
        torch.cuda.synchronize()
    rows = [(e.key[:60], e.device_time_total / reps) for e in prof.key_averages() if e.device_time_total > 0]
    return sorted(rows, key=lambda r: -r[1])


# stage 1 variants for --variants: lazy-rescale threshold (0: off), L2 prefetch (tiles per chunk,
# 0: off; chunks ahead), register cap
VARIANTS = [dict(TAU=tau, PF_CHUNK=pc, PF_AHEAD=pa, MAXNREG=nr) for tau, pc, pa, nr in (
    (0.0, 2, 1, 128), (3.0, 2, 1, 128), (6.0, 2, 1, 128), (3.0, 0, 1, 128))]


def settings() -> str:
    names = ("BLOCK_N", "NUM_WARPS", "NUM_STAGES", "SPLIT_PROGRAMS_PER_SM", "MAXNREG", "TAU", "PF_CHUNK", "PF_AHEAD")
    return ", ".join(f"{n}={getattr(decode, n)}" for n in names)


def variant_sweep(gen) -> None:
    """Time each stage-1 variant at batch 32 and 1 / 128K; keep the best at batch 32."""
    print("\nstage 1 variants (ms)", flush=True)
    res = []
    for i, var in enumerate(VARIANTS):
        for k, v in var.items():
            setattr(decode, k, v)
        t32, t1 = time_int2(32, 131072, gen), time_int2(1, 131072, gen)
        res.append((t32, t1, i))
        print(f"  {var}: batch 32 / 128K {t32:.4f}, batch 1 / 128K {t1:.4f}", flush=True)
    best = VARIANTS[min(res)[2]]
    for k, v in best.items():
        setattr(decode, k, v)
    print(f"chosen: {best}", flush=True)


CONFIGS = [  # BLOCK_N, warps, stages, split programs per SM, register cap (first: the module defaults)
    (32, 1, 2, 32, 128), (32, 1, 2, 16, 128), (32, 1, 2, 24, 128), (64, 1, 2, 16, None), (64, 1, 2, 8, None),
]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="only batch 32 / 128K and batch 1 / 128K")
    ap.add_argument("--sweep", action="store_true", help="try the kernel configurations first")
    ap.add_argument("--parts", action="store_true", help="per-kernel times of one decode step (torch profiler)")
    ap.add_argument("--variants", action="store_true", help="try the stage-1 variants first (VARIANTS)")
    ap.add_argument("--one", type=int, metavar="BATCH", help="run one decode step at 128K and exit (for ncu)")
    ap.add_argument("--one-quantize", action="store_true", help="run the benched quantize call twice and exit (for ncu)")
    ap.add_argument("--quantize", action="store_true", help="only quantize (with --sweep: its configurations)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="time each case N times, ours and SDPA interleaved; medians, and the speedup's range")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    if args.one:
        cache = synthetic_cache(args.one, 131072, gen)
        q = torch.randn(args.one, HQ, D, device="cuda", dtype=torch.bfloat16)
        for _ in range(2):
            decode.decode_attention(q, cache)
        torch.cuda.synchronize()
        return 0
    if args.one_quantize:
        call = quantize_call()[0]
        for _ in range(2):
            call()
        torch.cuda.synchronize()
        return 0
    props = torch.cuda.get_device_properties(0)
    print(f"device: {props.name}, {props.multi_processor_count} SMs, L2 {props.L2_cache_size >> 20} MiB; "
          f"torch {torch.__version__}", flush=True)
    best = {1: None, 32: None}     # None: the module's settings
    if args.variants:
        variant_sweep(gen)
    if args.parts:
        for bsz in (1, 32):
            print(f"\nkernels of one decode step, batch {bsz} / 128K (us, mean of 20):")
            for name, us in decode_parts(bsz, 131072, gen):
                print(f"  {us:8.1f}  {name}")
    if args.sweep and not args.quantize:
        print("\nsweep (ms): BLOCK_N, warps, stages, programs/SM, maxnreg")
        for bsz in (32, 1):
            res = []
            for cfg in CONFIGS:
                t0 = time.time()
                t = time_int2(bsz, 131072, gen, cfg)
                res.append((t, cfg))
                print(f"  batch {bsz:2d} 128K {cfg}: {t:.4f} ms  ({time.time() - t0:.0f} s)", flush=True)
            best[bsz] = min(res)[1]
        print("\nstage 2 sweep, batch 1 / 128K (ms): warps, splits per step, stages")
        res2 = []
        for s2 in S2CONFIGS:
            decode.STAGE2_WARPS, decode.STAGE2_BLOCK_S, decode.STAGE2_STAGES = s2
            t = time_int2(1, 131072, gen, best[1])
            res2.append((t, s2))
            print(f"  {s2}: {t:.4f} ms", flush=True)
        decode.STAGE2_WARPS, decode.STAGE2_BLOCK_S, decode.STAGE2_STAGES = min(res2)[1]
    cases = [] if args.quantize else [(32, 131072), (1, 131072)] if args.quick else CASES
    rows = []
    for bsz, n in cases:
        cfg = best[1 if bsz == 1 else 32]
        pairs = [(time_int2(bsz, n, gen, cfg), time_sdpa(bsz, n)) for _ in range(args.repeat)]
        ti, ts = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
        ratios = sorted(s / i for i, s in pairs)
        bi, bs = int2_bytes(bsz, n), bsz * HKV * n * D * 4
        rows.append((bsz, n, ts, bs / ts / 1e9, ti, bi / ti / 1e9, ts / ti, bs / bi, cfg or settings()))
        spread = f", speedup of the {args.repeat} pairs {ratios[0]:.2f}x-{ratios[-1]:.2f}x" if args.repeat > 1 else ""
        print(f"  done batch {bsz} ctx {n}: sdpa {ts:.4f} ms, int2 {ti:.4f} ms{spread}", flush=True)
    if args.sweep:
        print("\nquantize sweep, Triton kernel (ms at clip 0.96, 0.85): BLOCK_T, warps, maxnreg, programs per SM")
        qres = []
        for qc in QCONFIGS:
            quantize_mod.BLOCK_T, quantize_mod.NUM_WARPS, quantize_mod.MAXNREG, quantize_mod.PROGRAMS_PER_SM = qc
            t96, t85 = bench_quantize(hopper=False)[0], bench_quantize(clip=0.85, hopper=False)[0]
            qres.append((t96, qc))
            print(f"  {qc}: {t96:.4f}  {t85:.4f}", flush=True)
        quantize_mod.BLOCK_T, quantize_mod.NUM_WARPS, quantize_mod.MAXNREG, quantize_mod.PROGRAMS_PER_SM = min(qres)[1]
        from oscar_zoo.kernels import quantize_hopper   # Gluon (experimental): only for its sweep
        print("\nquantize sweep, Hopper kernel (ms at clip 0.96, 0.93): programs per SM in the grid")
        hres = []
        for pps in HOPPER_PROGRAMS:
            quantize_hopper.PROGRAMS_PER_SM = pps
            t96, t93 = bench_quantize()[0], bench_quantize(clip=0.93)[0]
            hres.append((t96, pps))
            print(f"  {pps}: {t96:.4f}  {t93:.4f}", flush=True)
        quantize_hopper.PROGRAMS_PER_SM = min(hres)[1]
    quant = []
    for clip, why in QCLIPS:
        runs = [(bench_quantize(clip=clip), bench_quantize(clip=clip, hopper=False)[0]) for _ in range(args.repeat)]
        qb, cb = runs[0][0][2], runs[0][0][3]
        shares = sorted(qb / r[0][0] / (cb / r[0][1]) for r in runs)
        quant.append((clip, why, statistics.median(r[0][0] for r in runs), statistics.median(r[0][1] for r in runs),
                      qb, cb, statistics.median(r[1] for r in runs), shares))
    print("\n| batch | context | BF16 SDPA ms | SDPA TB/s | INT2 decode ms | INT2 TB/s | speedup | byte ratio "
          "(floor) | stage 1 config |")
    print("|---|---|---|---|---|---|---|---|---|")
    for bsz, n, ts, bws, ti, bwi, sp, br, cfg in rows:
        print(f"| {bsz} | {n // 1024}K | {ts:.3f} | {bws:.2f} | {ti:.3f} | {bwi:.2f} | {sp:.2f}x | {br:.2f}x | {cfg} |")
    print("\nquantize_kv (bf16 in, per-head rotation and centering from prepare_rotation, fp16 scale/zero), "
          "262144 tokens x 8 heads, "
          "beside a device copy of x (read + write) timed in the same call:")
    print("(quantize: what quantize_kv runs here, the Hopper kernel where it applies; "
          "Triton kernel: quantize.py's, on the same call)")
    if args.repeat > 1:
        print(f"(medians of {args.repeat} timings each, quantize, Triton kernel and copy interleaved; the share's "
              "range over the runs)")
    print("| clip ratio | k at d = 128 | quantize ms | TB/s | Triton kernel ms | copy ms | copy TB/s "
          "| share of copy bandwidth |")
    print("|---|---|---|---|---|---|---|---|")
    for clip, why, tq, tc, qb, cb, tt, shares in quant:
        k = int(quantize_mod.clip_counts(clip, 1, D)[0])
        spread = f" ({shares[0]:.0%}-{shares[-1]:.0%})" if len(shares) > 1 else ""
        print(f"| {clip} ({why}) | {k} | {tq:.3f} | {qb / tq / 1e9:.2f} | {tt:.3f} | {tc:.3f} | {cb / tc / 1e9:.2f} "
              f"| {qb / tq / (cb / tc):.0%}{spread} |")
    print("\nquantize_kv ms by kind of rows (outliers take the fast path's retries, or its exact fallback):")
    clipped = [c for c, _ in QCLIPS if c < 1]
    print("| rows | " + " | ".join(f"clip {c}" for c in clipped) + " |")
    print("|---" * (len(clipped) + 1) + "|")
    for rows in ("gaussian", "sink rows", "outlier channels", "heavy tails"):
        print(f"| {rows} | " + " | ".join(f"{bench_quantize(clip=c, rows=rows)[0]:.3f}" for c in clipped) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
