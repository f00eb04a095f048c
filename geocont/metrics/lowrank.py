"""Top-k singular triplets of one large matrix by randomized block Krylov iteration.

Why not the exact route of spectral.py: eigh of a 4096 x 4096 Gram matrix costs seconds and an exact
SVD of a 14336 x 4096 projection ~10 s on two cores, while continuity needs only the top few triplets.

Method (Musco & Musco, "Randomized block Krylov methods for stronger and faster approximate SVD",
NeurIPS 2015). Work in the smaller dimension: B = W (r x c, r <= c) or W^T. Build the block Krylov space
span[B Om, (B B^T) B Om, (B B^T)^2 B Om, ...] one block of `block` vectors per step, orthonormalised
against all earlier blocks (classical Gram-Schmidt twice, then QR), and take Rayleigh-Ritz on it.
Per step: one product with B^T and one with B. At these shapes the products are memory-bound, so a block of
16 costs about what 8 costs and converges faster on clustered spectra.

Keeping Y_j = B^T Q_j and Z_j = B Y_j makes every step's Ritz triplets and residuals free:
Ritz values are the square roots of the eigenvalues of Y^T Y; u = Q w, v = Y w / s, so B^T u = s v exactly and
the only residual is r = B v - s u = Z w / s - s u.

Stopping, after every step (Wedin's theorem bounds the angle of both u1 and v1 to the exact ones by
||r1|| / delta, delta the distance from s1 to the rest of the spectrum; Ritz values never exceed the true ones):
- `converged`: ||r1|| / (s1 - s2 - ||r2||) <= tol (default 0.01, i.e. |cos| to the exact v1 >= 0.99995) and
  ||r2|| <= 5% of s2 (so the reported s1/s2 is good to ~1%, see _decide);
- `flagged`: even the optimistic gap (s1 + ||r1||) / s2 is below `gap_threshold`: v1 is not defined well enough
  to compare across layers, so iterating further would be wasted work (random matrices: s1/s2 ~ 1.003);
- after `max_steps` without either: `converged` if the angle bound holds (s2 alone lagged),
  else `unconverged`.

"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from geocont.metrics.spectral import Spectrum

S2_RTOL = 0.05  # relative residual of s2 at which the gap estimate is taken as final (Ritz value then ~1%)


class TopK(NamedTuple):
    """Top-k triplets of one matrix (as a one-layer Spectrum) and how the iteration ended."""

    spectrum: Spectrum  # s (1, k), U (1, m, k), V (1, n, k), fro2 (1,)
    status: str  # converged | flagged | unconverged
    steps: int  # products with B^T and B, one each per step
    bound: float  # Wedin bound on sin(angle) of u1, v1 to the exact ones (inf when undecided)


def _orthonormalise(Z: Tensor, Q: Tensor, generator: torch.Generator) -> Tensor:
    """Columns of Z made orthonormal and orthogonal to the orthonormal columns of Q (may have 0 columns)."""
    scale = Z.norm()
    for _ in range(2):  # CGS2: one pass leaves O(eps * cond) of Q in Z
        Z = Z - Q @ (Q.mT @ Z)
    Qz, R = torch.linalg.qr(Z)
    weak = R.diagonal().abs() <= 1e-6 * scale.clamp_min(1e-30)
    if weak.any():  # the Krylov space is (nearly) exhausted: continue with fresh random directions
        Z = torch.where(weak, torch.randn(Z.shape, generator=generator, dtype=Z.dtype), Z)
        for _ in range(2):
            Z = Z - Q @ (Q.mT @ Z)
        Qz, _ = torch.linalg.qr(Z)
    return Qz


def block_krylov_top(
    W: Tensor,
    k: int = 8,
    *,
    block: int = 16,
    gap_threshold: float = 1.05,
    tol: float = 0.01,
    max_steps: int = 40,
    seed: int = 0,
) -> TopK:
    """Top-k singular triplets of W (m x n, float32 or float64), stopping as the module docstring says."""
    m, n = W.shape
    wide = m <= n
    B = W if wide else W.mT  # (r, c), r <= c: the Krylov basis lives in R^r
    r, c = B.shape
    k = min(k, r)
    block = min(block, r)
    steps_cap = max(1, min(max_steps, r // block))
    K_max = block * steps_cap
    gen = torch.Generator().manual_seed(seed)

    Q = torch.empty(r, K_max, dtype=W.dtype)  # orthonormal Krylov basis
    Y = torch.empty(c, K_max, dtype=W.dtype)  # B^T Q
    Z = torch.empty(r, K_max, dtype=W.dtype)  # B B^T Q
    G = torch.empty(K_max, K_max, dtype=W.dtype)  # Y^T Y = Q^T B B^T Q
    omega = torch.randn(c, block, generator=gen, dtype=W.dtype)
    Q[:, :block] = _orthonormalise(B @ omega, Q[:, :0], gen)

    status, bound = "unconverged", float("inf")
    for step in range(1, steps_cap + 1):
        K, j = block * step, block * (step - 1)  # basis size after this step, start of the newest block
        Y[:, j:K] = B.mT @ Q[:, j:K]
        Z[:, j:K] = B @ Y[:, j:K]
        G[:K, j:K] = Y[:, :K].mT @ Y[:, j:K]
        G[j:K, :j] = G[:j, j:K].mT
        lam, Wr = torch.linalg.eigh(G[:K, :K])  # ascending
        lam, Wr = lam.flip(0)[:k].clamp_min(0), Wr.flip(1)[:, :k]
        s = lam.sqrt()
        safe = torch.where(s > 0, s, torch.ones_like(s))
        U = Q[:, :K] @ Wr  # (r, k)
        V = (Y[:, :K] @ Wr) / safe  # (c, k)
        res = ((Z[:, :K] @ Wr) / safe - U * s).norm(dim=0)  # ||B v_i - s_i u_i||
        status, bound = _decide(s, res, gap_threshold, tol)
        if status != "undecided" or step == steps_cap:
            break
        Q[:, K : K + block] = _orthonormalise(Z[:, j:K], Q[:, :K], gen)
    if status == "undecided":
        # out of steps (or the whole of R^r spanned, where Rayleigh-Ritz is exact): accurate vectors still count
        status = "converged" if K >= r or bound <= tol else "unconverged"
    if not wide:
        U, V = V, U
    spectrum = Spectrum(s=s[None], U=U[None], V=V[None], fro2=torch.linalg.vector_norm(W).square()[None])
    return TopK(spectrum=spectrum, status=status, steps=step, bound=bound)


def _decide(s: Tensor, res: Tensor, gap_threshold: float, tol: float) -> tuple[str, float]:
    """converged | flagged | undecided, and the Wedin bound on the top pair's angle, from Ritz values/residuals.

    Ritz values never exceed the true ones, so (s1 + r1) / s2 bounds the true gap from above: below the threshold,
    the matrix is flagged at once. Otherwise the iteration goes on until v1 is accurate and the residual of s2 is
    within S2_RTOL of it; the Ritz value itself is then much closer (~r2^2 / (s2 - s3); about 1% on noise bulks, as
    the tests check), so the reported gap is good to ~1% and only a gap that close to the threshold could land on
    the wrong side of it (its v1 and u1 are accurate either way).
    """
    if s.numel() < 2:
        return "converged", 0.0  # rank-1 problem: nothing to separate v1 from
    s1, s2, r1, r2 = s[0].item(), s[1].item(), res[0].item(), res[1].item()
    delta = s1 - s2 - r2
    bound = r1 / delta if delta > 0 else float("inf")
    if s2 > 0 and (s1 + r1) / s2 < gap_threshold:
        return "flagged", bound
    if bound <= tol and r2 <= S2_RTOL * s2:
        return "converged", bound
    return "undecided", bound
