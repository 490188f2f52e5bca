"""What ONE run does; ``run(cfg, ctx) -> RunResult``. Never imports ray, mlflow or sqlalchemy (a test checks it).

Rooms, lowest first (a folder imports only the folders below it; tests/test_architecture.py checks it):

- ``common/``: the one "did you mean", unit vocabulary, the stored mask format, the PNG encoder, the
  plain config shapes (``sections``) and what a run returns (``result``);
- ``maths/``: pure tensor maths (Hard Concrete, losses, importance, predictivity, probes, schedules);
- ``models.py``: the architecture table and loading; ``tasks/``: task kinds, sources, presets, synthetic tasks;
- ``interventions/``: what a method does TO a model (gates, heads, attention, masks, neurons, FFN slicing);
- ``core/``: what every method uses (``state``, ``loop``, ``context``, ``precision``, ``seeding``, ``tracking``);
- ``components/``: what several methods share (the fine-tuned stage, the debiasing objective and bias
  model, probing, the soft-prompted encoder);
- ``methods/``: one file per method, a recipe over the rooms below, never another method;
- ``keyed/``: the keyed config (``config``, ``config_keys``, ``run_keys``) and the ``runner``, above the methods.

Names below resolve lazily, so ``import experiments`` stays light.
"""

import importlib

_EXPORTS = {
    "ConfigError": "experiments.common.sections",
    "Section": "experiments.common.sections",
    "RunConfig": "experiments.keyed.config",
    "parse_config": "experiments.keyed.config",
    "RunResult": "experiments.common.result",
    "RunContext": "experiments.core.context",
    "run": "experiments.keyed.runner",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'experiments' has no attribute {name!r}")
