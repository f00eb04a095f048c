"""sklearn's bundled handwritten digits (1797 8x8 images): the embedded default, no download."""

from __future__ import annotations

import torch

from geocont.config import DataConfig
from geocont.data.classification import InMemoryClassification, seeded_split, standardise


class DigitsDataModule(InMemoryClassification):
    def __init__(self, data: DataConfig, batch_size: int, seed: int):
        super().__init__(batch_size, seed)
        self.val_fraction = data.val_fraction

    def setup(self, stage: str | None = None) -> None:
        if self.x_train is not None:
            return
        from sklearn.datasets import load_digits

        digits = load_digits()
        x = torch.tensor(digits.data, dtype=torch.float32)  # (1797, 64)
        y = torch.tensor(digits.target, dtype=torch.long)
        train, val = seeded_split(len(x), self.val_fraction, self.seed)
        self.x_train, self.x_val = standardise(x[train], x[val])
        self.y_train, self.y_val = y[train], y[val]
