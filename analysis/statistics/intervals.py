"""How sure a mean is: its 95 % confidence interval (Student's t below 10 values, a bootstrap from 10).

Pure array maths: numpy arrays in, a small frozen record out; no global RNG (pass a
``np.random.Generator``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import t as student_t

T_INTERVAL_BELOW = 10
"""Below this many values the CI of a mean is Student's t interval, from this many on a bootstrap."""


@dataclass(frozen=True)
class Aggregate:
    """Mean of per-run values with spread and a 95 % confidence interval of the mean."""

    mean: float
    std: float
    """Sample standard deviation (ddof = 1); NaN for n < 2."""
    n: int
    """Number of values used."""
    ci_lo: float
    """Lower end of the 95 % CI of the mean."""
    ci_hi: float
    """Upper end of the 95 % CI of the mean."""
    ci_method: str = "none"
    """How the CI was made: ``"t"`` (n < 10), ``"bootstrap"`` (n >= 10) or ``"none"`` (n < 2)."""


def aggregate(
    values: np.ndarray,
    rng: np.random.Generator,
    n_boot: int = 1000,
    nan_policy: str = "propagate",
) -> Aggregate:
    """Mean, std and a 95 % confidence interval of the mean of ``values``.

    With ``n < T_INTERVAL_BELOW`` (10) values the CI is Student's t interval
    ``mean +- t_{0.975, n-1} * std / sqrt(n)``: a percentile bootstrap of 3 seeds
    can never leave the range of the 3 values and badly under-covers. From 10
    values on it is the 2.5 / 97.5 percentiles of ``n_boot`` bootstrap means
    (resampled with replacement, all at once as an ``(n_boot, n)`` index array),
    which does not assume normal values. With n = 1 the CI is ``(mean, mean)``
    and ``ci_method`` is ``"none"``; with n = 0 everything is NaN.

    Args:
        values: ``(n,)``, e.g. one accuracy per seed.
        rng: source of the resamples (used only for the bootstrap).
        n_boot: number of bootstrap resamples.
        nan_policy: "propagate" (any NaN makes every field NaN; n counts all
            values) or "omit" (drop NaN first; n counts the rest).
    """
    v = np.ravel(np.asarray(values, dtype=np.float64))  # (n,)
    if nan_policy == "omit":
        v = v[~np.isnan(v)]
    elif nan_policy != "propagate":
        raise ValueError(f"nan_policy must be 'propagate' or 'omit', got {nan_policy!r}")
    n = v.size
    if n == 0:
        return Aggregate(math.nan, math.nan, 0, math.nan, math.nan)
    mean = float(v.mean())
    std = float(v.std(ddof=1)) if n > 1 else math.nan
    if n == 1 or math.isnan(mean):
        return Aggregate(mean, std, n, mean, mean)
    if n < T_INTERVAL_BELOW:
        half = float(student_t.ppf(0.975, n - 1)) * std / math.sqrt(n)
        return Aggregate(mean, std, n, mean - half, mean + half, "t")
    idx = rng.integers(0, n, size=(n_boot, n))  # (n_boot, n)
    boot_means = v[idx].mean(axis=1)  # (n_boot,)
    ci_lo, ci_hi = np.percentile(boot_means, [2.5, 97.5]).tolist()
    return Aggregate(mean, std, n, ci_lo, ci_hi, "bootstrap")
