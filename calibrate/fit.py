"""From second moments to rotations (oscar-spec 2.4-2.7), all in float64.

    eigh(C) -> U (columns, eigenvalues ascending)
    H       normalised Sylvester Hadamard, symmetric, entries +-1/sqrt(d)
    P       bit-reversal permutation by eigenvalue order: perm[br(i)] = argsort(eig, desc)[i]
Compositions (matrix-product order; rows are right-multiplied, stored k = k_row @ R):
    r_h_pbr = U H P (OSCAR's default)   r_h = U H   pbr = U P   plain = U
"""

from __future__ import annotations

from functools import lru_cache

import torch

COMPOSITIONS = ("r_h_pbr", "r_h", "pbr", "plain")


def hadamard(d: int) -> torch.Tensor:
    return _hadamard(d).clone()


@lru_cache(maxsize=8)
def _hadamard(d: int) -> torch.Tensor:
    if d <= 0 or d & (d - 1):
        raise ValueError(f"Hadamard needs a power-of-two head_dim, got {d}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / d ** 0.5


def bit_reverse(i: int, bits: int) -> int:
    return int(format(i, f"0{bits}b")[::-1], 2)


@lru_cache(maxsize=8)
def _bit_reversed(d: int) -> torch.Tensor:
    bits = d.bit_length() - 1
    return torch.tensor([bit_reverse(i, bits) for i in range(d)], dtype=torch.long)


def bitrev_permutation(eigenvalues: torch.Tensor) -> torch.Tensor:
    """P = I[:, perm] with perm[br(i)] = i-th largest eigenvalue's index."""
    d = eigenvalues.shape[-1]
    perm = torch.empty(d, dtype=torch.long)
    perm[_bit_reversed(d)] = torch.argsort(eigenvalues.cpu(), descending=True)
    return torch.eye(d, dtype=torch.float64)[:, perm]


def compose(u: torch.Tensor, eigenvalues: torch.Tensor, composition: str) -> torch.Tensor:
    """u: [..., d, d] eigenvector columns, eigenvalues [..., d] -> rotations [..., d, d]."""
    d = u.shape[-1]
    if composition == "plain":
        return u
    mixed = u @ hadamard(d) if composition in ("r_h", "r_h_pbr") else u
    if composition == "r_h":
        return mixed
    if composition not in ("pbr", "r_h_pbr"):
        raise ValueError(f"unknown composition {composition!r}; choose from {', '.join(COMPOSITIONS)}")
    # M P with P = I[:, perm] is M[..., perm]: column br(i) <- the i-th largest eigenvalue's column
    perm = torch.empty(eigenvalues.shape, dtype=torch.long)
    perm[..., _bit_reversed(d)] = torch.argsort(eigenvalues.cpu(), dim=-1, descending=True)
    return torch.gather(mixed, -1, perm.to(mixed.device).unsqueeze(-2).expand(mixed.shape))


def fit(cov: torch.Tensor, composition: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(rotations [..., d, d], eigenvalues [..., d] ascending) of symmetric second moments
    [..., d, d]; a stack of many layers is one batched eigh."""
    sym = (cov + cov.transpose(-1, -2)) / 2
    eigenvalues, u = torch.linalg.eigh(sym.to(torch.float64))
    return compose(u, eigenvalues, composition), eigenvalues


def fit_side(covs: torch.Tensor, composition: str, per_head: bool):
    """covs: [..., H, d, d] per KV head. Per layer: one rotation of the head-average (equal group
    sizes make it the mean over all query heads, oscar-spec 2.2). Returns rotations [..., d, d]
    or [..., H, d, d] and eigenvalues [..., d] or [..., H, d]."""
    return fit(covs if per_head else covs.mean(-3), composition)


def fixed_rotation(kind: str, d: int, heads: int, per_head: bool):
    """Data-free rotations: 'hadamard' (QuaRot-style) or 'identity' (naive INT2)."""
    r = hadamard(d) if kind == "hadamard" else torch.eye(d, dtype=torch.float64)
    eig = torch.ones(d, dtype=torch.float64)
    if per_head:
        return r.expand(heads, d, d).clone(), eig.expand(heads, d).clone()
    return r, eig
