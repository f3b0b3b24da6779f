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
