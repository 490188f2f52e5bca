"""The agreement engine: do unit maps agree? One result type (``result.AgreementMatrix``), one top-k
(``statistics.topk.in_top_k``), one way to match runs across an axis (``strata``).

- ``across_runs.agreement``: do runs keep the same units (seeds, any axis's values, runs)? Pearson r,
  each run's units shuffled for the nulls (``shuffles``);
- ``compare.compare_maps``: do maps (methods), or one map's values of an axis, rank the units alike?
  Spearman rho and top-k, each map's units relabelled for the nulls (``relabel``), over matched runs
  (``maps``); ``compare.spearman``: the same for two groups of runs (the service's ``/spearman``).
"""
