"""Write stores of synthetic sweeps through geocont.store's own writer functions.

For tests of the readers (report, paper table, dashboards) and for benchmarks/bench_report.py,
where hundreds of real training runs would take too long. The curves follow the paper's
qualitative shapes (continuity forms with residuals and stays with elementwise activations; tiny
init forms then collapses) with seeded noise; they are test data, not results.
"""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path
from typing import Any

from geocont import store
from geocont.config import resolve

ROLES = ("q", "k", "v", "o", "gate", "up", "down")
SYMMETRY_BREAKING = ("relu", "gelu", "silu", "tanh")


def write_run(root: Path, sweep: str, cfg_raw: dict[str, Any], status: str = "completed") -> str:
    """Validate `cfg_raw` as a RunConfig, write config.yaml, metrics.parquet and run.json; return the run_id."""
    cfg = resolve(cfg_raw)
    run_id = cfg.run_id()
    folder = store.run_dir(root, sweep, run_id)
    store.write_config(folder, cfg.to_dict())
    rng = random.Random(f"{run_id}-{cfg.train.seed}")
    rows = _mlp_rows(cfg, rng) if cfg.model.kind == "mlp" else _transformer_rows(cfg, rng)
    if status == "diverged":
        rows = rows[: len(rows) // 2] + [{**rows[0], "name": "train/loss", "value": float("nan")}]
    store.write_metrics(folder, [{"run_id": run_id, **r} for r in rows])
    info = {"run_id": run_id, "sweep": sweep, "status": status, "started": "2026-11-29T00:00:00", "finished": None}
    if status == "failed":
        info["error"] = "RuntimeError: synthetic failure"
    store.write_run_info(folder, info)
    return run_id


def write_mlp_sweep(
    root: Path,
    sweep: str = "mlp",
    grid: dict[str, list[Any]] | None = None,
    seeds: tuple[int, ...] = (0, 1),
    epochs: int = 6,
    base: dict[str, Any] | None = None,
) -> list[str]:
    """A cartesian grid of MLP runs (dotted keys, like a sweep YAML) over `seeds`."""
    grid = grid or {"model.residual": [True, False], "model.activation": ["relu", "none"]}
    base = base or {"model": {"kind": "mlp", "depth": 4, "width": 16}, "data": {"name": "digits"}}
    store.record_spec(root, sweep, f"name: {sweep}\n")
    ids = []
    for values in itertools.product(*grid.values()):
        for seed in seeds:
            raw = _with_dotted(base, {**dict(zip(grid, values)), "train.seed": seed, "train.epochs": epochs})
            ids.append(write_run(root, sweep, raw))
    return ids


def write_transformer_sweep(
    root: Path, sweep: str = "lm", activations: tuple[str, ...] = ("silu", "none"), seeds: tuple[int, ...] = (0, 1)
) -> list[str]:
    """Llama-style runs on the stdlib corpus, metrics every 50 steps (epoch stays 1)."""
    base = {
        "model": {"kind": "transformer", "depth": 2, "width": 32, "heads": 2, "kv_heads": 2, "mlp_width": 64},
        "data": {"name": "stdlib"},
        "train": {"epochs": 1, "max_steps": 300},
    }
    store.record_spec(root, sweep, f"name: {sweep}\n")
    return [
        write_run(root, sweep, _with_dotted(base, {"model.activation": act, "train.seed": seed}))
        for act in activations
        for seed in seeds
    ]


def _with_dotted(base: dict[str, Any], dotted: dict[str, Any]) -> dict[str, Any]:
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for path, value in dotted.items():
        section, key = path.split(".")
        out.setdefault(section, {})[key] = value
    return out


def _approach(start: float, target: float, t: float, tau: float) -> float:
    return target + (start - target) * math.exp(-t / tau)


def _mlp_rows(cfg, rng: random.Random) -> list[dict[str, Any]]:
    m = cfg.model
    breaks = m.activation in SYMMETRY_BREAKING
    target = 0.96 if (m.residual and breaks) else 0.63 if m.norm == "layernorm" else 0.22 if m.residual else 0.38
    tiny_init = m.init_std is not None and m.init_std < 1e-2
    grad = (0.85 if breaks else 0.93) if m.residual else 0.067
    acc = 0.977 if breaks else 0.91
    rows = []
    for epoch in range(1, cfg.train.epochs + 1):
        if tiny_init and m.residual and not breaks:
            w = 0.18 + 0.81 * math.exp(-(epoch - 1) / 4)  # formation at epoch 1, then rotational drift
        else:
            w = _approach(0.04, target, epoch, 3.0)
        noise = lambda s=0.01: rng.gauss(0.0, s)  # noqa: E731
        v1, u1 = w + noise(), w * 0.98 + noise()
        gc = _approach(0.9 if m.residual else 0.06, grad, epoch, 5.0) + noise()
        values = {
            "weight/v1_continuity": v1,
            "weight/u1_continuity": u1,
            "weight/sigma2_continuity": 0.25 * w + noise(0.005),
            "weight/sigma2_continuity_u": 0.24 * w + noise(0.005),
            "weight/spectral_gap": 1.5 + w + noise(0.05),
            "grad_init/v1_continuity": (0.95 if m.residual else 0.05) + noise(0.002),
            "grad_init/u1_continuity": (0.94 if m.residual else 0.05) + noise(0.002),
            "grad_cum/v1_continuity": gc,
            "grad_cum/u1_continuity": gc - 0.01,
            "delta_gw/v1": gc - v1,
            "delta_gw/u1": gc - 0.01 - u1,
            "update_ratio": math.log1p(epoch) * (5.0 if tiny_init else 0.4) + noise(),
            "train/loss": 2.3 * math.exp(-epoch / 3) + 0.05 + noise(),
            "val/loss": 2.3 * math.exp(-epoch / 3) + 0.1 + noise(),
            "val/acc": min(1.0, _approach(0.1, acc, epoch, 2.0) + noise(0.005)),
        }
        step = epoch * 24
        rows += [{"epoch": epoch, "step": step, "name": k, "value": float(v)} for k, v in values.items()]
    return rows


def _transformer_rows(cfg, rng: random.Random) -> list[dict[str, Any]]:
    m = cfg.model
    input_side = {"q", "k", "gate", "up"}
    rows = []
    for i, step in enumerate(range(50, (cfg.train.max_steps or 300) + 1, 50), start=1):
        values = {"train/loss": 3.0 * math.exp(-i / 3) + 1.5, "val/loss": 3.0 * math.exp(-i / 3) + 1.6}
        values["val/ppl"] = math.exp(values["val/loss"])
        for role in ROLES:
            strong = m.residual and role != "v"
            target = 0.6 if strong else 0.05
            for space in ("v1", "u1"):
                aligned = (space == "v1") == (role in input_side)
                value = _approach(0.05, target if aligned else 0.15, i, 2.0) + rng.gauss(0.0, 0.01)
                grad = (0.8 if m.residual else 0.05) + rng.gauss(0.0, 0.01)
                values[f"weight/{role}/{space}_continuity"] = value
                values[f"grad_cum/{role}/{space}_continuity"] = grad
                values[f"delta_gw/{role}/{space}"] = grad - value
            values[f"update_ratio/{role}"] = 0.3 * math.log1p(i) + rng.gauss(0.0, 0.01)
        values["update_ratio"] = sum(values[f"update_ratio/{r}"] for r in ROLES) / len(ROLES)
        rows += [{"epoch": 1, "step": step, "name": k, "value": float(v)} for k, v in values.items()]
    return rows
