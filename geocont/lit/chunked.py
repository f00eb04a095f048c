"""ChunkedSteps: a LightningModule mixin whose training_step takes a batch or a chunk of them.

Lightning's loop costs a fixed time per call of training_step (data.batches.Chunks). A module built on
this mixin defines `_step(batch, batch_idx)`, one optimizer step on one batch, and is handed either a
plain batch or a Chunk of consecutive ones; for a chunk it runs `_step` once per batch, as if Lightning
had handed them over one by one. The solo modules (lit/module.py) and the pack (lit/packed.py) share it.
"""

from __future__ import annotations

import torch
from torch import Tensor

from geocont.data.batches import Chunk


class ChunkedSteps:
    def _step(self, batch, batch_idx: int):
        """One optimizer step on one batch; `batch_idx` counts the epoch's batches."""
        raise NotImplementedError

    def training_step(self, batch, batch_idx: int):
        if not isinstance(batch, Chunk):
            return self._step(batch, batch_idx)
        # Lightning counts the chunk as one batch; `_batches_that_stepped` (the step its own logging, val/loss,
        # uses) is brought to where it would be after each earlier batch.
        if batch_idx == 0:
            self._epoch_batch = 0  # batches of this epoch so far: the step's batch_idx without chunks
        loop, out = self.trainer.fit_loop.epoch_loop, None
        for i, one in enumerate(batch):
            if i:
                loop._batches_that_stepped += 1
            out = self._step(one, self._epoch_batch)
            self._epoch_batch += 1
            if self.trainer.should_stop or 0 <= self.trainer.max_steps <= self.trainer.global_step:
                break  # where Lightning's loop would have stopped after this batch
        return out

    def transfer_batch_to_device(self, batch, device: torch.device, dataloader_idx: int) -> tuple[Tensor, ...]:
        # Batches are always tuples of tensors, or a Chunk of them: skip Lightning's generic walk over arbitrary
        # collections. Batches the data module already gathered on the device pass through untouched.
        if isinstance(batch, Chunk):
            return Chunk(tuple(t.to(device, non_blocking=True) for t in one) for one in batch)
        return tuple(t.to(device, non_blocking=True) for t in batch)
