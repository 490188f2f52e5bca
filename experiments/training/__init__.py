"""What every method uses: the run's ``state``, the step ``loop``, the ``context`` a caller lends,
``precision``, ``seeding`` and the ``tracking`` interface. The plain config and result shapes are
in experiments/common (``sections``, ``result``); the keyed config and the runner in
experiments/keyed; what only some methods share in experiments/components."""
