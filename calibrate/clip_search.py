"""Clip ratios searched per layer (optionally per KV head) against the attention block's output.

OSCAR ships one ratio per side (K 0.96, V 0.92) for every model and layer. Measured on the test
model, ratios chosen per layer from a grid reaching well below 0.9 cut the INT2 loss by ~2.5x
(quality-variants.md). Objective: squared error of the attention block's output after o_proj,
on calibration query positions outside the BF16 windows, under the exact INT2 quantizer and the
sink/recent window mask. K is chosen first with V in full precision, then V with K at its choice.
A cache that several layers read (KV-shared models) is searched once, against their summed error;
until its last reader has attended, each reader waits as a Reader holding only the query rows
the search reads (clip_queries of a window's positions), not its whole queries and mask.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from oscar_zoo.zoo.errors import InvalidInput

from .int2_attention import Quantizer, dequantized, is_causal, row_attention

GRID = (0.62, 0.69, 0.75, 0.80, 0.85, 0.89, 0.92, 0.94, 0.97, 1.0)


@dataclass
class LayerClips:
    k: torch.Tensor                                     # [H] chosen ratios
    v: torch.Tensor                                     # [H]
    k_curve: list[float] = field(default_factory=list)  # relative error per GRID value (uniform clip)
    v_curve: list[float] = field(default_factory=list)


def query_rows(t: int, sink: int, recent: int, n: int, seed: int) -> torch.Tensor:
    """Up to n query positions whose cache has an INT2 part (i >= sink + recent)."""
    first = sink + recent
    if t <= first:
        raise InvalidInput(f"windows of {t} tokens have no INT2 keys with sink {sink} + recent "
                         f"{recent}; use --seq-len > {first} (2048 is a good choice)")
    rows = torch.arange(first, t)
    if len(rows) > n:
        g = torch.Generator().manual_seed(seed)
        rows = rows[torch.randperm(len(rows), generator=g)[:n]].sort().values
    return rows


@dataclass
class Reader:
    """One attention layer reading a cache, as the search reads it: only the query rows `rows`.
    A KV-shared cache's readers wait until its last one has attended (up to ~16 at once on
    Gemma 3n), and the search reads clip_queries of a window's positions (256 of 2048 by
    default): whole queries and masks would hold ~8x more for nothing. Make one with `of`."""
    module: object                  # its o_proj maps the attention output
    q: torch.Tensor                 # [B, Hq, R, d] the queries at rows
    allowed: torch.Tensor           # [B|1, 1, R, T] the model's mask at rows (True = may attend)
    rows: torch.Tensor              # [R] query positions in the window, on q's device
    causal: bool                    # of the whole [T, T] mask (int2_attention.row_attention)
    scaling: float

    @classmethod
    def of(cls, module, q, allowed, scaling: float, rows: torch.Tensor) -> Reader:
        """q: [B, Hq, T, d]; allowed: bool [B|1, 1, T, T]; rows: [R] (query_rows)."""
        rows = rows.to(q.device)
        # indexing with a tensor copies, so no view keeps the whole q or mask alive
        return cls(module, q[:, :, rows], allowed[:, :, rows], rows,
                   is_causal(allowed, q.shape[2]), scaling)


def search_layer(module, q, k, v, allowed, scaling: float, rot_k, rot_v, mean, group_size: int,
                 sink: int, recent: int, rows: torch.Tensor, quantizer: Quantizer,
                 per_head: bool = False, grid=GRID) -> LayerClips:
    """q: [B, Hq, T, d]; k, v: [B, H, T, d]; returns the chosen clips and the error curves."""
    return search_cache([Reader.of(module, q, allowed, scaling, rows)], k, v, rot_k, rot_v, mean,
                        group_size, sink, recent, quantizer, per_head, grid)


def search_cache(readers: list[Reader], k, v, rot_k, rot_v, mean, group_size: int, sink: int,
                 recent: int, quantizer: Quantizer, per_head: bool = False,
                 grid=GRID) -> LayerClips:
    """Clips of one stored cache, k, v: [B, H, T, d], against the relative output error summed
    over every layer that reads it. An engine stores a KV-shared model's K/V once, with one set
    of clips, for the layer that wrote them and the later layers that read them (Gemma 3n,
    Gemma 4): a clip good for the writer alone may cost its readers more. The curves are the
    sums, so global_pair weighs each layer once however the caches are shared."""
    heads = k.shape[1]
    errors = [_relative_error(r, k, v, sink, recent) for r in readers]

    def err(k_i, v_i) -> float:
        return sum(e(k_i, v_i) for e in errors)

    def candidates(x, rot, m):
        # Rows quantize independently, so one tensor per ratio serves every per-head mix.
        return [dequantized(x, rot, torch.full((heads,), c), group_size, m, quantizer) for c in grid]

    k_cands = candidates(k, rot_k, mean)
    k_curve = [err(kc, v) for kc in k_cands]
    k_choice = _choose(k_curve, k_cands, heads, per_head, lambda kc: err(kc, v), grid)
    k_best = _assemble(k_cands, k_choice, grid)
    v_cands = candidates(v, rot_v, None)
    v_curve = [err(k_best, vc) for vc in v_cands]
    v_choice = _choose(v_curve, v_cands, heads, per_head, lambda vc: err(k_best, vc), grid)
    return LayerClips(torch.tensor(k_choice, dtype=torch.float32),
                      torch.tensor(v_choice, dtype=torch.float32), k_curve, v_curve)


def _relative_error(reader: Reader, k, v, sink: int, recent: int):
    """(k_i, v_i) -> ||o - o_ref||^2 / ||o_ref||^2 of the reader's attention block output after
    o_proj at its query positions, o_ref over an all-BF16 cache."""
    out_proj = _output_projection(reader.module, reader.q.shape)
    # a device_map'd model may hold the cache on another GPU than a layer reading it; `.to` is
    # the tensor itself on the same device, so row_attention still knows the BF16 reference
    dev = reader.q.device
    k_here, v_here = k.to(dev), v.to(dev)

    def attention(k_i, v_i):
        k_i = k_here if k_i is k else k_i.to(dev)
        v_i = v_here if v_i is v else v_i.to(dev)
        return out_proj(row_attention(reader.q, k_here, v_here, reader.allowed, reader.scaling,
                                      k_i, v_i, sink, recent, reader.rows, reader.causal)).float()

    ref = attention(k, v)
    scale = float((ref ** 2).sum().clamp_min(1e-30))

    def err(k_i, v_i) -> float:
        return float(((attention(k_i, v_i) - ref) ** 2).sum()) / scale

    return err


def _choose(curve, cands, heads, per_head, evaluate, grid) -> list[float]:
    best = grid[min(range(len(grid)), key=curve.__getitem__)]
    choice = [best] * heads
    if not per_head:
        return choice
    for h in range(heads):          # one sweep of coordinate descent over the heads
        scores = []
        for c in grid:
            trial = list(choice)
            trial[h] = c
            scores.append(evaluate(_assemble(cands, trial, grid)))
        choice[h] = grid[min(range(len(grid)), key=scores.__getitem__)]
    return choice


def _assemble(cands, choice, grid) -> torch.Tensor:
    # cands[i]: [B, H, T, d] at grid[i]; take head h from the candidate of its chosen ratio
    return torch.stack([cands[grid.index(c)][:, h] for h, c in enumerate(choice)], dim=1)


def _output_projection(module, q_shape):
    b, hq, _, d = q_shape
    o_proj = getattr(module, "o_proj", None)

    def project(o):  # o: [B, R, Hq, d]
        flat = o.reshape(b, o.shape[1], hq * d)
        return flat if o_proj is None else o_proj(flat.to(o_proj.weight.dtype))

    return project


def global_pair(curves: list[list[float]], grid=GRID) -> float:
    """The single ratio minimising the summed relative error over layers (for one-setting engines)."""
    totals = [sum(c[i] for c in curves) for i in range(len(grid))]
    return grid[min(range(len(grid)), key=totals.__getitem__)]
