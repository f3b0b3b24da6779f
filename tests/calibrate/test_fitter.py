"""The background fitter gives exactly what fitting in line gives, from the statistic as it was
when submitted."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oscar_zoo.calibrate import fit
from oscar_zoo.calibrate.fitter import Fitter

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _covs(seed: int, heads: int, d: int) -> torch.Tensor:
    a = torch.from_numpy(np.random.default_rng(seed).standard_normal((heads, d, 3 * d)))
    return a @ a.transpose(1, 2) / (3 * d)                                       # [H, d, d]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("per_head", [False, True])
def test_results_equal_fitting_in_line_and_ignore_later_changes(device, per_head):
    covs = {lid: _covs(lid, 3, 32).to(device) for lid in range(4)}
    want = {lid: fit.fit_side(c.cpu(), "r_h_pbr", per_head) for lid, c in covs.items()}
    with Fitter("r_h_pbr", per_head) as fitter:
        stack = torch.stack([covs[0], covs[1]])
        fitter.submit([0, 1], "k", stack)                # one batched fit of two layers
        stack.mul_(-3.0)                                 # the pass goes on updating its accumulators
        for lid in (2, 3):              # held until release(), as pass 2 does
            fitter.submit([lid], "k", covs[lid][None], hold=True)
            covs[lid].mul_(-3.0)
        fitter.release()
        got = {lid: fitter.result(lid, "k") for lid in covs}
    for lid, (rot, eig) in got.items():
        assert rot.dtype == eig.dtype == torch.float32 and rot.device.type == "cpu"
        torch.testing.assert_close(rot, want[lid][0].float(), rtol=0, atol=1e-6)
        torch.testing.assert_close(eig, want[lid][1].float(), rtol=1e-6, atol=0)
    assert fitter.busy_s > 0


def test_fixed_rotations_and_worker_errors_reach_the_caller():
    with Fitter("r_h_pbr", per_head=False) as fitter:
        fitter.fixed(0, "v", *fit.fixed_rotation("hadamard", 16, 2, per_head=False))
        fitter.submit([1], "k", _covs(0, 2, 12)[None])                   # 12 is no power of two
        rot, _ = fitter.result(0, "v")
        torch.testing.assert_close(rot, fit.hadamard(16).float())
        with pytest.raises(ValueError, match="power-of-two"):
            fitter.result(1, "k")
        with pytest.raises(RuntimeError, match="submitted twice"):
            fitter.submit([0], "v", _covs(1, 2, 16)[None])
