"""The torch-free .pt writer against real torch: what we write, torch.load(weights_only=True)
reads bit for bit. (Reading .pt files is torch's job alone: tests/zoo/test_interop.py.)"""

from __future__ import annotations

import io

import numpy as np
import pytest

from oscar_zoo.zoo.interop.pt_writer import dumps

torch = pytest.importorskip("torch")


def test_torch_reads_what_we_write_bit_exact():
    rng = np.random.default_rng(1)
    layers = {i: {"layer_id": i, "rotation": rng.standard_normal((4, 8, 8)).astype(np.float32),
                  "k_mean": rng.standard_normal((4, 8)).astype(np.float32)} for i in (3, 7)}
    obj = {"format_version": 3, "objective": "oscar2_qqt_r_h_pbr", "source_grouping": "head",
           "layers": layers, "transform": {"centered": True, "orthogonal": True},
           "calibration": {"tokens": 30000, "fitter": "oscar-zoo", "big": 2 ** 40, "x": -1.5}}
    data = dumps(obj, "k_rotation")
    assert dumps(obj, "k_rotation") == data  # deterministic: exports are content-addressed
    back = torch.load(io.BytesIO(data), weights_only=True)
    assert back["format_version"] == 3 and back["transform"] == obj["transform"]
    assert back["calibration"] == obj["calibration"]
    for i in (3, 7):
        for key in ("rotation", "k_mean"):
            assert back["layers"][i][key].dtype == torch.float32
            np.testing.assert_array_equal(back["layers"][i][key].numpy(), layers[i][key])
    mapped = torch.load(io.BytesIO(data), weights_only=True, mmap=False)
    assert mapped["layers"][7]["layer_id"] == 7
