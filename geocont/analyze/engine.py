"""Stream a checkpoint one matrix at a time and measure projection-specific continuity.

Per role and adjacent layers (l, l+1), in both spaces (input: right singular vectors v, output: left u):
- cos: |cos(x1(l), x1(l+1))| of the leading singular vectors (v1 or u1 continuity);
- sigma2: sum_i (s_i(l)^2 / ||W(l)||_F^2) |cos(x_i(l), x_i(l+1))| over the top K_SIGMA = 8 triplets only. The
  truncation is reported: `energy` is the share of ||W||_F^2 those 8 triplets carry (the rest is left out);
- gap: min over the two layers of s1/s2. v1 and u1 are defined only when s1/s2 >= GAP_THRESHOLD = 1.05 in both
  layers: below it the leading direction is nearly degenerate with the second (random matrices sit at ~1.003) and
  any comparison is noise. Such pairs are flagged (defined = False) and left out of the role's v1/u1 mean.
- degenerate matrices (zero, or numerical rank < 2: s2 <= RANK_RTOL * s1) are flagged too, as docs/contracts.md fixes:
  a zero matrix's "singular vectors" are whatever basis eigh returns, the same in every layer, which would read as
  v1 continuity 1; and s1/s2 is infinite there, so the gap test alone would let them through.

Method, chosen per matrix: exact (eigh of the Gram matrix, metrics/spectral.svd_top) when the smaller side is at
most EXACT_MAX_DIM, else randomized block Krylov (metrics/lowrank.block_krylov_top), which stops once v1 and u1
are within |cos| 0.99995 of the exact ones, or as soon as the gap is known to be below the threshold (flagged).

Memory: one matrix is in flight at a time (plus the next one being read by a background thread); per role only
the previous layer's top-K_SIGMA vectors are kept. Peak memory is a few of the largest matrices, not the model.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from geocont.analyze.checkpoint import open_checkpoint, read_matrix
from geocont.analyze.roles import Plan, Slot, check_supported, plan
from geocont.metrics.lowrank import block_krylov_top
from geocont.metrics.spectral import Spectrum, adjacent_abs_cos, sigma2_alignment, svd_top

GAP_THRESHOLD = 1.05
# s2 / s1 at or below this: rank < 2 at the precision weights are stored in. Rounding a rank-one matrix to bf16
# leaves s2 ~ 2e-3 s1; trained projections sit at s2 / s1 ~ 0.1-0.99. (4-bit rounding leaves s2 ~ 0.03-0.05 s1:
# a rank-one Q4 matrix reads as a very large gap, not as degenerate.)
RANK_RTOL = 1e-2
K_SIGMA = 8
EXACT_MAX_DIM = 512  # measured: at 512 x 2048 both routes cost ~0.03 s; at 1024 x 4096 block Krylov is ~3x cheaper
METHODS = ("auto", "exact", "krylov")


@dataclass(frozen=True)
class LayerResult:
    """Top-K_SIGMA spectrum of one matrix and how it was obtained."""

    spectrum: Spectrum  # one-layer stack: s (1, k), U (1, m, k), V (1, n, k), fro2 (1,)
    gap: float  # s1 / s2
    method: str  # exact | krylov
    status: str  # exact | converged | flagged | unconverged | degenerate
    steps: int

    @property
    def defined(self) -> bool:
        """v1/u1 trustworthy: accurately computed and separated from the second direction."""
        return self.status in ("exact", "converged") and self.gap >= GAP_THRESHOLD

    @property
    def energy(self) -> float:
        return (self.spectrum.s.pow(2).sum() / self.spectrum.fro2.clamp_min(1e-30)).item()


@dataclass(frozen=True)
class RoleSummary:
    role: str
    layers: int
    pairs: int
    defined: int  # pairs with both layers' s1/s2 >= GAP_THRESHOLD
    v1: float | None  # mean |cos| over defined pairs; None when no pair is defined
    u1: float | None
    sigma2: float  # input space, mean over all pairs (top-K_SIGMA truncation)
    sigma2_u: float  # output space
    gap_median: float
    energy: float  # mean share of ||W||_F^2 in the top-K_SIGMA triplets
    methods: str  # e.g. "krylov" or "exact"
    dtype: str  # stored type(s) of the weights: BF16, or GGUF's Q4_1, "Q4_K/Q6_K" when layers differ

    def as_json(self) -> dict:
        return {
            "v1": self.v1,
            "u1": self.u1,
            "sigma2": self.sigma2,
            "pairs": self.pairs,
            "sigma2_u": self.sigma2_u,
            "defined": self.defined,
            "flagged": self.pairs - self.defined,
            "gap_median": self.gap_median,
            "energy": self.energy,
            "layers": self.layers,
            "method": self.methods,
            "dtype": self.dtype,
        }


@dataclass(frozen=True)
class Analysis:
    checkpoint: str
    architecture: str
    roles: dict[str, RoleSummary]
    pairs: list[dict]  # one row per (role, layer pair, space): the --out parquet rows
    layers: list[dict]  # one row per matrix: role, layer, shape, s1, s2, gap, method, status, steps, energy


def analyze(
    checkpoint: str | Path,
    *,
    roles: list[str] | None = None,
    role_map: list[str] | None = None,
    fp64: bool = False,
    method: str = "auto",
    threads: int | None = 1,
    progress: Callable[[str, int, int], None] | None = None,
    on_plan: Callable[[Plan], None] | None = None,
) -> Analysis:
    """Continuity of every role of `checkpoint` (folder, .safetensors file or hub id); ConfigError for bad input.

    `threads`: torch intra-op threads for the decompositions (None: leave torch's setting), restored afterwards.
    `progress(role, layer, nbytes)` is called after each matrix; `on_plan(plan)` once, after validation.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    ckpt = open_checkpoint(str(checkpoint), check_config=None if role_map else check_supported)
    work = plan(ckpt, roles=roles, role_map=role_map)
    if on_plan:
        on_plan(work)
    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        return _run(work, str(checkpoint), torch.float64 if fp64 else torch.float32, method, progress)
    finally:
        torch.set_num_threads(before)


def _run(work: Plan, checkpoint: str, dtype: torch.dtype, method: str, progress) -> Analysis:
    rank = {role: i for i, role in enumerate(work.roles)}
    queue = sorted(
        ((role, slot) for role, slots in work.roles.items() for slot in slots),
        key=lambda item: (item[1].layer, rank[item[0]]),
    )
    prev: dict[str, tuple[int, LayerResult]] = {}
    per_role: dict[str, list[LayerResult]] = {role: [] for role in work.roles}
    stored = {role: sorted({s.info.dtype for s in slots}) for role, slots in work.roles.items()}
    pairs: list[dict] = []
    layer_rows: list[dict] = []
    for role, slot, W in _stream(queue, dtype):
        result = decompose(W, method)
        del W
        layer_rows.append(_layer_row(role, slot, result))
        per_role[role].append(result)
        if role in prev:
            pairs.extend(_pair_rows(role, prev[role][0], slot.layer, prev[role][1], result))
        prev[role] = (slot.layer, result)
        if progress:
            progress(role, slot.layer, slot.nbytes)
    pairs.sort(key=lambda p: (rank[p["role"]], p["layer"], p["space"]))  # read in layer order, listed by role
    summaries = {
        role: _summarise(role, per_role[role], [p for p in pairs if p["role"] == role], "/".join(stored[role]))
        for role in work.roles
    }
    return Analysis(checkpoint, work.architecture, summaries, pairs, layer_rows)


def _stream(queue: list[tuple[str, Slot]], dtype: torch.dtype) -> Iterator[tuple[str, Slot, torch.Tensor]]:
    """Yield each matrix in turn while a background thread reads the next one (overlaps disk and compute)."""
    with ThreadPoolExecutor(max_workers=1) as reader:

        def submit(slot: Slot) -> Future:
            return reader.submit(read_matrix, slot.info, slot.name, slot.rows, dtype)

        pending = submit(queue[0][1])
        for i, (role, slot) in enumerate(queue):
            W = pending.result()
            if i + 1 < len(queue):
                pending = submit(queue[i + 1][1])
            yield role, slot, W
            del W


def decompose(W: torch.Tensor, method: str = "auto") -> LayerResult:
    """Top-K_SIGMA triplets of one matrix, exactly or by block Krylov (see the module docstring)."""
    exact = method == "exact" or (method == "auto" and min(W.shape) <= EXACT_MAX_DIM)
    if exact:
        spec = svd_top(W, k=K_SIGMA)
        status, steps = "exact", 0
    else:
        top = block_krylov_top(W, k=K_SIGMA, gap_threshold=GAP_THRESHOLD)
        spec, status, steps = top.spectrum, top.status, top.steps
    s = spec.s[0]
    gap = (s[0] / s[1]).item() if s.numel() > 1 and s[1] > 0 else math.inf
    if s.numel() < 2 or s[1] <= RANK_RTOL * s[0]:  # also s1 == 0: the zero matrix
        status = "degenerate"
    # own copies of the top-k columns: svd_top's are views into the full eigenvector matrix
    spec = Spectrum(*(t.contiguous().clone() for t in spec))
    return LayerResult(spec, gap, "exact" if exact else "krylov", status, steps)


def _pair_rows(role: str, layer: int, next_layer: int, a: LayerResult, b: LayerResult) -> list[dict]:
    s = torch.cat([a.spectrum.s, b.spectrum.s])  # (2, k)
    fro2 = torch.cat([a.spectrum.fro2, b.spectrum.fro2])
    defined = a.defined and b.defined
    rows = []
    for space, field in (("input", "V"), ("output", "U")):
        X = torch.cat([getattr(a.spectrum, field), getattr(b.spectrum, field)])  # (2, d, k)
        rows.append(
            {
                "role": role,
                "layer": layer,
                "next_layer": next_layer,
                "space": space,
                "cos": adjacent_abs_cos(X[:, :, 0]).item(),
                "gap": min(a.gap, b.gap),
                "defined": defined,
                "sigma2": sigma2_alignment(s, X, fro2).item(),
                "energy": (a.energy + b.energy) / 2,
                "method": a.method,
            }
        )
    return rows


def _layer_row(role: str, slot: Slot, r: LayerResult) -> dict:
    s = r.spectrum.s[0]
    return {
        "role": role,
        "layer": slot.layer,
        "tensor": slot.name,
        "dtype": slot.info.dtype,
        "rows": slot.shape[0],
        "cols": slot.shape[1],
        "s1": s[0].item(),
        "s2": s[1].item() if s.numel() > 1 else 0.0,
        "gap": r.gap,
        "method": r.method,
        "status": r.status,
        "steps": r.steps,
        "energy": r.energy,
    }


def _summarise(role: str, results: list[LayerResult], rows: list[dict], dtype: str) -> RoleSummary:
    def mean(values: list[float]) -> float | None:
        return sum(values) / len(values) if values else None

    def space(name: str) -> list[dict]:
        return [p for p in rows if p["space"] == name]

    return RoleSummary(
        role=role,
        layers=len(results),
        pairs=len(space("input")),
        defined=sum(p["defined"] for p in space("input")),
        v1=mean([p["cos"] for p in space("input") if p["defined"]]),
        u1=mean([p["cos"] for p in space("output") if p["defined"]]),
        sigma2=mean([p["sigma2"] for p in space("input")]),
        sigma2_u=mean([p["sigma2"] for p in space("output")]),
        gap_median=statistics.median(r.gap for r in results),
        energy=sum(r.energy for r in results) / len(results),
        methods="/".join(sorted({r.method for r in results})),
        dtype=dtype,
    )
