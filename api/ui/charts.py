"""Small inline-SVG charts, rendered on the server: no JavaScript, no external files.

    heatmap(values, row_labels, title=..., x_label=..., log=True)   # layers x index grid
    per_layer({"bundle": [...], "naive": [...]}, labels, title=..., y_label=...)
        # grouped bars, or lines where the bars of a deep model would be too thin to see

Grids stay light: colours are quantized to LEVELS steps, and neighbouring cells of one colour in
a row are merged into one rectangle, so a 92 x 128 spectrum (sorted, hence smooth along a row)
is a few hundred path segments, not 12k elements. Cells are drawn in a scaled group whose unit
is one cell, so every coordinate is a small integer.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from markupsafe import Markup, escape

# viridis at 9 stops; 16 levels are interpolated from it (perceptually even, colour-blind safe).
_VIRIDIS = ["#440154", "#472d7b", "#3b528b", "#2c728e", "#21918c", "#28ae80", "#5ec962",
            "#addc30", "#fde725"]
LEVELS = 16
# Okabe-Ito colours for categories (colour-blind safe), in the order the variants are listed.
CATEGORY = ["#0072b2", "#e69f00", "#009e73", "#d55e00", "#cc79a7", "#56b4e9"]


def _rgb(h: str) -> np.ndarray:
    return np.array([int(h[i:i + 2], 16) for i in (1, 3, 5)], float)


def palette(n: int = LEVELS) -> list[str]:
    stops = np.array([_rgb(c) for c in _VIRIDIS])
    pos = np.linspace(0, len(stops) - 1, n)
    lo = np.floor(pos).astype(int).clip(0, len(stops) - 2)
    rgb = stops[lo] + (pos - lo)[:, None] * (stops[lo + 1] - stops[lo])
    return ["#%02x%02x%02x" % tuple(int(round(c)) for c in row) for row in rgb]


PALETTE = palette()


def quantize(values: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """values -> colour level 0..LEVELS-1 (NaN -> -1, drawn as a gap)."""
    span = hi - lo if hi > lo else 1.0
    levels = np.floor((values - lo) / span * LEVELS).clip(0, LEVELS - 1)
    return np.where(np.isnan(values), -1, levels).astype(int)


def runs_path(levels: np.ndarray) -> dict[int, str]:
    """level -> path data of its cells, one `M x y h w v1 h -w z` per run of equal cells in a row."""
    parts: dict[int, list[str]] = {}
    for y, row in enumerate(levels):
        starts = np.concatenate(([0], np.flatnonzero(np.diff(row)) + 1))
        ends = np.append(starts[1:], len(row))
        for x, end, level in zip(starts.tolist(), ends.tolist(), row[starts].tolist()):
            if level >= 0:
                parts.setdefault(level, []).append(f"M{x} {y}h{end - x}v1h-{end - x}z")
    return {k: "".join(v) for k, v in parts.items()}


def _svg(width: float, height: float, label: str, body: str) -> Markup:
    return Markup(f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width:g} {height:g}" '
                  f'width="{width:g}" height="{height:g}" role="img" aria-label="{escape(label)}" '
                  f'class="chart"><title>{escape(label)}</title>{body}</svg>')


def _text(x: float, y: float, s: str, anchor: str = "start", cls: str = "tick") -> str:
    return f'<text x="{x:g}" y="{y:g}" text-anchor="{anchor}" class="{cls}">{escape(s)}</text>'


def label_every(n: int, most: int = 12) -> int:
    """Step between axis labels so at most `most` are drawn."""
    steps = (1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 50, 64, 100, 128, 250, 500, 1000)
    return next((s for s in steps if n / s <= most), n)


def fmt(v: float, log: bool) -> str:
    """An axis or legend value; `v` is log10 of the value when `log`."""
    return f"{10.0 ** v:.2g}" if log else f"{v:.3g}"


# --- heatmap ---------------------------------------------------------------------------------

def heatmap(values: np.ndarray, row_labels: Sequence[str], title: str, x_label: str,
            lo: float | None = None, hi: float | None = None, log: bool = False,
            cell: tuple[float, float] = (2, 4), y_label: str = "layer") -> Markup:
    """values [rows, cols] (already log10 when `log`) as a colour grid with a legend below."""
    rows, cols = values.shape
    lo = float(np.nanmin(values)) if lo is None else lo
    hi = float(np.nanmax(values)) if hi is None else hi
    cw, ch = cell
    ml, mt, pw, ph = 44, 34, cols * cw, rows * ch
    body = [_text(0, 13, title, "start", "title"), _text(ml - 4, mt - 6, y_label, "end", "axis"),
            _cells(values, lo, hi, ml, mt, cw, ch),
            f'<rect x="{ml}" y="{mt}" width="{pw:g}" height="{ph:g}" class="frame"/>',
            _row_ticks(row_labels, ml, mt, ch), _col_ticks(cols, ml, mt + ph, cw),
            _text(ml + pw / 2, mt + ph + 26, x_label, "middle", "axis"),
            legend(lo, hi, ml, mt + ph + 34, log)]
    return _svg(max(ml + pw + 12, ml + 200, 7 * len(title)), mt + ph + 50, title, "".join(body))


def _cells(values: np.ndarray, lo: float, hi: float, x: float, y: float, cw: float,
           ch: float) -> str:
    paths = runs_path(quantize(values, lo, hi))
    inner = "".join(f'<path fill="{PALETTE[k]}" d="{d}"/>' for k, d in sorted(paths.items()))
    return (f'<g transform="translate({x:g} {y:g}) scale({cw:g} {ch:g})" '
            f'shape-rendering="crispEdges">{inner}</g>')


def _row_ticks(labels: Sequence[str], x: float, y: float, ch: float) -> str:
    step = label_every(len(labels), max(2, int(len(labels) * ch / 14)))
    return "".join(_text(x - 4, y + (i + 0.5) * ch + 3, labels[i], "end")
                   for i in range(0, len(labels), step))


def _col_ticks(cols: int, x: float, y: float, cw: float) -> str:
    step = label_every(cols, max(2, int(cols * cw / 28)))
    return "".join(_text(x + (i + 0.5) * cw, y + 11, str(i), "middle")
                   for i in range(0, cols, step))


def legend(lo: float, hi: float, x: float, y: float, log: bool) -> str:
    """The colour scale: LEVELS swatches from lo to hi, end values written beside it."""
    swatches = "".join(f'<rect x="{x + 8 * i}" y="{y}" width="8" height="10" fill="{c}"/>'
                       for i, c in enumerate(PALETTE))
    return (swatches + _text(x - 4, y + 9, fmt(lo, log), "end")
            + _text(x + 8 * LEVELS + 4, y + 9, fmt(hi, log) + (" (log scale)" if log else "")))


# --- per-layer series: grouped bars, or lines -------------------------------------------------

MIN_BAR, MAX_PLOT = 1.5, 1000   # px: the thinnest bar drawn, the widest plot that fits the page


def per_layer(series: dict[str, Sequence[float]], labels: Sequence[str], title: str,
              y_label: str, x_label: str = "layer") -> Markup:
    """Grouped bars while every bar can be MIN_BAR wide within MAX_PLOT, else lines: a
    600-layer model's bars were a 5400 px chart that the page shrank to a 45 px strip."""
    if len(labels) * (max(len(series), 1) + 1) * MIN_BAR <= MAX_PLOT:
        return grouped_bars(series, labels, title, y_label, x_label)
    return lines(series, labels, title, y_label, x_label)


