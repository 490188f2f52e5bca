"""The base every package shares, the bottom of the levels: experiments, orchestrator, analysis and
headsweep import it, it imports none of them. The one "did you mean" (``naming``), the vocabulary of
model units (``units``), a weight mask as stored (``mask_format``), the one figure encoder (``png``),
the plain shapes of a run's config and result (``sections``: ``Section``, ``ConfigError``, the shared
sections; ``result``: ``RunResult``, ``UnitMap``), what runs report, declared once (``outputs``),
what a run costs (``costs``), a collapsed run (``collapse``) and the hash of source files
(``sources``). Pure Python, numpy, pydantic and matplotlib: no torch."""
