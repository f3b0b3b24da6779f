"""The version page's pictures, from the same data the JSON API serves.

- eigenvalue spectra and clip thresholds: the `{side}.{layer}.eigenvalues` and `.clip` tensors,
  cut out of the stored rotations.safetensors by the layers endpoint's own reader
  (api/routes/layers.py), the bytes GET .../layers/{layer} returns;
- per-layer attention error: the manifest's validation report (as GET .../versions/{ref});
- the per-layer table: both of the above, as numbers, a row per layer.
"""

from __future__ import annotations

import numpy as np
from fastapi import Request
from markupsafe import Markup

from ..routes.layers import _read, _tensor_file
from . import charts

SIDES = {"k": "K (keys)", "v": "V (values)"}
VARIANTS = ("bundle", "bundle-served", "oscar-shipped", "hadamard", "naive")


def _cell_h(rows: int) -> float:
    return float(min(14, max(3, 240 // max(rows, 1))))


def padded(rows: list[np.ndarray | None]) -> np.ndarray:
    """Ragged 1-D rows -> [len(rows), longest] with NaN gaps (layers may differ in head_dim; a
    missing row, None, is all gap)."""
    rows = [np.empty(0) if r is None else r for r in rows]
    out = np.full((len(rows), max((len(r) for r in rows), default=0)), np.nan)
    for i, r in enumerate(rows):
        out[i, :len(r)] = r
    return out


def log_spectrum(eig: np.ndarray) -> np.ndarray:
    """[d] or [h, d] eigenvalues -> [d] log10, sorted largest first, mean over KV heads."""
    e = np.sort(np.atleast_2d(eig.astype(np.float64)), axis=-1)[:, ::-1]
    floor = max(float(e.max()) * 1e-12, 1e-30)  # fitted covariances can be rank-deficient
    return np.log10(np.maximum(e, floor)).mean(axis=0)


def side_tensors(request: Request, version, layers: list[int], kind: str) -> dict[str, list]:
    """side -> one `{side}.{layer}.{kind}` array per layer, None where a layer lacks it (one
    missing tensor must not hide the others); sides that lack them all are left out."""
    path, spans = _tensor_file(request, version)
    out = {}
    for side in SIDES:
        keys = [f"{side}.{layer}.{kind}" for layer in layers]
        if any(k in spans for k in keys):
            out[side] = [_read(path, spans[k]) if k in spans else None for k in keys]
    return out


def spectra(request: Request, version, layers: list[int]) -> dict[str, Markup]:
    """side -> heatmap of log eigenvalues, layers x rank (absent when the bundle has none)."""
    out = {}
    for side, eigs in side_tensors(request, version, layers, "eigenvalues").items():
        grid = padded([None if e is None else log_spectrum(e) for e in eigs])
        out[side] = charts.heatmap(
            grid, [str(i) for i in layers], f"{SIDES[side]}: eigenvalue spectrum per layer",
            "eigenvalue rank (largest first)", log=True,
            cell=(max(1.0, 256 // grid.shape[1]), _cell_h(len(layers))))
    return out


def layer_clips(request: Request, version, layers: list[int]) -> dict[str, list]:
    """side -> each layer's clip ratios, [kv_heads] (None where a layer lacks them)."""
    return side_tensors(request, version, layers, "clip")


def clip_grids(clips: dict[str, list], layers: list[int]) -> dict[str, Markup]:
    """side -> layers x KV heads grid of clip ratios, one colour scale for K and V."""
    grids = {side: padded(c) for side, c in clips.items()}
    if not grids:
        return {}
    lo = min(float(np.nanmin(g)) for g in grids.values())
    hi = max(float(np.nanmax(g)) for g in grids.values())
    return {side: charts.heatmap(g, [str(i) for i in layers], f"{SIDES[side]}: clip ratio per "
                                 "layer and KV head", "KV head", lo, hi,
                                 cell=(max(4.0, 96 // g.shape[1]), _cell_h(len(layers))))
            for side, g in grids.items()}


def layer_errors(validation: dict | None) -> dict[str, list]:
    """variant -> its per-layer attention errors (the report's order: the bundle's layers,
    ascending), the known variants first; variants without them are left out."""
    variants = {v["name"]: v.get("per_layer_attn_rel_error") or []
                for v in (validation or {}).get("variants", [])}
    series = {n: variants[n] for n in VARIANTS if variants.get(n)}
    series.update({n: s for n, s in variants.items() if n not in series and s})
    return series


def attention_error(validation: dict | None, layers: list[int]) -> Markup | None:
    """Per-layer attention-output error, bundle beside the baselines (bars, or lines for a
    deep model). Labelled with the version's layer ids where every list has one entry per
    layer; else by position, and the axis says so (an uploaded report may not match)."""
    series = layer_errors(validation)
    if not series:
        return None
    if all(len(s) == len(layers) for s in series.values()):
        labels, x_label = [str(i) for i in layers], "layer"
    else:
        n = max(len(s) for s in series.values())
        labels = [str(i) for i in range(n)]
        x_label = f"entry of the report's per-layer list (this version has {len(layers)} layers)"
    return charts.per_layer(series, labels, "Attention output error per layer, relative to "
                            "BF16 (lower is better)", "||o - o_bf16|| / ||o_bf16||", x_label)


def span(values: np.ndarray | None) -> str:
    """A layer's clip ratios over its KV heads: "0.950", or "0.913–0.975"."""
    if values is None or not len(values):
        return "–"
    lo, hi = f"{float(np.min(values)):.3f}", f"{float(np.max(values)):.3f}"
    return lo if lo == hi else f"{lo}–{hi}"


def layer_table(layers: list[int], clips: dict[str, list], validation: dict | None) -> dict:
    """The numbers behind the per-layer pictures, a row per layer: its clip ratios per side and
    each variant's attention error (variants whose list has one entry per layer)."""
    errors = {n: s for n, s in layer_errors(validation).items() if len(s) == len(layers)}
    return {"sides": [SIDES[side] for side in clips], "variants": list(errors),
            "rows": [{"layer": layer, "clips": [span(c[i]) for c in clips.values()],
                      "errors": [s[i] for s in errors.values()]}
                     for i, layer in enumerate(layers)]}
