"""A fixed, data-independent low-frequency basis of images: the lowest atoms of the orthonormal 2-D DCT-II.

Used where a release is restricted to low frequencies at no privacy cost (the basis is public): G-PATE's
``gpate.projection=dct`` and GS-WGAN/DPAC's ``dpac.grad_basis`` (the sanitiser's coefficients).
"""
from __future__ import annotations

import math

import torch


def dct_basis(shape: tuple[int, ...], n_basis: int, device: torch.device | None = None) -> torch.Tensor:
    """(d, L): the L lowest-frequency atoms of the orthonormal 2-D DCT-II of a (C, H, W) image, per channel.

    Atoms are ordered by u+v (then max(u, v), u, channel): a fixed, data-independent basis.
    """
    c, h, w = shape
    if not 1 <= n_basis <= c * h * w:
        raise ValueError(f"n_basis must be in [1, {c * h * w}], got {n_basis}")

    def dct_matrix(n: int) -> torch.Tensor:
        x = torch.arange(n, dtype=torch.float64)
        mat = torch.cos(math.pi * (2 * x[None, :] + 1) * x[:, None] / (2 * n)) * math.sqrt(2.0 / n)
        mat[0] /= math.sqrt(2.0)
        return mat  # rows are the orthonormal 1-D atoms

    dh, dw = dct_matrix(h), dct_matrix(w)
    freqs = sorted(((u, v) for u in range(h) for v in range(w)), key=lambda t: (t[0] + t[1], max(t), t[0]))
    atoms = []
    for u, v in freqs:
        for ch in range(c):
            a = torch.zeros(c, h, w, dtype=torch.float64)
            a[ch] = torch.outer(dh[u], dw[v])
            atoms.append(a.flatten())
            if len(atoms) == n_basis:
                return torch.stack(atoms, 1).to(device=device, dtype=torch.float32)
    raise AssertionError("unreachable")
