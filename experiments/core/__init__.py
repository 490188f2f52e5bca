"""The run: its config (plain ``sections`` below the methods; the keyed ``config``, ``config_keys``
and ``run_keys`` above them), ``state``, the step ``loop``, the ``context`` a caller lends, the
training objective (``debias``, ``bias``), the ``result`` and the ``runner``."""
