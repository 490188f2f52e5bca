"""A whole method in one file, as a plug-in author would write it (DESIGN.md decision 8).

Nothing else in headsweep knows it: it is named in ``HEADSWEEP_METHODS`` (with this
folder on ``PYTHONPATH``), or a test puts it in ``METHODS``, and the config validation,
grids, ``--set``, ``headsweep methods``, ``experiments.run``, sweeps and analysis take it
from there. It trains nothing: it reports one map over the heads, ``heads.tiny``,
filled with ``strength`` plus seeded noise, and one metric.
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from base.result import RunResult, UnitMap
from base.sections import Section
from experiments.training.seeding import derive_seed

NAME = "tiny"  # its name in METHODS (else the module's: tiny_method)
VERSION = "1"
PIPELINES = ("once", "twice")
SHORT_NAMES = ("strength",)


class Config(Section):
    """tiny's own keys: ``tiny: {strength: 0.5}``."""

    pipeline: str = Field("once", description="once: one pass; twice: the map doubled.")
    strength: float = Field(0.5, ge=0, le=1, description="Value every head's map starts from.")
    layers: int = Field(2, gt=0, description="Rows of the map.")


def run(cfg, ctx) -> RunResult:
    own = cfg.section  # this method's Config
    rng = np.random.default_rng(derive_seed(cfg.seed, "tiny"))
    values = own.strength + 0.01 * rng.random((own.layers, 4))  # (L, H)
    if own.pipeline == "twice":
        values = 2 * values
    ctx.tracker.log_metrics({"accuracy": float(values.mean())}, 1)
    ctx.progress(1, 1, {"loss": 0.0, "open_heads": values.size})
    return RunResult(
        run_key=cfg.run_key,
        group_key=cfg.group_key,
        metrics={"accuracy": float(values.mean())},
        maps={"heads.tiny": UnitMap(values, "heads", "strength plus seeded noise")},
        eval_steps=np.asarray([1]),
        steps=1,
    )
