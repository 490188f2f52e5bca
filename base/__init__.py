"""What every layer shares and nothing here depends on: the one "did you mean" (``naming``), the
vocabulary of model units (``units``), a weight mask as stored (``mask_format``), the one
figure-to-PNG encoder (``png``), and the plain shapes of a run's config and result (``sections``:
``Section``, ``ConfigError``, the shared sections; ``result``: ``RunResult``, ``UnitMap``), which
tasks, interventions, methods and analysis all read. Pure Python, numpy, pydantic and matplotlib:
no torch."""
