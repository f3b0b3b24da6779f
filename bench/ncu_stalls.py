"""Where the warps of one kernel wait, from an Nsight Compute report's source page.

    ncu --set full -k regex:_stage1 -c 1 -o s1 python3 bench/kernels.py --one 32
    ncu --import s1.ncu-rep --page source --csv --print-source sass > s1.csv
    python3 bench/ncu_stalls.py s1.csv [--top N] [--windows N]

Prints the share of each stall reason over all warp samples, the instructions that collect the
most samples with their top reasons, and the shared-memory wavefronts per instruction kind (the
L1 pipe's load; divide by the tiles the kernel ran for a per-tile figure).
"""

from __future__ import annotations

import argparse
import collections
import csv
import sys


def _num(row: list[str], col: int | None) -> float:
    try:
        return float(row[col] or 0) if col is not None else 0.0
    except ValueError:
        return 0.0


def _opcode(sass: str) -> str:
    """The opcode with its modifiers ("STS.128"), past a predicate ("@!P2")."""
    ins = sass.split()
    return ins[1] if ins[0].startswith("@") else ins[0]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("csv", help="ncu --page source --csv --print-source sass output")
    ap.add_argument("--top", type=int, default=20, help="instructions to list")
    ap.add_argument("--windows", type=int, default=0, metavar="N",
                    help="also sum samples and executed instructions over windows of N SASS lines "
                         "(a region's share of the waiting beside its share of the work)")
    args = ap.parse_args()
    rows = list(csv.reader(open(args.csv)))
    head = next(i for i, r in enumerate(rows) if r and r[0] == "Address")
    hdr, data = rows[head], rows[head + 1:]
    col = {h: i for i, h in enumerate(hdr)}
    reasons = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    totals = collections.Counter({h: sum(_num(r, col[h]) for r in data) for h in reasons})
    samples = sum(totals.values()) or 1.0
    print(f"{samples:.0f} warp samples")
    for h, v in totals.most_common(10):
        print(f"  {h[6:]:20s} {v / samples:6.1%}")
    print(f"\ntop {args.top} instructions by samples:")
    all_samples = col.get("Warp Stall Sampling (All Samples)")
    for r in sorted(data, key=lambda r: -_num(r, all_samples))[:args.top]:
        top = sorted(((_num(r, col[h]), h[6:]) for h in reasons), reverse=True)[:2]
        why = ", ".join(f"{h} {v / samples:.1%}" for v, h in top if v)
        print(f"  {_num(r, all_samples) / samples:6.2%}  {r[1].strip()[:58]:58s} {why}")
    waves = collections.Counter()
    for r in data:
        w = _num(r, col.get("L1 Wavefronts Shared"))
        if w:
            waves[_opcode(r[1])] += w
    if waves:
        total = sum(waves.values())
        print(f"\nshared-memory wavefronts: {total:.0f}")
        for op, w in waves.most_common(8):
            print(f"  {op:24s} {w:14.0f}  {w / total:6.1%}")
    if args.windows:
        _windows(data, col, all_samples, samples, args.windows)
    return 0


def _windows(data, col, all_samples, samples, n) -> None:
    executed = col.get("Instructions Executed")
    total = sum(_num(r, executed) for r in data) or 1.0
    print(f"\nby windows of {n} lines: samples / instructions executed, commonest opcodes")
    for i in range(0, len(data), n):
        chunk = data[i:i + n]
        s, e = sum(_num(r, all_samples) for r in chunk), sum(_num(r, executed) for r in chunk)
        if s / samples < 0.005 and e / total < 0.002:
            continue
        ops = collections.Counter(_opcode(r[1]).split(".")[0] for r in chunk if r[1].strip())
        mix = ", ".join(f"{op} {c}" for op, c in ops.most_common(5))
        print(f"  {i:5d}  {s / samples:6.1%} / {e / total:6.1%}  {mix}")


if __name__ == "__main__":
    sys.exit(main())
