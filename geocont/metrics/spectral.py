"""Geometric-continuity metrics over stacks of same-role weight matrices.

A stack is a tensor W of shape (L, m, n): layer l's matrix in PyTorch orientation (out x in).
Right singular vectors v_i live in the input space (R^n), left ones u_i in the output space (R^m).

Everything here is plain torch: tensors in, floats (or dicts of floats) out. The decomposition
goes through eigh of the smaller Gram matrix (W^T W or W W^T), which is exact and about twice as
fast as a full SVD; singular vectors have arbitrary signs, so every comparison uses |cos|.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor


class Spectrum(NamedTuple):
    """Singular triplets of every matrix in a stack (svd_top: the top k, in descending order of s)."""

    s: Tensor  # (L, k)
    U: Tensor  # (L, m, k) left singular vectors (columns)
    V: Tensor  # (L, n, k) right singular vectors (columns)
    fro2: Tensor  # (L,) squared Frobenius norms, for sigma^2 weights


def random_baseline(d: int) -> float:
    """E|cos| between two independent random unit vectors in R^d, for large d: sqrt(2 / (pi d))."""
    return math.sqrt(2.0 / (math.pi * d))


class NonFiniteMatrix(ValueError):
    """A stack holds NaN or inf (a diverged run): its continuity is undefined."""


def _as_stack(W: Tensor) -> Tensor:
    W = W.detach()
    if W.dim() == 2:
        W = W.unsqueeze(0)
    return W if W.dtype == torch.float64 else W.float()


def _gram_eigh(W: Tensor) -> tuple[Tensor, Tensor, Tensor, bool]:
    """eigh of the smaller Gram matrix of every layer: (s ascending (L, r), vectors (L, d, r), fro2 (L,), wide).

    `wide` says the vectors are left ones (the m x m Gram W W^T), else right ones. ||W||_F^2 is the
    Gram's trace, so it costs nothing; the trace is also the finiteness check (a NaN or inf anywhere
    in W reaches the diagonal), which saves a pass over W.
    """
    L, m, n = W.shape
    wide = m < n
    gram = W @ W.mT if wide else W.mT @ W
    fro2 = gram.diagonal(dim1=-2, dim2=-1).sum(-1)
    if not bool(torch.isfinite(fro2).all()):
        if not bool(torch.isfinite(W).all()):
            raise NonFiniteMatrix("the matrix stack holds NaN or inf")
        # finite but huge (a diverging run): the fp32 Gram overflowed, so scale each layer to max |w| = 1
        # and give s and ||W||_F^2 back in float64, where s^2 still fits.
        scale = W.abs().amax(dim=(-2, -1), keepdim=True).clamp_min(1e-30)
        s, vectors, fro2, wide = _gram_eigh(W / scale)
        scale = scale.view(L).double()
        return s.double() * scale.unsqueeze(1), vectors, fro2.double() * scale.square(), wide
    evals, vectors = torch.linalg.eigh(gram)  # ascending
    return evals.clamp_min(0).sqrt(), vectors, fro2, wide


def _other_side(W: Tensor, vectors: Tensor, s: Tensor, wide: bool) -> Tensor:
    """u_i = W v_i / s_i (or v_i = W^T u_i / s_i). Columns of zero singular values are left as computed."""
    safe = torch.where(s > 0, s, torch.ones_like(s)).unsqueeze(1)  # (L, 1, k)
    return (W.mT @ vectors if wide else W @ vectors) / safe


def _spectrum(W: Tensor, columns: Tensor | None = None) -> Spectrum:
    """Singular triplets of a stack: all of them in ascending order, or the eigh `columns` asked for."""
    W = _as_stack(W)
    s, vectors, fro2, wide = _gram_eigh(W)
    if columns is not None:
        s, vectors = s[:, columns], vectors[:, :, columns]
    other = _other_side(W, vectors, s, wide)
    U, V = (vectors, other) if wide else (other, vectors)
    return Spectrum(s=s, U=U, V=V, fro2=fro2)


def svd_top(W: Tensor, k: int | None = None) -> Spectrum:
    """Exact top-k singular triplets of a stack W (L, m, n) in descending order (all of them when k is None).

    eigh of the smaller Gram matrix gives s^2 and one side's vectors; the other side follows from one
    matmul (u_i = W v_i / s_i), for the k columns asked for only. Raises NonFiniteMatrix for NaN/inf.
    """
    r = min(W.shape[-2:])
    k = r if k is None else min(k, r)
    return _spectrum(W, columns=torch.arange(r - 1, r - 1 - k, -1))


def adjacent_abs_cos(X: Tensor) -> Tensor:
    """|cos| between rows l and l+1 of X (L, d): shape (L-1,). Rows need not be normalised."""
    X = X / X.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    return (X[:-1] * X[1:]).sum(-1).abs()


def sigma2_alignment(s: Tensor, vectors: Tensor, fro2: Tensor) -> Tensor:
    """Per adjacent pair: sum_i (s_i(l)^2 / ||W(l)||_F^2) |cos(x_i(l), x_i(l+1))|, shape (L-1,).

    vectors (L, d, k) are the singular vectors of one space (V for input, U for output). With a
    truncated spectrum (k < rank) the sum covers only the top-k share of the Frobenius energy.
    """
    weights = s[:-1].pow(2) / fro2[:-1].clamp_min(1e-30).unsqueeze(-1)  # (L-1, k)
    cos = (vectors[:-1] * vectors[1:]).sum(dim=-2).abs()  # (L-1, k)
    return (weights * cos).sum(-1)


def top_singular_vectors(
    W: Tensor, v0: Tensor | None = None, tol: float = 1e-5, max_iter: int = 200
) -> tuple[Tensor, Tensor, Tensor]:
    """Leading singular pair of every matrix in a stack (L, m, n) by power iteration on W^T W.

    Warm-started from `v0` (L, n) when given: matrices that change a little between calls (the
    cumulative gradient between two epochs) converge in a few iterations. Layers whose iterate still
    turns by more than `tol` (sine of the angle between successive iterates) after `max_iter` fall back to the
    exact eigh route, so the answer never depends on the iteration budget. Returns s1 (L,), u1 (L, m),
    v1 (L, n).
    """
    W = W.detach().float()
    L, m, n = W.shape
    if v0 is None:  # a fixed start: the metric must not consume the training run's random stream
        v0 = torch.randn(L, n, generator=torch.Generator().manual_seed(0))
    v = v0.to(W.device, torch.float32, copy=True)
    v = v / v.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    moving = torch.ones(L, dtype=torch.bool, device=W.device)
    for _ in range(max_iter):
        w = (W.mT @ (W @ v.unsqueeze(-1))).squeeze(-1)  # (L, n): one multiply by the Gram matrix
        w = w / w.norm(dim=-1, keepdim=True).clamp_min(1e-30)
        turn = w - (w * v).sum(-1, keepdim=True) * v  # component of the new iterate off the old one
        moving = turn.norm(dim=-1) > tol
        v = w
        if not moving.any():
            break
    if moving.any():
        exact = svd_top(W[moving], k=1)
        v[moving] = exact.V[:, :, 0]
    u = (W @ v.unsqueeze(-1)).squeeze(-1)  # (L, m) = s1 u1
    s = u.norm(dim=-1)
    return s, u / s.clamp_min(1e-30).unsqueeze(-1), v


def weight_continuity(W: Tensor) -> dict[str, float]:
    """Every weight-space metric of DESIGN.md for one stack (L, m, n), from one eigendecomposition.

    Keys: v1_continuity, u1_continuity, sigma2_continuity (input space), sigma2_continuity_u
    (output space) and spectral_gap (mean s1/s2; v1 is ill-defined when it is close to 1). The
    spectrum stays in eigh's ascending order (sigma2 pairs index i with index i, whatever the order),
    which spares copying the full eigenvector stacks. Raises NonFiniteMatrix for NaN/inf.
    """
    spec = _spectrum(W)
    s = spec.s
    gap = s[:, -1] / s[:, -2].clamp_min(1e-30) if s.shape[1] > 1 else torch.full_like(s[:, -1], math.inf)
    return {
        "v1_continuity": adjacent_abs_cos(spec.V[:, :, -1]).mean().item(),
        "u1_continuity": adjacent_abs_cos(spec.U[:, :, -1]).mean().item(),
        "sigma2_continuity": sigma2_alignment(s, spec.V, spec.fro2).mean().item(),
        "sigma2_continuity_u": sigma2_alignment(s, spec.U, spec.fro2).mean().item(),
        "spectral_gap": gap.mean().item(),
    }


def update_ratio(W: Tensor, W0: Tensor) -> float:
    """Mean over layers of ||W(t) - W(0)||_F / ||W(0)||_F for stacks (L, m, n)."""
    num = (W - W0).flatten(1).norm(dim=1)
    den = W0.flatten(1).norm(dim=1).clamp_min(1e-30)
    ratio = (num / den).mean().item()
    return ratio if math.isfinite(ratio) else math.nan  # a diverged run: NaN, as for every other metric


def delta_gw(grad_cum: dict[str, float], weight: dict[str, float]) -> dict[str, float]:
    """Delta_GW = continuity(cumulative gradient) - continuity(weights), for v1 and u1."""
    return {
        "v1": grad_cum["v1_continuity"] - weight["v1_continuity"],
        "u1": grad_cum["u1_continuity"] - weight["u1_continuity"],
    }
