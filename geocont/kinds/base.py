"""What a model kind declares: `ModelKind`, one record per family of networks.

A kind is everything geocont needs to train, sweep, tabulate, chart and report one family (the
residual MLP, the Llama-style transformer, ...). Code that used to branch on `model.kind` asks the
kind instead, so a new family is one module that defines its `model:` section and a ModelKind, plus
one registration (geocont.kinds). The network and its LightningModule are named "module:attribute"
and imported only when a run starts: config validation, `--help` and the report never pay for torch.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from geocont.fields import ModelSection

if TYPE_CHECKING:
    from geocont.config import RunConfig


@dataclass(frozen=True)
class Panel:
    metric: str
    kind: str = "line"  # "line": mean and stddev band over each group's runs vs x; "bar": final value per group


@dataclass(frozen=True)
class Section:
    """One dashboard section: a title and its panels, `columns` to a row."""

    title: str
    panels: tuple[Panel, ...]
    columns: int = 3


def lines(*metrics: str) -> tuple[Panel, ...]:
    return tuple(Panel(m) for m in metrics)


@dataclass(frozen=True)
class ModelKind:
    """One family of networks, as every part of geocont sees it.

    - `config`: the class of its `model:` section (a ModelSection whose `kind` is Literal[name]).
    - `data`: the `data.name` values it trains on (the first image set or text corpus it needs).
    - `network`: "module:function", function(model_section, datamodule) -> nn.Module with
      `weight_groups()` (role -> same-shape matrices in depth order).
    - `lightning`: "module:Class", the GeoModule subclass that trains it (its loss and val stats).
    - `roles`: the weight roles in table order; () for one unnamed stack (role-less metric names).
    - `x_axis`: what its curves are drawn against: "epoch" or "step".
    - `dashboard`: the wandb sections (metric names from geocont.catalog).
    - `report`: names of report figure builders (geocont.report.build.FIGURES), in reading order.
    - `paper_table`: the paper's reference table its runs are set beside, or None.
    - `parameters`: about how many parameters a run config's network has (the memory preflight).
    - `norm_labels`: model.norm value -> its short name in variant labels.
    - `packed`: the batched network that trains K members as one (`resources.pack`), or None.
    - `role_note`: what its roles read and write, for the report's per-role figure ("" for none).
    """

    name: str
    config: type[ModelSection]
    data: tuple[str, ...]
    network: str
    lightning: str
    parameters: Callable[[RunConfig], int]
    roles: tuple[str, ...] = ()
    x_axis: Literal["epoch", "step"] = "epoch"
    dashboard: tuple[Section, ...] = ()
    report: tuple[str, ...] = ()
    paper_table: str | None = None
    norm_labels: Mapping[str, str] = field(default_factory=dict)
    packed: str | None = None  # "module:Class" with from_members(solo networks), or None: no packed trials
    role_note: str = ""

    def build_network(self, model: ModelSection, datamodule: Any):
        return _named(self.network)(model, datamodule)

    def lightning_class(self) -> type:
        return _named(self.lightning)

    def packed_class(self) -> type:
        return _named(self.packed)

    def metric_names(self) -> list[str]:
        """Every metric name its dashboard draws (what the registry checks against the catalogue)."""
        return [p.metric for s in self.dashboard for p in s.panels]


def _named(target: str) -> Any:
    """'package.module:attribute' -> the attribute, imported now."""
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)
