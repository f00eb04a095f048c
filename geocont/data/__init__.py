"""Data modules, one per data set; build_datamodule(cfg) picks one by `data.name`."""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl

from geocont.config import RunConfig


def build_datamodule(cfg: RunConfig, cache: Path | None = None) -> pl.LightningDataModule:
    """The data module of `data.name`; `cache` is where derived data (tokenized corpora) may be kept."""
    name, batch, seed = cfg.data.name, cfg.train.batch_size, cfg.train.seed
    if name == "digits":
        from geocont.data.digits import DigitsDataModule

        return DigitsDataModule(cfg.data, batch, seed)
    if name == "mnist":
        from geocont.data.mnist import MNISTDataModule

        return MNISTDataModule(cfg.data, batch, seed)
    from geocont.data.text import TextDataModule  # stdlib | text | wikitext103

    return TextDataModule(cfg.data, batch, seed, cache)
