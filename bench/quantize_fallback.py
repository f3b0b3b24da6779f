"""How often quantize_kv's threshold paths hand a row, and so its whole 64-row block, to the
exact fallback, on the test model's real K and V (CPU, a minute).

Both paths need one group per row and a row holding values of both signs. The passes from the
max (clip count k <= quantize.KFAST) vouch for a row when each of their k - 1 passes lands on a
value above half the previous one (Sterbenz) and no two of the k + 1 largest |x| tie. The
estimate (k > KFAST) vouches for one whose guess lands at most NCAP passes from the threshold,
whose passes from there each stay within half a step of the last, and where no two values it
walks over (nor the k-th and (k+1)-th) tie. This script evaluates those conditions in torch
over every layer's post-RoPE K and V of SmolLM2-135M (1,024 tokens of reference prose), rotated
by a random orthogonal matrix after centering (as an OSCAR bundle would) and unrotated.

    python bench/quantize_fallback.py
"""

from __future__ import annotations

import pydoc_data.topics as topics

import torch

from oscar_zoo.calibrate import capture
from oscar_zoo.calibrate.loading import load_model, resolve_source
from oscar_zoo.kernels import quantize
from oscar_zoo.kernels.quantize import clip_counts

RATIOS = (0.96, 0.92, 0.85, 0.79, 0.7, 0.5)
BLOCK_T = 64


def real_kv(tokens: int = 1024) -> list[torch.Tensor]:
    """Every layer's K and V, each [kv_heads, tokens, d] float32."""
    model, tok = load_model(resolve_source("smollm2-135m"))
    text = "\n\n".join(topics.topics[k] for k in sorted(topics.topics))[:40000]
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"][:tokens]])
    seen = {}
    with capture.observing(lambda m, q, k, v, mask, kw: seen.setdefault(m.layer_idx, (k, v))), torch.no_grad():
        model.model(ids)
    return [x[0].float() for kv in seen.values() for x in kv]


def falls_back(x: torch.Tensor, k: int) -> torch.Tensor:
    """x: [rows, d] -> bool [rows], True where the path for k cannot vouch for the row."""
    one_sign = (x >= 0).all(-1) | (x < 0).all(-1)
    return one_sign | (_passes_fall_back(x, k) if k <= quantize.KFAST else _estimate_falls_back(x, k))


def _passes_fall_back(x: torch.Tensor, k: int) -> torch.Tensor:
    top = x.abs().sort(-1, descending=True).values[:, :k + 1]
    inexact = (top[:, 1:k] <= 0.5 * top[:, :k - 1]).any(-1)
    ties = (top[:, 1:] == top[:, :-1]).any(-1)
    return inexact | ties


def _estimate_falls_back(x: torch.Tensor, k: int) -> torch.Tensor:
    # the kernel's guess (its sum of |x| in float32, here float64: a rate, not a bit-exact copy)
    a = x.abs().double()                                                     # [rows, d]
    e1, e2 = quantize._estimate_coefficients(torch.tensor([k]), a.shape[-1])[0].double()
    s = a.sum(-1)
    t0 = s * e1
    c0 = (a >= t0[:, None]).sum(-1)
    t1 = torch.maximum(torch.minimum(s * (e1 + (c0 - k) * e2), a.amax(-1)), 0.25 * t0)
    c1 = (a >= t1[:, None]).sum(-1)
    n0 = torch.where(c0 >= k, c0 - k + 1, k - c0)
    n1 = torch.where(c1 >= k, c1 - k + 1, k - c1)
    t, c = torch.where(n1 < n0, t1, t0), torch.where(n1 < n0, c1, c0)
    srt = a.sort(-1, descending=True).values                                # [rows, d]
    i = torch.arange(a.shape[-1])[None, :]                                   # 0-based positions
    lo, hi = c.clamp(max=k)[:, None], c.clamp(min=k)[:, None]                # 1-based, walked
    # ties over the walk and at the k-th / (k+1)-th: position i (1-based i + 1) equals the next
    eq = torch.cat([srt[:, 1:] == srt[:, :-1], torch.zeros_like(srt[:, :1], dtype=torch.bool)], -1)
    ties = (eq & (i >= lo - 1) & (i <= hi - 1)).any(-1)
    prev = torch.cat([srt[:, :1], srt[:, :-1]], -1)                          # the value before i
    up = c >= k
    # up from t: t -> the c-th -> ... -> the k-th, each landing less than half its start above it
    first_up = srt.gather(1, (c - 1).clamp(min=0)[:, None])[:, 0] - t >= 0.5 * t
    next_up = ((prev >= 1.5 * srt) & (i >= k) & (i <= c[:, None] - 1)).any(-1)
    # down from t: t -> the (c+1)-th -> ... -> the k-th, each above half its start
    first_down = srt.gather(1, c.clamp(max=a.shape[-1] - 1)[:, None])[:, 0] <= 0.5 * t
    next_down = ((srt <= 0.5 * prev) & (i >= c[:, None] + 1) & (i <= k - 1)).any(-1)
    inexact = torch.where(up, first_up | next_up, first_down | next_down)
    return (torch.minimum(n0, n1) > quantize.NCAP) | (t <= 0) | ties | inexact


def main() -> None:
    kv = real_kv()
    gen = torch.Generator().manual_seed(0)
    print("| rotation | clip ratio | k (d = 64) | path | rows to the fallback | 64-row blocks to the fallback |")
    print("|---|---|---|---|---|---|")
    for rotated in (True, False):
        for ratio in RATIOS:
            rows = blocks = bad_rows = bad_blocks = 0
            for x in kv:                                              # [heads, T, d]
                d = x.shape[-1]
                k = int(clip_counts(ratio, 1, d)[0])
                if rotated:
                    r = torch.linalg.qr(torch.randn(d, d, generator=gen))[0]
                    x = (x - x.mean(1, keepdim=True)) @ r
                f = torch.stack([falls_back(xh, k) for xh in x])      # [heads, T]
                whole = f[:, : f.shape[1] // BLOCK_T * BLOCK_T].reshape(f.shape[0], -1, BLOCK_T).any(-1)
                rows, bad_rows = rows + f.numel(), bad_rows + int(f.sum())
                blocks, bad_blocks = blocks + whole.numel(), bad_blocks + int(whole.sum())
            name = "random orthogonal, centered" if rotated else "none"
            path = "passes from the max" if k <= quantize.KFAST else "estimate"
            print(f"| {name} | {ratio} | {k} | {path} | {bad_rows / rows:.3%} | {bad_blocks / blocks:.1%} |", flush=True)


if __name__ == "__main__":
    main()
