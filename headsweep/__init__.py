"""headsweep in Python: ``headsweep.sweep("last")``, ``headsweep.submit(grid)``, ``resume`` and ``cancel``.

A :class:`Sweep` answers what the ``headsweep`` commands and the HTTP service answer, through the
same functions, as pandas DataFrames, numpy arrays and matplotlib figures::

    import headsweep

    s = headsweep.sweep("last")                     # or headsweep.submit("grid.yaml", wait=True)
    s.results(group_by="lambda", metric="accuracy")  # mean, std, n, 95 % CI per group
    a = s.agreement(across="seed")                   # a.value, a.table() (the nulls), a.figure()
"""

from headsweep.api import (
    Agreement,
    Comparison,
    RunMaps,
    Sweep,
    _show_figures_in_ipython,
    cancel,
    resume,
    submit,
    sweep,
)

_show_figures_in_ipython()

__all__ = ["Agreement", "Comparison", "RunMaps", "Sweep", "cancel", "resume", "submit", "sweep"]
