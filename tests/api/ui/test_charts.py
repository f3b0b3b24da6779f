"""The SVG helpers on fresh random data: merged runs decode back to the exact grid, the output
is well-formed XML with labels escaped, and axis helpers pick round numbers."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest
from oscar_zoo.api.ui import charts

RUN = re.compile(r"M(\d+) (\d+)h(\d+)v1h-(\d+)z")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_runs_decode_to_the_grid(seed):
    rng = np.random.default_rng(seed)
    levels = rng.integers(-1, 4, size=(rng.integers(1, 40), rng.integers(1, 70)))
    levels[:, :5] = 2                                   # long runs next to single cells
    decoded = np.full(levels.shape, -1)
    for level, d in charts.runs_path(levels).items():
        for x, y, n, back in RUN.findall(d):
            assert n == back
            row = decoded[int(y), int(x):int(x) + int(n)]
            assert (row == -1).all()                    # no cell is drawn twice
            row[:] = level
    np.testing.assert_array_equal(decoded, levels)


def test_quantize_matches_equal_bins():
    rng = np.random.default_rng(7)
    values = rng.normal(size=(20, 30))
    values[3, 4] = np.nan
    lo, hi = np.nanmin(values), np.nanmax(values)
    got = charts.quantize(values, lo, hi)
    expected = np.minimum(((values - lo) / (hi - lo) * 16) // 1, 15)
    np.testing.assert_array_equal(got[~np.isnan(values)], expected[~np.isnan(values)])
    assert got[3, 4] == -1 and got[~np.isnan(values)].min() == 0 and got.max() == 15
    assert (charts.quantize(np.full((2, 2), 0.9), 0.9, 0.9) == 0).all()   # constant grid


def test_heatmap_and_bars_are_well_formed_and_escaped():
    rng = np.random.default_rng(3)
    svg = charts.heatmap(rng.normal(size=(12, 64)), [f"<{i}&>" for i in range(12)],
                         'K & V "spectra"', "rank <largest>", log=True)
    root = ET.fromstring(str(svg))
    assert root.get("aria-label") == 'K & V "spectra"' and root.get("role") == "img"
    bars = charts.grouped_bars({"a<b": [0.1, None, 0.3], "c": [0.2, 0.1, 0.05]}, ["0", "1", "2"],
                               "t", "y")
    root = ET.fromstring(str(bars))
    paths = root.findall("{http://www.w3.org/2000/svg}path")
    assert len(paths) == 2 and paths[0].get("d").count("M") == 2       # None draws no bar


def test_bars_with_more_series_than_colours():
    """The series are a published bundle's validation variants, as many as its uploader wrote:
    the seventh ran off the colour list and the version page was a 500."""
    n = len(charts.CATEGORY) + 2
    bars = charts.grouped_bars({f"variant-{i}": [0.1, 0.2] for i in range(n)}, ["0", "1"], "t", "y")
    paths = ET.fromstring(str(bars)).findall("{http://www.w3.org/2000/svg}path")
    assert len(paths) == n and paths[n - 1].get("fill") in charts.CATEGORY


def test_axis_helpers():
    assert [charts.nice_max(v) for v in (0.56, 0.1, 3.2, 0.0)] == [0.6, 0.1, 4.0, 1.0]
    assert charts.label_every(30, 12) == 4 and charts.label_every(5, 12) == 1
    assert charts.PALETTE[0] == "#440154" and charts.PALETTE[-1] == "#fde725"
    assert len(set(charts.PALETTE)) == charts.LEVELS


POINT = re.compile(r"([ML])([\d.]+) ([\d.]+)")
NS = "{http://www.w3.org/2000/svg}"


def axis_labels(root: ET.Element) -> list[str]:
    return [t.text for t in root.iter(f"{NS}text") if t.get("class") == "axis"]


def test_lines_decode_to_the_series_and_break_at_gaps():
    rng = np.random.default_rng(11)
    n = 300
    series = {"a": rng.uniform(0, 0.3, n).tolist(), "b": rng.uniform(0.1, 2.0, n).tolist()}
    series["a"][7] = None                                  # a missing layer: the line breaks
    root = ET.fromstring(str(charts.lines(series, [str(i) for i in range(n)], "t", "err")))
    paths = root.findall(f"{NS}path")
    assert [p.get("fill") for p in paths] == ["none", "none"]
    assert [p.get("stroke") for p in paths] == charts.CATEGORY[:2]
    top = charts.nice_max(max(v for s in series.values() for v in s if v is not None))
    for path, values in zip(paths, series.values()):
        points = POINT.findall(path.get("d"))
        kept = [(j, v) for j, v in enumerate(values) if v is not None]
        assert len(points) == len(kept)
        assert [p[0] for p in points].count("M") == 1 + (None in values)
        x = np.array([float(p[1]) for p in points])
        want_x = 48 + (np.array([j for j, _ in kept]) + 0.5) * 760 / n
        np.testing.assert_allclose(x, want_x, atol=0.051)
        y = np.array([float(p[2]) for p in points])
        np.testing.assert_allclose(220 - y, np.array([v for _, v in kept]) * 180 / top, atol=0.051)


def test_per_layer_draws_lines_where_bars_would_not_fit_and_names_its_axes():
    """A 600-layer model's grouped bars were a 5400 px SVG that the page shrank to a strip
    45 px high; past the width that fits, the same series are lines."""
    page_width = 1180 - 2 * 24                          # main's max-width less its padding
    for n, drawn in ((30, "bars"), (120, "lines"), (600, "lines")):
        series = {name: [0.1] * n for name in ("bundle", "hadamard", "naive", "x", "y")}
        root = ET.fromstring(str(charts.per_layer(series, [str(i) for i in range(n)], "t", "err")))
        paths = root.findall(f"{NS}path")
        assert {p.get("fill") == "none" for p in paths} == {drawn == "lines"}, n
        assert float(root.get("width")) <= page_width, (n, root.get("width"))
        assert axis_labels(root) == ["err", "layer"], n
    bars = ET.fromstring(str(charts.grouped_bars({"a": [0.1]}, ["3"], "t", "err", "entry")))
    assert axis_labels(bars) == ["err", "entry"]
