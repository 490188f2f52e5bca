"""Physically prune FFN neurons, folding the removed ones' baseline into the output bias.

Skill-neuron pruning (Wang et al. 2022, ``../shared/PAPERS.md``; reference
THU-KEG/Skill-Neuron ``src/prune.py``): keep the top 2 % of FFN neurons (by
predictivity) in the upper three quarters of the layers (reference: layers 3-11
of 12, ``prune.py:49``; :func:`pruned_layers`) and replace every other neuron by a
constant, its baseline activation ``a_bsl`` (reference: the training set's mean at
the prompt positions, ``train_avg`` averaged over positions, ``prune.py:44-48``). A
neuron ``i`` enters the FFN output only through column ``i`` of the output
projection, so a constant ``a_bsl[i]`` there is the same as adding
``W_out[:, i] * a_bsl[i]`` to the output bias, and the neuron's row of the input
projection and column of the output projection can then be sliced away:

    b_out' = b_out + W_out[:, removed] @ a_bsl[removed]      (fold "removed", ours)
    b_out' = b_out + W_out @ a_bsl                           (fold "all", the reference's)

The reference code (``prune.py:66-67``) folds EVERY neuron's mean, which
double-counts the kept ones (they still contribute their real activation through
``W_out[:, kept]``): ``fold="all"`` reproduces it, ``"removed"`` (the default) is
the exact replacement of the removed neurons by their means.

``mask_ffn`` is the masked equivalent (a forward hook replacing the removed
activations by their baseline, and with ``fold="all"`` adding it to the kept
ones), the reference the sliced model must equal.
Keep sets and baselines always index the ORIGINAL ``(L, I)`` neurons, also
after pruning: ``kept_neurons(model)`` says which are still there (as
``heads.kept_heads`` does for heads).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any, Literal

import numpy as np
import torch
from torch import nn

from base import outputs
from experiments.interventions.handles import Handle
from experiments.interventions.heads import _slice_linear  # the same Linear slicing as head pruning
from experiments.models import architecture_of

_KEPT_ATTR = "_headsweep_kept_neurons"

Fold = Literal["removed", "all"]
"""What ``prune_ffn`` folds into the output bias: the removed neurons' baselines (ours), or every
neuron's (the reference's ``prune.py:66-67``, kept ones included)."""


def ffn_layout(model: nn.Module) -> tuple[int, int]:
    """``(num_layers, intermediate_size)`` of the backbone as built from its config (pruning leaves it)."""
    architecture_of(model)
    return model.config.num_hidden_layers, model.config.intermediate_size


def kept_neurons(model: nn.Module) -> torch.Tensor:
    """Bool ``(L, I)``: which original FFN neurons are still in the model (all True if never pruned)."""
    kept = getattr(model, _KEPT_ATTR, None)
    if kept is not None:
        return kept.clone()
    return torch.ones(*ffn_layout(model), dtype=torch.bool)


def _keep_masks(model: nn.Module, keep: Mapping[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    """``keep`` (layer -> original neuron indices) as bool ``(I,)`` masks, validated."""
    num_layers, inner = ffn_layout(model)
    masks = {}
    for layer, index in keep.items():
        if not 0 <= int(layer) < num_layers:
            raise ValueError(f"keep: layer {layer} out of range (model has {num_layers} layers)")
        index = torch.as_tensor(index).detach().to("cpu", torch.long).reshape(-1)
        if index.numel() and (index.min() < 0 or index.max() >= inner):
            raise ValueError(f"keep[{layer}]: neuron indices must lie in [0, {inner})")
        mask = torch.zeros(inner, dtype=torch.bool)
        mask[index] = True
        masks[int(layer)] = mask
    return masks


def _baseline_of(baseline: Mapping[int, torch.Tensor], layer: int, inner: int) -> torch.Tensor:
    if layer not in baseline:
        raise ValueError(f"baseline has no entry for layer {layer} (needed to fold its removed neurons)")
    values = torch.as_tensor(baseline[layer]).detach().reshape(-1)
    if values.numel() != inner:
        raise ValueError(f"baseline[{layer}] must have the {inner} original neurons, got {values.numel()}")
    return values


@torch.no_grad()
def prune_ffn(
    encoder: nn.Module, keep: Mapping[int, torch.Tensor], baseline: Mapping[int, torch.Tensor],
    fold: Fold = "removed",
) -> None:
    """Keep only neurons ``keep[l]`` (original indices) of layer ``l``'s FFN; in place.

    For each listed layer: the removed neurons' baselines ``baseline[l]`` (``(I,)``,
    original indices, e.g. ``mean_ffn_activations``) are folded into the output
    bias, ``b_out += W_out[:, removed] @ baseline[l][removed]`` (removed ones only;
    ``fold="all"``: ``W_out @ baseline[l]`` over the layer's neurons, as the reference
    does), then their rows of ``ffn_in`` (weight and bias) and columns of ``ffn_out``
    are sliced away. Layers not listed are untouched. The outputs equal those of the
    unpruned model under ``mask_ffn(encoder, keep, baseline, fold)``. Pruning again may
    only remove more (with ``fold="all"``, on an unpruned model only: a second fold
    would add the kept ones' means again). Parameters are replaced (build optimizers afterwards);
    ``config.intermediate_size`` keeps describing the original neurons.
    """
    if fold not in ("removed", "all"):
        raise ValueError(f"fold must be 'removed' or 'all', got {fold!r}")
    arch = architecture_of(encoder)
    _, inner = ffn_layout(encoder)
    current = kept_neurons(encoder)
    masks = _keep_masks(encoder, keep)
    if fold == "all" and not current[list(masks)].all():
        raise ValueError("prune_ffn: fold 'all' needs layers not pruned before (it would fold the kept means twice)")
    layers = encoder.get_submodule(arch.layers)
    for layer, new in masks.items():
        if (new & ~current[layer]).any():
            raise ValueError(f"keep[{layer}] asks for neurons already pruned; pruning cannot restore them")
        local_keep = new[current[layer]]  # (I_current,) which of the remaining neurons stay
        if local_keep.all() and fold == "removed":
            continue
        values = _baseline_of(baseline, layer, inner)[current[layer]]  # (I_current,)
        block = layers[layer]
        ffn_in, ffn_out = block.get_submodule(arch.ffn_in), block.get_submodule(arch.ffn_out)
        removed = (~local_keep).nonzero().squeeze(-1) if fold == "removed" else torch.arange(len(local_keep))
        weight = ffn_out.weight.detach()  # (hidden, I_current)
        shift = weight[:, removed].double() @ values[removed.to(values.device)].to(weight.device).double()
        if ffn_out.bias is None:
            ffn_out.bias = nn.Parameter(torch.zeros_like(weight[:, 0]))
        ffn_out.bias.add_(shift.to(ffn_out.bias.dtype))  # (hidden,)
        kept_index = local_keep.nonzero().squeeze(-1)
        _slice_linear(ffn_in, kept_index, dim=0)
        _slice_linear(ffn_out, kept_index, dim=1)
        current[layer] = new
    setattr(encoder, _KEPT_ATTR, current)


def mask_ffn(
    encoder: nn.Module, keep: Mapping[int, torch.Tensor], baseline: Mapping[int, torch.Tensor],
    fold: Fold = "removed",
) -> Handle:
    """Replace every neuron of a listed layer not in ``keep[l]`` by its baseline; a forward hook.

    The masked equivalent of ``prune_ffn`` (same arguments), the reference its
    sliced model is tested against: a hook on ``ffn_act`` returns
    ``where(kept, activation, baseline)`` (``fold="all"``: ``where(kept, activation +
    baseline, baseline)``, what folding every mean into the bias amounts to). Works on
    an already pruned model too (indices stay original).
    """
    if fold not in ("removed", "all"):
        raise ValueError(f"fold must be 'removed' or 'all', got {fold!r}")
    arch = architecture_of(encoder)
    _, inner = ffn_layout(encoder)
    current = kept_neurons(encoder)
    layers = encoder.get_submodule(arch.layers)
    handle = Handle()
    for layer, new in _keep_masks(encoder, keep).items():
        if (new & ~current[layer]).any():
            raise ValueError(f"keep[{layer}] asks for neurons the model no longer has")
        local_keep = new[current[layer]]  # (I_current,)
        values = _baseline_of(baseline, layer, inner)[current[layer]]  # (I_current,)
        hook = partial(_replace_removed, local_keep, values, fold == "all")
        handle.undo.append(layers[layer].get_submodule(arch.ffn_act).register_forward_hook(hook).remove)
    return handle


def _replace_removed(
    local_keep: torch.Tensor, values: torch.Tensor, add_to_kept: bool, _module: nn.Module, _args: tuple,
    output: torch.Tensor,
) -> torch.Tensor:
    keep = local_keep.to(output.device)
    values = values.to(output.device, output.dtype)
    return torch.where(keep, output + values if add_to_kept else output, values)  # (B, T, I_current)


def pruned_layers(num_layers: int) -> list[int]:
    """The layers skill-neuron pruning prunes: those wholly in the upper three quarters of the
    depth, ``l >= ceil(L / 4)`` (reference ``prune.py:49``: ``range(3, 12)`` of RoBERTa-base's 12).
    For MiniLM's 6 layers: 2-5 (the lowest quarter ends half-way through layer 1, which stays)."""
    return list(range(math.ceil(num_layers / 4), num_layers))


def upper_layer_keep(
    scores, fraction: float = 0.02, layers: Iterable[int] | None = None, per_layer: bool = True
) -> dict[int, torch.Tensor]:
    """The top ``fraction`` of neurons by ``scores`` ``(L, I)`` in ``layers`` (default:
    :func:`pruned_layers`, the upper three quarters).

    ``per_layer`` (default): ``max(1, int(fraction * I))`` neurons in each chosen
    layer (reference ``int(3072 * 0.02)``), so every pruned layer costs the same;
    otherwise the top ``max(1, int(fraction * I * len(layers)))`` across the chosen
    layers together.
    Ties go to the lower index; NaN scores rank last. Returns sorted original
    indices per layer (LongTensor), ready for ``prune_ffn``.
    """
    scores = torch.as_tensor(np.asarray(scores, dtype=np.float64))
    if scores.dim() != 2:
        raise ValueError(f"scores must be (layers, neurons), got shape {tuple(scores.shape)}")
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    num_layers, inner = scores.shape
    chosen = pruned_layers(num_layers) if layers is None else sorted({int(x) for x in layers})
    if any(not 0 <= layer < num_layers for layer in chosen):
        raise ValueError(f"layers {chosen} out of range for {num_layers} layers")
    scores = torch.nan_to_num(scores, nan=-np.inf)
    if per_layer:
        count = max(1, int(fraction * inner))
        return {
            layer: torch.sort(scores[layer], descending=True, stable=True).indices[:count].sort().values
            for layer in chosen
        }
    flat = scores[chosen].reshape(-1)  # (len(chosen) * I,)
    count = max(1, int(fraction * flat.numel()))
    top = torch.sort(flat, descending=True, stable=True).indices[:count]
    rows, cols = top // inner, top % inner
    return {layer: cols[rows == row].sort().values for row, layer in enumerate(chosen)}


@torch.no_grad()
def mean_ffn_activations(
    encoder: nn.Module,
    batches: Iterable[Any],
    layers: Iterable[int] | None = None,
    forward: Callable[[Any], object] | None = None,
) -> dict[int, torch.Tensor]:
    """Mean FFN activation per neuron over every real token of ``batches``: ``{l: (I,)}``.

    A baseline for ``prune_ffn``: one constant per neuron, replacing it at every
    position. ``forward(batch)`` runs one batch (default ``encoder(**batch)``),
    e.g. through a wrapper that prepends a soft prompt; tokens are weighted by
    the ``attention_mask`` the encoder itself receives (read by a pre-hook, so a
    mask a wrapper extended counts its prompt positions), all of them without
    one. Not the reference's (the prompt positions' training means, which the
    skill_neurons run already has): ``skill_neurons.prune_baseline: tokens``, since a
    pruned neuron is gone at every token, not only the prompt's. Needs an unpruned
    model in ``layers`` (the means index original neurons); eval mode.
    """
    arch = architecture_of(encoder)
    num_layers, inner = ffn_layout(encoder)
    chosen = list(range(num_layers)) if layers is None else sorted({int(x) for x in layers})
    if not kept_neurons(encoder)[chosen].all():
        raise ValueError("mean_ffn_activations needs the unpruned model")
    forward = (lambda batch: encoder(**batch)) if forward is None else forward
    sums = {layer: torch.zeros(inner, dtype=torch.float64) for layer in chosen}
    count = torch.zeros((), dtype=torch.float64)
    seen: dict[str, torch.Tensor | None] = {"mask": None}

    def grab_mask(_module: nn.Module, args: tuple, kwargs: dict) -> None:
        seen["mask"] = kwargs.get("attention_mask", args[1] if len(args) > 1 else None)

    def accumulate(layer: int, _module: nn.Module, _args: tuple, output: torch.Tensor) -> None:
        nonlocal count
        mask = seen["mask"]
        weight = (torch.ones(output.shape[:2], dtype=torch.float64, device=output.device) if mask is None
                  else mask.to(output.device, torch.float64))  # (B, T)
        if weight.shape != output.shape[:2]:
            raise ValueError(f"attention_mask {tuple(weight.shape)} does not match the tokens {tuple(output.shape[:2])}")
        sums[layer] += (output.double() * weight[..., None]).sum(dim=(0, 1)).cpu()  # (I,)
        if layer == chosen[0]:
            count += weight.sum().cpu()

    blocks = encoder.get_submodule(arch.layers)
    hooks = [encoder.register_forward_pre_hook(grab_mask, with_kwargs=True)]
    hooks += [blocks[layer].get_submodule(arch.ffn_act).register_forward_hook(partial(accumulate, layer))
              for layer in chosen]
    was_training = encoder.training
    encoder.eval()
    try:
        for batch in batches:
            forward(batch)
    finally:
        for hook in hooks:
            hook.remove()
        encoder.train(was_training)
    if count == 0:
        raise ValueError("mean_ffn_activations: no tokens in batches")
    return {layer: (total / count).float() for layer, total in sums.items()}


def pruned_metrics(
    encoder: nn.Module,
    evaluate: Callable[[nn.Module], Mapping[str, float]],
    keep: Mapping[int, torch.Tensor],
    baseline: Mapping[int, torch.Tensor],
    fold: Fold = "removed",
) -> dict[str, float]:
    """Metrics of a pruned COPY of ``encoder`` (the encoder itself is untouched).

    Keeps ``keep`` (layer -> original neuron indices, e.g. ``upper_layer_keep(scores)``), folds the
    rest with ``baseline`` (``fold`` as ``prune_ffn``) and calls ``evaluate(pruned_encoder)`` (e.g. a
    lambda around ``loop.evaluate`` with the run's decoder). Returns its metrics as
    ``pruned_<metric>`` (no "/": that names an evaluation set) plus ``pruned_kept_fraction`` (of the
    neurons in the pruned layers), ``pruned_params`` and ``pruned_params_full`` (encoder).
    ``encoder`` is the bare backbone; a wrapper (a soft prompt) goes around the
    pruned copy inside ``evaluate``, e.g.
    ``lambda backbone: loop.evaluate(PromptedEncoder(backbone, prompt), decoder, dev, task, 32, "cpu")``.
    Hooks on ``encoder`` are deep-copied with it: remove any that read FFN widths first.
    """
    pruned = copy.deepcopy(encoder)
    prune_ffn(pruned, keep, baseline, fold)
    metrics = {outputs.PRUNED.name(metric=name): float(value) for name, value in evaluate(pruned).items()}
    _, inner = ffn_layout(encoder)
    kept = sum(len(index) for index in keep.values())
    return metrics | {
        outputs.PRUNED_KEPT_FRACTION.name: kept / (inner * len(keep)),
        "pruned_params": float(sum(p.numel() for p in pruned.parameters())),
        "pruned_params_full": float(sum(p.numel() for p in encoder.parameters())),
    }
