"""Rotation fitting against the float64 reference formulas, on fresh random data."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oscar_zoo.calibrate import fit

from . import reference as ref


def _spd(rng, d):
    a = rng.standard_normal((d, 3 * d))
    return a @ a.T / (3 * d) + np.diag(rng.random(d) * 5)


@pytest.mark.parametrize("d", [16, 64, 128])
def test_hadamard_and_permutation(d):
    h = fit.hadamard(d).numpy()
    np.testing.assert_allclose(h, ref.hadamard(d), atol=0)
    np.testing.assert_allclose(h @ h, np.eye(d), atol=1e-12)          # symmetric and orthonormal
    eig = np.random.default_rng(d).random(d)
    np.testing.assert_array_equal(fit.bitrev_permutation(torch.from_numpy(eig)).numpy(), ref.bitrev_perm(eig))
    with pytest.raises(ValueError, match="power-of-two"):
        fit.hadamard(96)


@pytest.mark.parametrize("seed", range(3))
def test_r_h_pbr_matches_reference_up_to_eigenvector_signs(seed):
    rng = np.random.default_rng(seed)
    d = 64
    cov = _spd(rng, d)
    rot, eig = fit.fit(torch.from_numpy(cov), "r_h_pbr")
    u_ref, eig_ref, _ = ref.oscar_rotation(cov)
    np.testing.assert_allclose(eig.numpy(), eig_ref, rtol=1e-10)
    # U from R: columns agree with the reference up to sign.
    u = ref.eigenvectors(rot.numpy(), eig_ref)
    np.testing.assert_allclose(np.abs(np.sum(u * u_ref, axis=0)), 1.0, atol=1e-9)
    assert np.abs(rot.numpy() @ rot.numpy().T - np.eye(d)).max() < 1e-12


def test_compositions_are_orthogonal_and_distinct():
    rng = np.random.default_rng(7)
    cov = torch.from_numpy(_spd(rng, 32))
    rots = {c: fit.fit(cov, c)[0] for c in fit.COMPOSITIONS}
    for c, r in rots.items():
        assert (r @ r.T - torch.eye(32, dtype=torch.float64)).abs().max() < 1e-12, c
    assert not torch.allclose(rots["r_h"], rots["r_h_pbr"])
    with pytest.raises(ValueError, match="unknown composition"):
        fit.fit(cov, "h_r")


def test_per_layer_fit_uses_the_head_average_and_per_head_fits_each():
    rng = np.random.default_rng(11)
    covs = torch.from_numpy(np.stack([_spd(rng, 16) for _ in range(3)]))
    rot, eig = fit.fit_side(covs, "r_h_pbr", per_head=False)
    _, eig_ref, _ = ref.oscar_rotation(covs.numpy().mean(0))
    np.testing.assert_allclose(eig.numpy(), eig_ref, rtol=1e-10)
    rot_h, eig_h = fit.fit_side(covs, "r_h_pbr", per_head=True)
    assert rot_h.shape == (3, 16, 16) and eig_h.shape == (3, 16)
    np.testing.assert_allclose(eig_h[2].numpy(), ref.oscar_rotation(covs[2].numpy())[1], rtol=1e-10)
