"""Every metric geocont logs, in one table: its name, what it measures, and who shows it.

Validation (which names a search may optimise), `results` tables, the live sweep view, the
dashboards and the report all read this table instead of keeping their own lists. A kind without
weight roles (the MLP) logs the plain names; a kind with roles logs the per-role names instead
(`weight/q/v1_continuity`), plus the plain name of a metric that is averaged over roles.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    name: str  # the plain name, e.g. "weight/v1_continuity"
    meaning: str
    per_role: bool = False  # kinds with roles log `<family>/<role>/<rest>` (or `<family>/<role>` for a bare family)
    role_mean: bool = False  # ...and also the plain name, as the mean over roles
    search: bool = True  # a search may optimise it (`search.metric`)
    table: bool = False  # a column of `results` tables and of `geocont train`'s summary
    live: bool = False  # a column of the live sweep view

    def names(self, roles: tuple[str, ...] = ()) -> list[str]:
        """The names a kind with these roles logs for this metric."""
        if not roles or not self.per_role:
            return [self.name]
        family, _, rest = self.name.partition("/")
        per_role = [f"{family}/{role}/{rest}" if rest else f"{family}/{role}" for role in roles]
        return [*per_role, self.name] if self.role_mean else per_role


CATALOG = (
    Metric("val/loss", "validation loss"),
    Metric("val/acc", "validation accuracy, a fraction in [0, 1] (classifiers)", table=True, live=True),
    Metric("val/ppl", "exp(min(val/loss, 50)) (language models)", table=True, live=True),
    Metric("train/loss", "training loss, every 10th batch", live=True),
    Metric("train/spike", "a loss spike's loss / the running level, at its onset step", search=False),
    Metric("grad_init/v1_continuity", "v1 continuity of the first backward's gradients", per_role=True, table=True),
    Metric("grad_init/u1_continuity", "u1 continuity of the first backward's gradients", per_role=True),
    Metric("grad_cum/v1_continuity", "v1 continuity of the cumulative gradient", per_role=True, table=True),
    Metric("grad_cum/u1_continuity", "u1 continuity of the cumulative gradient", per_role=True),
    Metric("weight/v1_continuity", "mean |cos| of adjacent layers' leading right singular vectors", per_role=True,
           table=True, live=True),
    Metric("weight/u1_continuity", "mean |cos| of adjacent layers' leading left singular vectors", per_role=True,
           table=True, live=True),
    Metric("weight/sigma2_continuity", "sigma^2-weighted alignment, input space", per_role=True, table=True),
    Metric("weight/sigma2_continuity_u", "sigma^2-weighted alignment, output space", per_role=True),
    Metric("weight/spectral_gap", "mean over layers of s1 / s2", per_role=True),
    Metric("delta_gw/v1", "grad_cum minus weight v1 continuity", per_role=True, table=True),
    Metric("delta_gw/u1", "grad_cum minus weight u1 continuity", per_role=True),
    Metric("update_ratio", "mean over layers of |W(t) - W(0)|_F / |W(0)|_F", per_role=True, role_mean=True),
)  # fmt: skip

BY_NAME = {m.name: m for m in CATALOG}
TABLE = tuple(m.name for m in CATALOG if m.table)
LIVE = tuple(m.name for m in CATALOG if m.live)
# Logged at each loss spike's onset (geocont.metrics.spikes): a run's final value is its last spike's
# ratio, a run without spikes has none, and from that step on its grad_cum / delta_gw / update_ratio
# describe the spike rather than training.
SPIKE = "train/spike"


def logged(roles: tuple[str, ...] = ()) -> list[str]:
    """Every name a kind with these roles logs, in catalogue order."""
    return [name for metric in CATALOG for name in metric.names(roles)]


def searchable(roles: tuple[str, ...] = ()) -> list[str]:
    return [name for metric in CATALOG if metric.search for name in metric.names(roles)]


def find(name: str) -> Metric | None:
    """The catalogue entry behind a logged name, plain or per role (`weight/q/v1_continuity`)."""
    if name in BY_NAME:
        return BY_NAME[name]
    match = _PER_ROLE.fullmatch(name)
    if match is None:
        return None
    metric = BY_NAME.get(f"{match['family']}/{match['rest']}" if match["rest"] else match["family"])
    return metric if metric is not None and metric.per_role else None


_PER_ROLE = re.compile(r"(?P<family>[a-z0-9_]+)/(?P<role>[a-z0-9_]+)(?:/(?P<rest>[a-z0-9_]+))?")
