"""What ONE run does; ``run(cfg, ctx) -> RunResult``. Never imports ray, mlflow or sqlalchemy (a test checks it).

Rooms, lowest first (a folder imports only the folders below it; tests/test_architecture.py checks it),
all above ``base/`` (the vocabulary every package shares: the one "did you mean", unit vocabulary, the
stored mask format, the PNG encoder, the plain config shapes ``sections`` and what a run returns ``result``):

- ``maths/``: pure tensor maths (Hard Concrete, losses, importance, predictivity, probes, schedules);
- ``models.py``: the architecture table and loading; ``tasks/``: task kinds, sources, presets, synthetic
  tasks, and ``tasks/parts.py``, the parts the task modules are built from;
- ``interventions/``: what a method does TO a model (gates, heads, attention, masks, neurons, FFN slicing);
- ``training/``: what every method uses (``state``, ``loop``, ``optimisers``, ``precision``, ``seeding``,
  the ``context`` and ``tracking`` a caller lends, the keys each method ``reads``);
- ``components/``: what several methods share (the fine-tuned stage, the debiasing objective and bias
  model, probing, the soft-prompted encoder);
- ``methods/``: one file per method, a recipe over the rooms below, never another method;
- ``harness/``: the harness around the methods: the keyed config (``config``, ``config_keys``,
  ``run_keys``) and the ``runner``.

Names below resolve lazily, so ``import experiments`` stays light.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

_EXPORTS = {
    "ConfigError": "base.sections",
    "Section": "base.sections",
    "RunConfig": "experiments.harness.config",
    "parse_config": "experiments.harness.config",
    "RunResult": "base.result",
    "RunContext": "experiments.training.context",
    "run": "experiments.harness.runner",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'experiments' has no attribute {name!r}")


MOVED = {"experiments.common": "base", "experiments.core": "experiments.training"}
"""Old homes of what plug-in methods import (issue 46, docs/changelog.md): ``experiments.common.*``
is ``base.*``, ``experiments.core.*`` is ``experiments.training.*``. An import of an old path gets
the module at its new one, with a DeprecationWarning; to be removed with the next breaking release."""


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds an old path of :data:`MOVED` and loads it as the module at its new path."""

    def find_spec(self, name, path=None, target=None):
        old = next((old for old in MOVED if name == old or name.startswith(old + ".")), None)
        return None if old is None else importlib.util.spec_from_loader(name, self, is_package=name == old)

    def create_module(self, spec):
        old = next(old for old in MOVED if spec.name == old or spec.name.startswith(old + "."))
        new = MOVED[old] + spec.name[len(old):]
        warnings.warn(f"{spec.name} moved to {new} (docs/changelog.md)", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(new)
        spec.loader_state = module.__spec__  # the import system sets the old path's spec on it next
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = module.__spec__.loader_state  # it ran already, at its new path: keep its own spec


sys.meta_path.insert(0, _Moved())  # before the path finders, which would load base/*.py a second time
