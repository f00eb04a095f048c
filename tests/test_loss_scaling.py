"""16-mixed (fp16 with a GradScaler): the gradients the monitor sums and the clipping sees are true-size.

Lightning refuses `precision="16-mixed"` on a CPU, but its MixedPrecision plugin with a CPU GradScaler
runs the same code path a CUDA run takes (fused Adam unscales inside its own step there too), so these
tests drive that plugin on the CPU. The backward pass runs on loss * scale: before the fix the
cumulative gradient summed scaled gradients (a different weight per step as the scale moved) and the
steps the scaler skipped (inf gradients) poisoned it with inf for the rest of the run.
"""

from __future__ import annotations

import math

import pytest
import pytorch_lightning as pl
import torch
from pytorch_lightning.plugins.precision import MixedPrecision

from geocont.config import RunConfig
from geocont.data import build_datamodule
from geocont.lit.callbacks import GeometryMonitor
from geocont.lit.module import Classifier
from geocont.models import build_model

STEPS = 20


class UnfusedClassifier(Classifier):
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.optim_cfg.lr, foreach=False)


def fit(tmp_path, init_scale: float, grad_clip: float | None = None, module_class=Classifier) -> GeometryMonitor:
    cfg = RunConfig.model_validate(
        {"model": {"depth": 3, "width": 16}, "data": {"name": "digits"}, "train": {"batch_size": 32, "seed": 0}}
    )
    torch.manual_seed(0)
    datamodule = build_datamodule(cfg, tmp_path)
    module = module_class(build_model(cfg, datamodule), cfg.optim, grad_clip=grad_clip)
    monitor = GeometryMonitor()
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=1_000_000)
    trainer = pl.Trainer(
        accelerator="cpu", plugins=[MixedPrecision("16-mixed", "cpu", scaler)], max_steps=STEPS, logger=False,
        callbacks=[monitor], enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        num_sanity_val_steps=0, limit_val_batches=0,
    )  # fmt: skip
    trainer.fit(module, datamodule=datamodule)
    monitor.test_scaler = scaler
    return monitor


def cumulative(monitor: GeometryMonitor) -> torch.Tensor:
    return monitor.grad_sum[""]


def test_the_cumulative_gradient_does_not_depend_on_the_loss_scale(tmp_path):
    small, large = cumulative(fit(tmp_path, 2.0**4)), cumulative(fit(tmp_path, 2.0**12))
    assert torch.isfinite(small).all() and small.abs().sum() > 0
    # the same fp16 forward passes; unscaled, the two sums differ by rounding only (not by 2**8)
    torch.testing.assert_close(large, small, rtol=2e-2, atol=1e-4)


def test_steps_the_scaler_skips_add_nothing(tmp_path):
    # 2**22 overflows fp16's gradients: the scaler skips steps, halving the scale each time, until they fit
    monitor = fit(tmp_path, 2.0**22)
    assert monitor.test_scaler.get_scale() < 2.0**20  # at least two steps were skipped
    assert torch.isfinite(cumulative(monitor)).all()
    assert all(math.isfinite(v) for v in monitor.grad_init.values())
    values = monitor.geometry()
    assert math.isfinite(values["grad_cum/v1_continuity"]) and math.isfinite(values["delta_gw/v1"])


@pytest.mark.parametrize("grad_clip", [1e-3])
def test_gradient_clipping_under_loss_scaling_trains(tmp_path, grad_clip):
    # Lightning's clip_gradients refuses a fused optimizer under a GradScaler; the module clips itself,
    # after unscaling, and the monitor still sums the unclipped gradients
    clipped, free = cumulative(fit(tmp_path, 2.0**8, grad_clip)), cumulative(fit(tmp_path, 2.0**8))
    assert torch.isfinite(clipped).all()
    assert clipped.shape == free.shape


def test_an_unfused_optimizer_is_unscaled_once_by_lightning(tmp_path):
    # Lightning unscales an optimizer that cannot unscale inside its step; a second unscale_ would raise
    small = cumulative(fit(tmp_path, 2.0**4, module_class=UnfusedClassifier))
    large = cumulative(fit(tmp_path, 2.0**12, module_class=UnfusedClassifier))
    assert torch.isfinite(small).all()
    torch.testing.assert_close(large, small, rtol=2e-2, atol=1e-4)
    assert torch.isfinite(cumulative(fit(tmp_path, 2.0**12, grad_clip=1e-3, module_class=UnfusedClassifier))).all()
