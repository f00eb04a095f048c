"""In-memory classification data: tensors in RAM, batches sliced by index (see batches.py)."""

from __future__ import annotations

import pytorch_lightning as pl
import torch
from torch import Tensor

from geocont.data.batches import TensorBatches, trainer_device


def seeded_split(n: int, val_fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    """Train and val index tensors: a seeded permutation, the last `val_fraction` held out."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_val = max(1, round(n * val_fraction))
    return order[n_val:], order[:n_val]


def standardise(train: Tensor, *others: Tensor) -> tuple[Tensor, ...]:
    """Scale every feature by the train split's mean and std.

    Pixels that are constant in the train split (digits' border) keep unit scale: dividing by their
    near-zero std would blow up the rare validation image that has ink there.
    """
    mean = train.mean(0, keepdim=True)
    std = train.std(0, keepdim=True)
    std = torch.where(std > 1e-6, std, torch.ones_like(std))
    return tuple((t - mean) / std for t in (train, *others))


class InMemoryClassification(pl.LightningDataModule):
    """Subclasses fill x_train, y_train, x_val, y_val (float features, long labels) in `setup`."""

    num_classes = 10

    def __init__(self, batch_size: int, seed: int):
        super().__init__()
        self.batch_size = batch_size
        self.seed = seed
        self.x_train = self.y_train = self.x_val = self.y_val = None

    @property
    def in_features(self) -> int:
        self.setup()
        return self.x_train[0].numel()

    def train_dataloader(self) -> TensorBatches:
        device = trainer_device(self)
        return TensorBatches(self.x_train, self.y_train, self.batch_size, shuffle=True, seed=self.seed, device=device)

    def val_dataloader(self) -> TensorBatches:
        batch = max(self.batch_size, 512)
        return TensorBatches(self.x_val, self.y_val, batch, shuffle=False, device=trainer_device(self))
