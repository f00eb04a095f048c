"""Batch-level in-memory loading: the dataset lives in tensors, a batch is one index_select.

A torch DataLoader collates sample by sample; for data sets that fit in memory that per-sample
work dominates small models' step time. `TensorBatches` shuffles an index tensor once per epoch
(seeded, on the CPU, so a run draws the same batches on every device) and slices whole batches.

On a GPU the tensors move to the device once when they fit (MNIST is 188 MB as float32): every batch
is then gathered there, with no host-to-device copy per step. A data set too large for that stays on
the host and each batch is gathered into pinned memory, so its copy to the device runs asynchronously.
"""

from __future__ import annotations

import torch
from torch import Tensor

DEVICE_FRACTION = 0.25  # of the device's free memory that a data set may take to live there


class TensorBatches:
    """Iterable of (x, y) batches over in-memory tensors; reshuffled each pass when `shuffle`."""

    def __init__(
        self,
        x: Tensor,
        y: Tensor,
        batch_size: int,
        shuffle: bool,
        seed: int = 0,
        drop_last: bool = False,
        device: torch.device | None = None,
    ):
        if len(x) != len(y):
            raise ValueError(f"x and y differ in length: {len(x)} vs {len(y)}")
        (self.x, self.y), self.pin = place((x, y), device)
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
        order = order.to(self.x.device)  # one small copy an epoch when the data live on the GPU
        for b in range(len(self)):
            idx = order[b * self.batch_size : (b + 1) * self.batch_size]
            x, y = self.x.index_select(0, idx), self.y.index_select(0, idx)
            # pinned: the step's copy to the device is asynchronous (torch's pinned allocator keeps
            # the block alive until that copy has run)
            yield (x.pin_memory(), y.pin_memory()) if self.pin else (x, y)


def place(tensors: tuple[Tensor, ...], device: torch.device | None) -> tuple[tuple[Tensor, ...], bool]:
    """The tensors where batches are best gathered for `device`, and whether batches need pinning."""
    if device is None or device.type != "cuda":
        return tensors, False
    free, _ = torch.cuda.mem_get_info(device)
    if sum(t.nbytes for t in tensors) <= DEVICE_FRACTION * free:
        return tuple(t.to(device) for t in tensors), False
    return tensors, True


def trainer_device(datamodule) -> torch.device | None:
    """The device the attached trainer trains on (None outside a fit, e.g. a notebook iterating batches)."""
    trainer = getattr(datamodule, "trainer", None)
    return trainer.strategy.root_device if trainer is not None else None
