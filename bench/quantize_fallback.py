"""How often quantize_kv's fast threshold path hands a row, and so its whole 64-row block, to the
exact fallback, on the test model's real K and V (CPU, a minute).

The fast path (clip count k <= quantize.KFAST, one group per row) vouches for a row when it holds
values of both signs, each of its k - 1 passes lands on a value above half the previous one
(Sterbenz), and no two of the k + 1 largest |x| tie. This script evaluates those conditions in
torch over every layer's post-RoPE K and V of SmolLM2-135M (1,024 tokens of reference prose),
rotated by a random orthogonal matrix after centering (as an OSCAR bundle would) and unrotated.
It tells whether raising KFAST makes blocks fall back more often.

    python bench/quantize_fallback.py
"""

from __future__ import annotations

import pydoc_data.topics as topics

import torch

from oscar_zoo.calibrate import capture
from oscar_zoo.calibrate.loading import load_model, resolve_source
from oscar_zoo.kernels.quantize import clip_counts

RATIOS = (0.96, 0.92, 0.85, 0.79)
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
    """x: [rows, d] -> bool [rows], True where the fast path cannot vouch for the row."""
    top = x.abs().sort(-1, descending=True).values[:, :k + 1]
    inexact = (top[:, 1:k] <= 0.5 * top[:, :k - 1]).any(-1)
    ties = (top[:, 1:] == top[:, :-1]).any(-1)
    one_sign = (x >= 0).all(-1) | (x < 0).all(-1)
    return inexact | ties | one_sign


def main() -> None:
    kv = real_kv()
    gen = torch.Generator().manual_seed(0)
    print("| rotation | clip ratio | k (d = 64) | rows to the fallback | 64-row blocks to the fallback |")
    print("|---|---|---|---|---|")
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
            print(f"| {name} | {ratio} | {k} | {bad_rows / rows:.3%} | {bad_blocks / blocks:.1%} |", flush=True)


if __name__ == "__main__":
    main()
