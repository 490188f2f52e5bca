"""What ONE run does; ``run(cfg, ctx) -> RunResult``. Never imports ray, mlflow or sqlalchemy (a test checks it).

Rooms, lowest first (an import only points down; tests/test_architecture.py checks it):

- ``common/``: the one "did you mean", unit vocabulary, the stored mask format, the PNG encoder;
- ``maths/``: pure tensor maths (Hard Concrete, losses, importance, predictivity, probes, schedules);
- ``models.py``: the architecture table and loading; ``tasks/``: task kinds, sources, presets, synthetic tasks;
- ``interventions/``: what a method does TO a model (gates, heads, attention, masks, neurons, FFN slicing);
- ``core/``: the run (plain config ``sections``, ``state``, ``loop``, ``context``, ``result``, the objective);
- ``methods/``: one file per method;
- ``core/config.py``, ``config_keys.py``, ``run_keys.py``, ``runner.py``: the keyed config and the runner, above the methods.

Names below resolve lazily, so ``import experiments`` stays light.
"""

import importlib

_EXPORTS = {
    "ConfigError": "experiments.core.sections",
    "Section": "experiments.core.sections",
    "RunConfig": "experiments.core.config",
    "parse_config": "experiments.core.config",
    "RunResult": "experiments.core.result",
    "RunContext": "experiments.core.context",
    "run": "experiments.core.runner",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'experiments' has no attribute {name!r}")
