"""The harness around the methods: the run config (``config``: sections joined with the methods'
own, parsed, validated), its key space (``config_keys``: dotted keys, short names, grids' axes),
its run and group keys (``run_keys``) and ``runner.run(cfg, ctx) -> RunResult`` with the figures it
draws (``plots``). Each reads the registry of methods (experiments.methods.METHODS), so it stands
above them; nothing in experiments/ imports it."""
