"""What every method uses to run: the run's ``state``, the step ``loop``, its ``optimisers`` as
settings, ``precision``, ``seeding``, the ``context`` and ``tracking`` a caller lends, and the keys each
method ``reads``. The plain config and result shapes are in base (``sections``, ``result``); the keyed
config and the runner in experiments/harness; what only some methods share in experiments/components."""
