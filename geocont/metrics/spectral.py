"""Geometric-continuity metrics over stacks of same-role weight matrices.

A stack is a tensor W of shape (L, m, n): layer l's matrix in PyTorch orientation (out x in).
Right singular vectors v_i live in the input space (R^n), left ones u_i in the output space (R^m).

Everything here is plain torch: tensors in, floats (or dicts of floats) out. The decomposition
goes through eigh of the smaller Gram matrix (W^T W or W W^T), which is exact and about twice as
fast as a full SVD; singular vectors have arbitrary signs, so every comparison uses |cos|.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
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


@contextlib.contextmanager
def exact_float32() -> Iterator[None]:
    """fp32 matmuls at full precision inside: no TF32, whatever the training run asked for.

    TF32 keeps 10 mantissa bits (relative error ~1e-3): Gram matrices built with it would move cosines
    that the metrics compare to 1e-4, and the subspace iteration's stopping bound is 1e-4.
    """
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(saved)


# (shape, dtype) -> True when the host's LAPACK beat the GPU for that batched eigh (measured, see eigh)
EIGH_ON_HOST: dict[tuple[tuple[int, ...], torch.dtype], bool] = {}


def eigh(A: Tensor) -> tuple[Tensor, Tensor]:
    """torch.linalg.eigh of a (batched) symmetric matrix, on whichever side of the bus is faster.

    A batch of small eigenproblems can run faster in the host's LAPACK, two copies included, than in
    cuSOLVER, and which side wins depends on the shape and the card. So the first call per shape on a
    GPU times both routes once and later calls take the faster; `EIGH_ON_HOST` records the choices.
    """
    if A.device.type != "cuda":
        return torch.linalg.eigh(A)
    key = (tuple(A.shape), A.dtype)
    if key not in EIGH_ON_HOST:
        EIGH_ON_HOST[key] = _host_eigh_faster(A)
    if EIGH_ON_HOST[key]:
        evals, vectors = torch.linalg.eigh(A.cpu())
        return evals.to(A.device), vectors.to(A.device)
    return torch.linalg.eigh(A)


def _host_eigh_faster(A: Tensor) -> bool:
    def seconds(route) -> float:
        torch.cuda.synchronize(A.device)
        t0 = time.perf_counter()
        route()
        torch.cuda.synchronize(A.device)
        return time.perf_counter() - t0

    def on_device():
        return torch.linalg.eigh(A)

    def on_host():
        return [t.to(A.device) for t in torch.linalg.eigh(A.cpu())]

    on_device()  # warm-up: cuSOLVER's handle and workspace are made on first use
    on_host()
    return seconds(on_host) < seconds(on_device)


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
    evals, vectors = eigh(gram)  # ascending
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
    """|cos| between rows l and l+1 of X (..., L, d): shape (..., L-1). Rows need not be normalised.

    Leading dims are independent stacks (packed trials: (K, L, d)); pairs never cross them.
    """
    X = X / X.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    return (X[..., :-1, :] * X[..., 1:, :]).sum(-1).abs()


def sigma2_alignment(s: Tensor, vectors: Tensor, fro2: Tensor) -> Tensor:
    """Per adjacent pair: sum_i (s_i(l)^2 / ||W(l)||_F^2) |cos(x_i(l), x_i(l+1))|, shape (..., L-1).

    vectors (..., L, d, k) are the singular vectors of one space (V for input, U for output), s (..., L, k),
    fro2 (..., L); leading dims are independent stacks. With a truncated spectrum (k < rank) the sum
    covers only the top-k share of the Frobenius energy.
    """
    weights = s[..., :-1, :].pow(2) / fro2[..., :-1].clamp_min(1e-30).unsqueeze(-1)  # (..., L-1, k)
    cos = (vectors[..., :-1, :, :] * vectors[..., 1:, :, :]).sum(dim=-2).abs()  # (..., L-1, k)
    return (weights * cos).sum(-1)


class TopPair(NamedTuple):
    """Leading singular pair of every matrix in a stack, and the subspace that found it."""

    s: Tensor  # (L,)
    u: Tensor  # (L, m)
    v: Tensor  # (L, n)
    basis: Tensor  # (L, d, block) orthonormal Ritz vectors of the smaller Gram: the next call's warm start


SUBSPACE_BLOCK = 8  # top_singular_pair's default block size (packed trials build cold starts of this size)


def top_singular_pair(
    W: Tensor, start: Tensor | None = None, *, block: int = SUBSPACE_BLOCK, tol: float = 1e-4, max_iter: int = 60
) -> TopPair:
    """Leading singular pair of every matrix in a stack (L, m, n) by subspace iteration with Rayleigh-Ritz.

    Works on the smaller Gram matrix G = B^T B (its top eigenvector is v1, or u1 when m < n), never formed:
    each step is one product B^T (B X) with a block of `block` vectors, so the top vector converges at the rate
    lambda_(block+1) / lambda_1 rather than plain power iteration's lambda_2 / lambda_1: cumulative
    gradients with s1/s2 ~ 1.05 took plain power iteration over a hundred steps. `start` (the previous
    call's `basis`, or a (L, d) guess of the vector) makes a slowly changing stack converge in a step or two.

    A layer is done when Davis-Kahan bounds the sine of the angle to the exact vector by `tol`:
    ||G x1 - t1 x1|| / (t1 - t2 - ||G x2 - t2 x2||) <= tol (Ritz values t; the second Ritz pair's residual keeps the
    gap estimate honest). Layers still above it after `max_iter` steps (a gap too close to 1 for fp32) take the
    exact eigh route, so the answer never depends on the iteration budget.
    """
    W = W.detach().float()
    L, m, n = W.shape
    wide = m < n
    B = W.mT if wide else W  # two thin products per step cost less than forming G for the few steps needed
    d = B.shape[-1]
    b = min(block, d)
    X = _start_block(start, L, d, b, W.device)
    bound = torch.full((L,), math.inf, device=W.device, dtype=torch.float32)
    for _ in range(max_iter):
        Z = B.mT @ (B @ X)
        theta, R = eigh(X.mT @ Z)  # Rayleigh-Ritz on span(X), ascending
        X, Z = X @ R, Z @ R
        res = (Z - X * theta.unsqueeze(1)).norm(dim=1)  # (L, b) residuals of the Ritz pairs
        delta = theta[:, -1] - theta[:, -2] - res[:, -2] if b > 1 else theta[:, -1]
        bound = torch.where(delta > 0, res[:, -1] / delta.clamp_min(1e-30), math.inf)
        if bool((bound <= tol).all()):
            break
        X = torch.linalg.qr(Z).Q  # one step of subspace iteration
    top = X[:, :, -1].clone()
    stuck = bound > tol
    if bool(stuck.any()):
        exact = svd_top(W[stuck], k=1)
        top[stuck] = (exact.U if wide else exact.V)[:, :, 0]
    other = (W.mT @ top.unsqueeze(-1) if wide else W @ top.unsqueeze(-1)).squeeze(-1)  # s1 times the other side
    s = other.norm(dim=-1)
    other = other / s.clamp_min(1e-30).unsqueeze(-1)
    u, v = (top, other) if wide else (other, top)
    return TopPair(s=s, u=u, v=v, basis=X)


def _start_block(start: Tensor | None, L: int, d: int, b: int, device: torch.device) -> Tensor:
    """An orthonormal (L, d, b) starting block: the warm start, completed by fixed random directions.

    Fixed: the metric must not consume the training run's random stream.
    """
    # explicit dtype: under bf16-true training the default dtype is bfloat16, which QR does not take
    X = torch.randn(L, d, b, generator=torch.Generator().manual_seed(0), dtype=torch.float32).to(device)
    if start is not None:
        start = start.to(device, torch.float32)
        if start.dim() == 2:  # a guess of the top vector: put it in the last (top) column
            X[:, :, -1] = start
        elif start.shape == X.shape:
            X = start.clone()
    return torch.linalg.qr(X).Q


def weight_continuity(W: Tensor) -> dict[str, float]:
    """Every weight-space metric of docs/contracts.md for one stack (L, m, n), from one eigendecomposition.

    Keys: v1_continuity, u1_continuity, sigma2_continuity (input space), sigma2_continuity_u
    (output space) and spectral_gap (mean s1/s2; v1 is ill-defined when it is close to 1). The
    spectrum stays in eigh's ascending order (sigma2 pairs index i with index i, whatever the order),
    which spares copying the full eigenvector stacks. Raises NonFiniteMatrix for NaN/inf.
    """
    return {key: value.item() for key, value in continuity_values(_spectrum(W)).items()}


def continuity_values(spec: Spectrum) -> dict[str, Tensor]:
    """weight_continuity's metrics from a full ascending spectrum with any leading dims (..., L, ...).

    Each value is the mean over the layer dim, shape (...): () for one stack, (K,) for K packed trials
    whose spectra came from one eigh over their K * L matrices.
    """
    s = spec.s  # (..., L, r) ascending
    top_v, top_u = spec.V[..., -1], spec.U[..., -1]  # (..., L, n), (..., L, m)
    gap = s[..., -1] / s[..., -2].clamp_min(1e-30) if s.shape[-1] > 1 else torch.full_like(s[..., -1], math.inf)
    return {
        "v1_continuity": adjacent_abs_cos(top_v).mean(-1),
        "u1_continuity": adjacent_abs_cos(top_u).mean(-1),
        "sigma2_continuity": sigma2_alignment(s, spec.V, spec.fro2).mean(-1),
        "sigma2_continuity_u": sigma2_alignment(s, spec.U, spec.fro2).mean(-1),
        "spectral_gap": gap.mean(-1),
    }


def update_ratio(W: Tensor, W0: Tensor) -> float:
    """Mean over layers of ||W(t) - W(0)||_F / ||W(0)||_F for stacks (L, m, n)."""
    ratio = update_ratio_values(W, W0).item()
    return ratio if math.isfinite(ratio) else math.nan  # a diverged run: NaN, as for every other metric


def update_ratio_values(W: Tensor, W0: Tensor) -> Tensor:
    """update_ratio for stacks with leading dims (..., L, m, n): shape (...), non-finite values kept."""
    num = (W - W0).flatten(-2).norm(dim=-1)  # (..., L)
    den = W0.flatten(-2).norm(dim=-1).clamp_min(1e-30)
    return (num / den).mean(-1)
