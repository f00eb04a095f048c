"""Batch-level in-memory loading: the dataset lives in tensors, a batch is one index_select.

A torch DataLoader collates sample by sample; for data sets that fit in memory that per-sample
work dominates small models' step time. `TensorBatches` shuffles an index tensor once per epoch
(seeded, on the CPU, so a run draws the same batches on every device) and slices whole batches.

On a GPU the tensors move to the device once when they fit (MNIST is 188 MB as float32): every batch
is then gathered there, with no host-to-device copy per step. A data set too large for that stays on
the host and each batch is gathered into pinned memory, so its copy to the device runs asynchronously.

`Chunks` hands Lightning consecutive training batches as one (a `Chunk`), so that one call of the
training step runs several optimizer steps (geocont.lit.module.GeoModule.training_step).
"""

from __future__ import annotations

import math

import pytorch_lightning as pl
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


# ---------------------------------------------------------------------------------------------
# Several steps per call of the training step


class Chunk(list):
    """Consecutive training batches handed to one `training_step`, which runs one optimizer step per batch.

    A list, so Lightning's input conversion (`bf16-true` casts float inputs) reaches every batch in it.
    """


class Chunks:
    """The batches of `batches` in chunks of `size` consecutive ones: the same batches in the same order.

    Lightning's loop costs a fixed time per call of the training step (the fetcher, progress counters,
    batch hooks, logger connector: about 290 Python calls, 0.2-0.3 ms on this CPU). Handing it chunks
    spreads that over `size` steps. An epoch's last chunk may be shorter.
    """

    def __init__(self, batches, size: int):
        if size < 1:
            raise ValueError(f"chunk size must be >= 1, got {size}")
        self.batches, self.size = batches, size

    def __len__(self) -> int:
        return -(-len(self.batches) // self.size)

    def __iter__(self):
        chunk = Chunk()
        for batch in self.batches:
            chunk.append(batch)
            if len(chunk) == self.size:
                yield chunk
                chunk = Chunk()
        if chunk:
            yield chunk


def chunk_size(most: int, steps_per_epoch: int, every: int | None, max_steps: int | None) -> int:
    """The largest chunk size up to `most` under which Lightning's batch-counted schedule stays exact.

    Lightning decides validation and the end of training per call of the training step, so each
    point where it acts must fall at the end of a chunk, exactly as it falls at the end of a batch
    without chunks. By epoch, that is the epoch's end (the last chunk may be shorter) and, with
    max_steps, its place in its epoch: the size divides it, so the chunk that reaches max_steps ends
    there and is not the epoch's last (which would validate). With metrics every `every` steps
    Lightning counts chunks across epochs: every chunk must be one size dividing `every`, the epoch
    and max_steps.
    """
    bound = math.gcd(every or 0, steps_per_epoch if every else 0, (max_steps or 0) % steps_per_epoch)
    if bound == 0:
        return most
    return max(d for d in range(1, min(most, bound) + 1) if bound % d == 0)


class ChunkedData(pl.LightningDataModule):
    """`inner` with its training batches in chunks (Chunks); validation batches as they are."""

    def __init__(self, inner: pl.LightningDataModule, size: int):
        super().__init__()
        self.inner, self.size = inner, size

    def _attach(self) -> pl.LightningDataModule:
        self.inner.trainer = self.trainer  # the inner module places its data for the trainer's device
        return self.inner

    def prepare_data(self) -> None:
        self._attach().prepare_data()

    def setup(self, stage: str) -> None:
        self._attach().setup(stage)

    def train_dataloader(self) -> Chunks:
        return Chunks(self._attach().train_dataloader(), self.size)

    def val_dataloader(self):
        return self._attach().val_dataloader()

    def teardown(self, stage: str) -> None:
        self._attach().teardown(stage)
