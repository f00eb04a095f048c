"""Batch-level in-memory loading: the dataset lives in tensors, a batch is one index_select.

A torch DataLoader collates sample by sample; for data sets that fit in memory that per-sample
work dominates small models' step time. `TensorBatches` shuffles an index tensor once per epoch
(seeded, so a run is reproducible) and slices whole batches.
"""

from __future__ import annotations

import torch
from torch import Tensor


class TensorBatches:
    """Iterable of (x, y) batches over in-memory tensors; reshuffled each pass when `shuffle`."""

    def __init__(self, x: Tensor, y: Tensor, batch_size: int, shuffle: bool, seed: int = 0, drop_last: bool = False):
        if len(x) != len(y):
            raise ValueError(f"x and y differ in length: {len(x)} vs {len(y)}")
        self.x, self.y = x, y
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        n = len(self.x)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self):
        n = len(self.x)
        order = torch.randperm(n, generator=self.generator) if self.shuffle else torch.arange(n)
        for b in range(len(self)):
            idx = order[b * self.batch_size : (b + 1) * self.batch_size]
            yield self.x.index_select(0, idx), self.y.index_select(0, idx)
