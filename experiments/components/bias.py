"""Bias models: what a debiasing loss reads as ``p_b(y)`` per example (PAPERS.md, Liu et al. 2022).

A bias model is a logistic regression over a task's hand-crafted bias features
(``Split.features``, see experiments.tasks.bias_feature_names): it can only learn the
shortcut those features describe. The method ``bias_only`` trains one and hands its weights
on as a stage output; a dependant run names it as its ``bias_model`` stage
(``bias_model: {method: bias_only}``, DESIGN.md decision 10) and reads the bias model's
probabilities on any split of its data with :func:`bias_probs`.

The weights handed on are a flat state dict like every stage output's (``RunState.weights()``
names decoders ``decoders.<role>.<param>``), under ``decoders.bias.``:

- ``weight`` (C, F), ``bias`` (C,): the linear map from standardised features to logits;
- ``mean`` (F,), ``scale`` (F,): the standardisation, fitted on the training split
  (``(features - mean) / scale``; a constant feature gets scale 1).
"""

from __future__ import annotations

import torch
from torch import nn

PREFIX = "decoders.bias."
"""Where a bias model's tensors sit in the weights a ``bias_only`` run hands on."""


class BiasModel(nn.Module):
    """Logits (N, C) of a logistic regression over standardised (N, F) bias features."""

    def __init__(self, mean: torch.Tensor, scale: torch.Tensor, num_labels: int):
        super().__init__()
        self.register_buffer("mean", mean.detach().clone().float())  # (F,)
        self.register_buffer("scale", scale.detach().clone().float())  # (F,)
        self.linear = nn.Linear(mean.shape[0], num_labels)

    @classmethod
    def for_features(cls, features: torch.Tensor, num_labels: int) -> BiasModel:
        """A model standardising like ``features`` (N, F), the training split's."""
        mean, scale = standardisation(features)
        return cls(mean, scale, num_labels)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.linear((features - self.mean) / self.scale)  # (N, F) -> (N, C)

    def weights(self) -> dict[str, torch.Tensor]:
        """What the run hands on: ``decoders.bias.{weight, bias, mean, scale}`` (CPU copies)."""
        names = {"linear.weight": "weight", "linear.bias": "bias", "mean": "mean", "scale": "scale"}
        return {PREFIX + names[key]: value.detach().to("cpu", copy=True) for key, value in self.state_dict().items()}

    @classmethod
    def from_weights(cls, weights: dict[str, torch.Tensor]) -> BiasModel:
        """The model a ``bias_only`` run handed on; ValueError when ``weights`` hold none."""
        missing = [name for name in ("weight", "bias", "mean", "scale") if PREFIX + name not in weights]
        if missing:
            held = sorted({key.split(".")[0] for key in weights})
            raise ValueError(f"the bias_model stage handed on no bias model (no {PREFIX}{missing[0]}; "
                             f"its weights hold {', '.join(held) or 'nothing'}): use bias_model: {{method: bias_only}}")
        weight = weights[PREFIX + "weight"]
        model = cls(weights[PREFIX + "mean"], weights[PREFIX + "scale"], weight.shape[0])
        model.linear.load_state_dict({"weight": weight, "bias": weights[PREFIX + "bias"]})
        return model.eval()


def standardisation(features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(mean, scale) per column of (N, F) features; scale 1 where a column is constant."""
    mean = features.mean(dim=0)
    scale = features.std(dim=0, unbiased=False)
    return mean, torch.where(scale > 1e-6, scale, torch.ones_like(scale))


@torch.no_grad()
def probs_of(weights: dict[str, torch.Tensor], features: torch.Tensor) -> torch.Tensor:
    """(N, C) bias-model probabilities of (N, F) features, from a bias_only run's weights."""
    model = BiasModel.from_weights(weights)
    if features.shape[1] != model.mean.shape[0]:
        raise ValueError(f"the bias model reads {model.mean.shape[0]} features, the split has {features.shape[1]}")
    return model(features.float().cpu()).softmax(dim=-1)


def bias_probs(cfg, ctx, split) -> torch.Tensor:
    """``p_b``: (N, C) probabilities, rows summing to 1, of the run's ``bias_model`` stage on
    ``split`` (a ``Split`` of the run's task data, which carries its bias features), on CPU.

    The stage's weights come from ``ctx.load_upstream("bias_model")`` (the orchestrator's
    checkpoint store); a run without that stage, a split without features or weights that
    are not a bias model's raise with the reason.
    """
    from experiments.training.state import upstream_weights

    if getattr(cfg, "bias_model", None) is None:
        raise ValueError("bias_probs: this run has no bias_model stage (set bias_model: {method: bias_only})")
    if split.features is None:
        raise ValueError(f"bias_probs: the split has no bias features (task '{cfg.task.name}' defines none for this config)")
    return probs_of(upstream_weights(cfg, ctx, "bias_model"), split.features)
