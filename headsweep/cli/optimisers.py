"""The optimiser table of ``headsweep run --dry-run`` and ``headsweep submit --dry-run``: each parameter
group the runs and the stages they start from train, as their methods declare it
(``optimisers(cfg)``, experiments/training/optimisers.py), from the configs alone (no model loaded)."""

from __future__ import annotations

from collections.abc import Iterable

from rich.table import Table

from experiments.training.optimisers import COLUMNS


def optimiser_table(configs: Iterable) -> Table:
    """One row per parameter group of each distinct (method, pipeline, groups) among ``configs`` and their
    stages; a method that declares no ``optimisers`` gets one row saying so."""
    from base.sections import STAGE_ROLES
    from experiments.methods import METHODS

    rows: dict[tuple, None] = {}  # in order: the cells' groups, then their stages'
    seen: set = set()
    pending = list(configs)
    while pending:
        cfg = pending.pop(0)
        identity = (cfg.method, cfg.train, cfg.section, repr([getattr(cfg, role) for role in STAGE_ROLES]))
        if identity in seen:
            continue
        seen.add(identity)
        pending.extend(cfg.upstreams.values())
        pipeline = cfg.labels().get("pipeline")
        who = cfg.method + (f" {pipeline}" if pipeline else "")
        declare = getattr(METHODS[cfg.method], "optimisers", None)
        if declare is None:
            rows.setdefault((who, "(declares no optimiser)", *[""] * (len(COLUMNS) - 1)), None)
        for group in declare(cfg) if declare is not None else ():
            rows.setdefault((who, *group.row()), None)
    table = Table(title="what trains, per parameter group (clip: max global norm, and whose gradients share it)")
    for column in ("method", *COLUMNS):
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    return table