def grouped_bars(series: dict[str, Sequence[float]], labels: Sequence[str], title: str,
                 y_label: str, x_label: str = "layer", height: float = 180) -> Markup:
    """One group of bars per label (e.g. per layer), one bar per series, legend on top."""
    n, k = len(labels), max(len(series), 1)
    bw = max(MIN_BAR, min(10.0, 760 / max(n * (k + 1), 1)))
    gw, ml, mt = bw * (k + 1), 48, 40
    top = _top(series)
    body = [_y_axis(top, ml, mt, height, n * gw)]
    for i, (name, values) in enumerate(series.items()):
        colour = CATEGORY[i % len(CATEGORY)]  # an uploaded report may hold any number of series
        body.append(_bars(values, ml + i * bw, mt + height, gw, bw, height / top, colour))
        body.append(_key(ml + i * 120, 4, name, colour))
    step = label_every(n, max(2, int(n * gw / 28)))
    body += [_text(ml + j * gw + k * bw / 2, mt + height + 12, labels[j], "middle")
             for j in range(0, n, step)]
    body += _axis_labels(ml, mt, height, n * gw, x_label, y_label)
    return _svg(max(ml + n * gw + 8, ml + k * 120), mt + height + 32, title, "".join(body))


def lines(series: dict[str, Sequence[float]], labels: Sequence[str], title: str, y_label: str,
          x_label: str = "layer", width: float = 760, height: float = 180) -> Markup:
    """One line per series, point j at the middle of the j-th of len(labels) equal slots; a
    None value breaks the line."""
    n, k, ml, mt = len(labels), max(len(series), 1), 48, 40
    dx, top = width / max(n, 1), _top(series)
    body = [_y_axis(top, ml, mt, height, width)]
    for i, (name, values) in enumerate(series.items()):
        colour = CATEGORY[i % len(CATEGORY)]
        body.append(_line(values, ml, mt + height, dx, height / top, colour))
        body.append(_key(ml + i * 120, 4, name, colour))
    step = label_every(n, max(2, int(width / 28)))
    body += [_text(ml + (j + 0.5) * dx, mt + height + 12, labels[j], "middle")
             for j in range(0, n, step)]
    body += _axis_labels(ml, mt, height, width, x_label, y_label)
    return _svg(max(ml + width + 8, ml + k * 120), mt + height + 32, title, "".join(body))


