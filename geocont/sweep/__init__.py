"""Sweeps: YAML grids and optuna searches run as Ray Tune trials, each calling train(cfg)."""
