"""What ONE run does: models, gates, tasks, methods; ``run(cfg, ctx) -> RunResult``.

Never imports ray, mlflow or sqlalchemy (a test checks it). Names resolve
lazily so ``import experiments.maths.hard_concrete`` stays light.
"""

import importlib

_EXPORTS = {
    "ConfigError": "experiments.core.config",
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
