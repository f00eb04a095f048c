"""An Analysis as the terminal table (md | csv | json) and as the per-pair parquet file."""

from __future__ import annotations

import json
import math
from pathlib import Path

from geocont.analyze.engine import GAP_THRESHOLD, K_SIGMA, Analysis
from geocont.analyze.tensors import ITEMSIZE

PAIR_SCHEMA = {
    "role": "String",
    "layer": "Int64",
    "next_layer": "Int64",
    "space": "String",  # input (v1, right singular vectors) | output (u1, left)
    "cos": "Float64",  # |cos| of the leading singular vectors of the two layers
    "gap": "Float64",  # min over the two layers of s1/s2
    "defined": "Boolean",  # gap >= GAP_THRESHOLD and both decompositions accurate
    "sigma2": "Float64",  # top-K_SIGMA sigma^2-weighted alignment in this space
    "energy": "Float64",  # share of ||W||_F^2 in the top-K_SIGMA triplets (mean of the two layers)
    "method": "String",  # exact | krylov
}


def render(analysis: Analysis, fmt: str) -> str:
    """The role table: markdown with a footnote, CSV, or one JSON object keyed by role."""
    if fmt == "json":
        return json.dumps({role: _finite(s.as_json()) for role, s in analysis.roles.items()})
    import polars as pl

    from geocont.tables import markdown

    frame = pl.DataFrame([{"role": role, **s.as_json()} for role, s in analysis.roles.items()])
    if fmt == "csv":
        return frame.write_csv().rstrip("\n")
    table = frame.select(
        "role",
        "v1",
        "u1",
        pl.col("sigma2").alias("sigma2 in"),
        pl.col("sigma2_u").alias("sigma2 out"),
        pl.col("gap_median").alias("s1/s2 median"),
        pl.format("{}/{}", "defined", "pairs").alias("defined pairs"),
        pl.col("energy").alias(f"top-{K_SIGMA} energy"),
        "method",
        pl.col("dtype").alias("stored"),
    )
    layers = max(s.layers for s in analysis.roles.values())
    return "\n".join(
        [
            f"{analysis.checkpoint}: {analysis.architecture}, {layers} layers{_quantized(analysis)}",
            "",
            markdown(table),
            "",
            f"v1 / u1: mean |cos| of the leading right / left singular vectors of adjacent layers, over the pairs "
            f"where s1/s2 >= {GAP_THRESHOLD} in both layers ('-': no such pair; the others are flagged, v1 undefined). "
            f"sigma2: sigma^2-weighted alignment of the top {K_SIGMA} singular directions, which carry the "
            f"'top-{K_SIGMA} energy' share of ||W||_F^2.",
        ]
    )


def _quantized(analysis: Analysis) -> str:
    """A note for the heading when any role's weights are stored quantized (GGUF), naming the types."""
    types = sorted({t for s in analysis.roles.values() for t in s.dtype.split("/")} - set(ITEMSIZE))
    if not types:
        return ""
    return f"; weights stored quantized ({', '.join(types)}: see 'stored'), analysed dequantized to float"


def write_pairs(analysis: Analysis, path: Path) -> None:
    """Per-pair details (PAIR_SCHEMA columns), written atomically."""
    import polars as pl

    from geocont.store import atomic_write_parquet

    schema = {name: getattr(pl, dtype) for name, dtype in PAIR_SCHEMA.items()}
    atomic_write_parquet(path, pl.DataFrame(analysis.pairs, schema=schema))


def _finite(values: dict) -> dict:
    """JSON has no inf or nan: such values (s2 = 0 gives an infinite gap) become null."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in values.items()}
