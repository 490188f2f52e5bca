"""A classification run that collapsed: every dev prediction one class, or a dev loss no better
than the uniform guess's ln K. Such a run's accuracy is the majority class's, which reads like a
result; the runner flags it (``collapsed`` metric 1 and tag ``true``), nothing drops it.

``evaluate`` (``experiments.training.loop``) reports the two measurements on each evaluation set
(``top_class_share``, ``loss_vs_uniform``); :func:`collapsed` judges the dev ones.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

COLLAPSED = "collapsed"
"""The metric (0.0 / 1.0) and MLflow tag ("true" / "false") the runner writes."""
TOP_CLASS_SHARE = "top_class_share"
"""Share of the scored dev predictions that fall in the most predicted class (1 = one class only)."""
LOSS_VS_UNIFORM = "loss_vs_uniform"
"""Dev loss over ln K, the loss of the uniform guess over K classes (1 = no better than uniform)."""
LOSS_TOLERANCE = 0.02
"""A loss within 2 % of ln K counts as the uniform guess's."""


def measure(top_class_count: int, scored: int, loss: float, num_classes: int) -> dict[str, float]:
    """``top_class_share`` and ``loss_vs_uniform`` of one evaluation (NaN where undefined: nothing
    scored, or a single class)."""
    share = top_class_count / scored if scored else math.nan
    ratio = loss / math.log(num_classes) if num_classes > 1 else math.nan
    return {TOP_CLASS_SHARE: share, LOSS_VS_UNIFORM: ratio}


def collapsed(metrics: Mapping[str, float]) -> bool | None:
    """Whether the dev metrics say the run collapsed; None when the run reports neither measure
    (no classifier was evaluated: a probe, an attention analysis)."""
    share, ratio = metrics.get(TOP_CLASS_SHARE, math.nan), metrics.get(LOSS_VS_UNIFORM, math.nan)
    if math.isnan(share) and math.isnan(ratio):
        return None
    return bool(share >= 1.0 or abs(ratio - 1.0) <= LOSS_TOLERANCE)
