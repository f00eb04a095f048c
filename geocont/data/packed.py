"""K members' batch streams as one packed stream: batch i of every member, stacked on a new dim 0.

Each member keeps its own `TensorBatches` (its own split, its own seeded shuffle), so member k draws
exactly the batches its solo run would; packing only stacks them, (K, B, ...) and (K, B).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

from geocont.data.batches import TensorBatches


class PackedBatches:
    """Iterable of (x (K, B, ...), y (K, B)) over K same-length TensorBatches, one pass each per epoch."""

    def __init__(self, members: Sequence[TensorBatches]):
        sizes = {(len(m.x), m.batch_size, m.drop_last) for m in members}
        if len(sizes) != 1:
            # stacking needs batch i to have one size in every member: same data size, batch, drop_last
            raise ValueError(f"members differ in (samples, batch_size, drop_last): {sorted(sizes)}")
        self.members = list(members)

    def __len__(self) -> int:
        return len(self.members[0])

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        for batches in zip(*self.members):
            xs, ys = zip(*batches)
            yield torch.stack(xs), torch.stack(ys)
