"""Calibration cost beside one plain forward pass over the same tokens.

    .venv/bin/python -P bench/calibrate.py [--model smollm2-135m|path.gguf] [--tokens 8192] [--seq-len 2048]

Prints tokens/s of a plain forward (transformers' SDPA, no hooks), of pass 1 and pass 2, the
fit and the clip search; calibration (pass 1 + pass 2 + fit) as a multiple of one plain forward
(target <= 2.5x); peak memory; and the bytes written (the bundle only).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--batch-size", type=lambda s: None if s == "auto" else int(s), nargs="+",
                    default=[None],
                    help="windows per forward, or auto [the product's default: 1 on a CPU, 32K tokens' worth on "
                         "a GPU]; several values give one table each, one model load")
    ap.add_argument("--no-clip-search", action="store_true")
    ap.add_argument("--repeat", type=int, default=1,
                    help="time the plain forward and the calibration N times each; medians, "
                         "and the ratio's range over the pairs")
    ap.add_argument("--profile", action="store_true",
                    help="print, per pass, CPU vs device time and the top ops (to stderr)")
    args = ap.parse_args(argv)

    from oscar_zoo.calibrate.loading import load_model, resolve_source

    t0 = time.perf_counter()
    model, tok = load_model(resolve_source(args.model))
    load_s = time.perf_counter() - t0
    for i, batch in enumerate(args.batch_size):
        if i:
            print()
        _one(args, batch, model, tok, load_s)
    return 0


def _one(args, batch: int, model, tok, load_s: float) -> None:
    from oscar_zoo.calibrate import capture
    from oscar_zoo.calibrate.data import load_text, token_windows
    from oscar_zoo.calibrate.pipeline import (CalibrationConfig, calibrate, forward, hardware,
                                              windows_per_forward)
    from oscar_zoo.zoo import bundle as B

    cuda = torch.cuda.is_available()
    cfg = CalibrationConfig(model=args.model, tokens=args.tokens, seq_len=args.seq_len,
                            batch_size=batch, clip_search=not args.no_clip_search)
    batch = windows_per_forward(cfg, model.device)
    windows = token_windows(tok, load_text(cfg.data), cfg.seq_len, cfg.tokens, cfg.seed)
    tokens = len(windows) * cfg.seq_len

    def plain():
        model.set_attn_implementation("sdpa")       # no observer, no capture attention at all
        try:
            for s in range(0, len(windows), batch):
                forward(model, windows[s:s + batch])
            if cuda:
                torch.cuda.synchronize()
        finally:
            capture.install(model)

    plain()                                         # warm-up (kernels, allocator)
    # Warm-up of our own path too: float64 BLAS handles, Triton JIT (one kernel per clip count
    # on GPUs, cached on disk afterwards). Timed and reported, not hidden.
    t = time.perf_counter()
    warm = CalibrationConfig(model=args.model, tokens=cfg.seq_len * batch, seq_len=cfg.seq_len,
                             batch_size=batch, clip_windows=1, clip_search=cfg.clip_search)
    calibrate(warm, loaded=(model, tok))
    warm_s = time.perf_counter() - t
    if args.profile:
        _profile(f"plain forward, batch {batch}", plain)
        _profile(f"calibration of {warm.tokens} tokens, batch {batch}",
                 lambda: calibrate(warm, loaded=(model, tok)))
    rss_before = peak_rss_mib()
    # Plain forward and calibration alternate, so both see the same clocks and neighbours.
    plains, runs = [], []
    for _ in range(args.repeat):
        t = time.perf_counter()
        plain()
        plains.append(time.perf_counter() - t)
        runs.append(calibrate(cfg, loaded=(model, tok)))
    plain_s = statistics.median(plains)
    if cuda:                                        # memory of one calibration on its own
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base_alloc = torch.cuda.memory_allocated()
        result = calibrate(cfg, loaded=(model, tok))
        torch.cuda.synchronize()
    else:
        result = runs[-1]
    with tempfile.TemporaryDirectory() as d:
        B.write(result.bundle, Path(d) / "bundle")
        written = sum(p.stat().st_size for p in (Path(d) / "bundle").iterdir())

    tm = {k: statistics.median(r.timings.get(k, 0.0) for r in runs) for k in result.timings}
    calib = [r.timings["pass1"] + r.timings.get("pass2", 0.0) + r.timings["fitting"] for r in runs]
    calib_s = statistics.median(calib)
    rows = [("plain forward (SDPA)", plain_s), ("pass 1 (query/key moments)", tm["pass1"]),
            ("pass 2 (score-weighted V)", tm.get("pass2", 0.0)),
            ("fit: the wait after pass 2 (eigh, H, P run on a host thread during pass 2)", tm["fitting"]),
            ("calibration = pass 1 + pass 2 + fit", calib_s), ("clip search (held-out windows)", tm["clip_search"])]
    print(f"# Calibration cost: {args.model}, {tokens:,} tokens ({len(windows)} x {cfg.seq_len}), "
          f"batch {batch}{'' if cfg.batch_size else ' (the default here)'}")
    print(f"device: {hardware()}; torch {torch.__version__}; model load {load_s:.1f} s; first "
          f"calibration call (warm-up: BLAS handles, Triton JIT) {warm_s:.1f} s, not counted below\n")
    print("| step | seconds | tokens/s | x plain forward |\n|---|---|---|---|")
    for name, secs in rows:
        tps = f"{tokens / secs:,.0f}" if secs and "fit" not in name and "clip" not in name else "-"
        print(f"| {name} | {secs:.3f} | {tps} | {secs / plain_s:.2f} |")
    print(f"\nfit work on the host thread: {tm['fitting_work'] * 1e3:.1f} ms, of which "
          f"{tm['fitting'] * 1e3:.1f} ms was not hidden behind pass 2")
    ratio = calib_s / plain_s
    print(f"calibration / plain forward = {ratio:.2f}x (target <= 2.5x): "
          f"{'met' if ratio <= 2.5 else 'MISSED'}")
    if args.repeat > 1:
        pairs = sorted(c / p for c, p in zip(calib, plains))
        print(f"medians of {args.repeat} timings each, plain and calibration alternating; the ratio of a pair ranges "
              f"{pairs[0]:.2f}x-{pairs[-1]:.2f}x")
    if cuda:
        peak = (torch.cuda.max_memory_allocated() - base_alloc) / 2**20
        print(f"peak GPU memory above the loaded model: {peak:,.0f} MiB")
    print(f"peak RSS: {peak_rss_mib():,.0f} MiB (after model load and the warm-ups: {rss_before:,.0f} MiB)")
    print(f"bytes written: {written:,} (the bundle: rotations.safetensors, bundle.json, README.md)")


def _profile(title: str, fn) -> None:
    """Wall vs device busy time, and the top ops by host time: on a small model a GPU forward is
    launch-bound, and the host column says which of our ops cost their launches."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.cuda.is_available()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    t = time.perf_counter()
    with profile(activities=acts) as prof:
        fn()
        if cuda:
            torch.cuda.synchronize()
    wall = time.perf_counter() - t
    events = prof.key_averages()
    device_us = sum(e.self_device_time_total for e in events) if cuda else 0
    print(f"\n## {title}: wall {wall * 1e3:.1f} ms (profiled), device busy {device_us / 1e3:.1f} ms",
          file=sys.stderr)
    print(events.table(sort_by="self_cpu_time_total", row_limit=25), file=sys.stderr)
    if cuda:
        print(events.table(sort_by="self_cuda_time_total", row_limit=12), file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