def _top(series: dict[str, Sequence[float]]) -> float:
    return nice_max(max((v for s in series.values() for v in s if v is not None), default=1.0))


def _axis_labels(x: float, y: float, height: float, width: float, x_label: str,
                 y_label: str) -> list[str]:
    return [_text(0, y - 12, y_label, "start", "axis"),
            _text(x + width / 2, y + height + 26, x_label, "middle", "axis")]


def _line(values: Sequence[float], x0: float, base: float, dx: float, scale: float,
          colour: str) -> str:
    d, pen = [], "M"
    for j, v in enumerate(values):
        if v is None:
            pen = "M"
            continue
        d.append(f"{pen}{x0 + (j + 0.5) * dx:.1f} {base - v * scale:.1f}")
        pen = "L"
    return (f'<path fill="none" stroke="{colour}" stroke-width="1.5" stroke-linejoin="round" '
            f'stroke-linecap="round" d="{"".join(d)}"/>')


def _bars(values: Sequence[float], x0: float, base: float, gw: float, bw: float, scale: float,
          colour: str) -> str:
    d = "".join(f"M{x0 + j * gw:.1f} {base:g}h{bw:.1f}v{-v * scale:.1f}h{-bw:.1f}z"
                for j, v in enumerate(values) if v is not None)
    return f'<path fill="{colour}" d="{d}"/>'


def _y_axis(top: float, x: float, y: float, height: float, width: float) -> str:
    out = []
    for i in range(5):
        v, yy = top * i / 4, y + height - height * i / 4
        out.append(f'<line x1="{x}" x2="{x + width:g}" y1="{yy:g}" y2="{yy:g}" class="grid"/>')
        out.append(_text(x - 4, yy + 3, f"{v:.3g}", "end"))
    return "".join(out)


def _key(x: float, y: float, name: str, colour: str) -> str:
    return (f'<rect x="{x}" y="{y}" width="10" height="10" fill="{colour}"/>'
            + _text(x + 14, y + 9, name, "start", "key"))


def nice_max(v: float) -> float:
    """The smallest round number (1, 1.2, 1.5, 2, ... 8 x 10^k) at or above v: an axis top."""
    if not v > 0:
        return 1.0
    exp = 10.0 ** np.floor(np.log10(v))
    top = next(m * exp for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10) if m * exp >= v * (1 - 1e-9))
    return float(f"{top:.6g}")  # 6 x 0.1 is 0.6000000000000001 in binary
