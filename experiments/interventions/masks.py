"""Unstructured weight masks: which matrices, mask training, IMP, density maps, storage.

Liu et al. 2022 (PAPERS.md, "Sparse and robust subnetworks"). A mask is an
intervention on a model: no model file is edited, the weights themselves are
never written (except by ``rewind``), and ``MaskHandle.remove()`` gives the
plain model back.

Conventions

- Names are the same for every architecture: ``layer.<l>.<role>`` with
  ``role`` in ``ROLES`` (``query``, ``key``, ``value``, ``attn_out``,
  ``ffn_in``, ``ffn_out``), then ``pooler`` and ``decoder.<path>`` where present.
- A mask is a bool tensor of its weight's shape ``(out, in)``; True = kept.
  ``masks`` is ``{name: mask}``. Sparsity = fraction of weights removed.

Pieces

- ``maskable_weights(encoder, decoder)`` -> ``{name: nn.Linear}``.
- ``attach_masks(linears, mask_source)`` registers a ``torch.nn.utils.parametrize``
  parametrisation ``weight -> weight * mask_source(name)`` on each Linear; the
  mask is recomputed at every access (every forward). ``mask_source`` is
  ``MaskScores.mask`` for mask training or ``fixed_masks.__getitem__`` for a
  fixed mask (IMP, a trained subnetwork). ``handle.remove()`` detaches it.
- Mask training (pipeline c): ``MaskScores`` holds real-valued scores ``S``
  per weight; ``m = 1[S > tau]`` with ``tau = 0.01``; straight-through: the
  backward pass treats ``m`` as the identity of ``S`` (``dL/dS = dL/dm``, the
  reference code's ``_Binarizer1``). Magnitude initialisation
  ``S = 2 tau`` on the weights ``magnitude_mask`` keeps, else 0 (``magnitude``), or ``S = |W|`` with the
  threshold the k-th ``|W|`` (``magnitude_soft``, the reference's gradual scripts). Every N steps
  ``reset_thresholds(sparsity)`` sets each matrix's threshold to its k-th
  smallest score.
- IMP (pipelines a and b): ``imp_prune`` / ``next_imp_mask`` per round,
  ``rewind`` back to the pretrained values.
- The pooler: ``read_pooler(encoder)`` makes a [CLS] classifier read ``pooler_output``, as
  the reference's ``BertForSequenceClassification`` does, so the pooler's mask matters;
  ``uses_pooler(encoder, decoder)`` says where it applies.
- Maps: ``head_density`` (L, H), ``neuron_density`` (L, I), ``role_density``
  (L, 6); ``realised_sparsity``, ``mask_iou``. Storage: ``pack_masks`` /
  ``unpack_masks`` (bit-packed compressed ``.npz``, ~1/32 of fp32 weights).

A mask-training loop, pipeline (c)::

    linears = maskable_weights(encoder, decoder)
    scores = MaskScores({n: lin.weight for n, lin in linears.items()}, sparsity=0.7)
    encoder.requires_grad_(False), decoder.requires_grad_(False)
    handle = attach_masks(linears, scores.mask)
    opt = torch.optim.AdamW(scores.parameters(), lr=...)
    ...  # forward, loss, backward, opt.step(); every 1,000 steps:
    scores.reset_thresholds(sparsity_at_step)  # e.g. schedules.cubic_sparsity
    masks = scores.binary_masks()
    handle.remove()  # before encoder.state_dict() / RunState.weights()

IMP with rewinding, pipeline (b) (the reference's trainer_imp.py: round k ends at sparsity
(k + 1) / 10; round 0 prunes the pretrained magnitudes at step 0)::

    pretrained = {k: v.clone() for k, v in encoder.state_dict().items()}
    masks = {n: torch.ones_like(lin.weight, dtype=torch.bool) for n, lin in linears.items()}
    for k in range(rounds):  # 10 % ... 90 %
        masks = imp_prune({n: lin.weight for n, lin in linears.items()}, masks, k)
        encoder.load_state_dict(pretrained)  # the encoder only: the trained classifier stays
        handle = attach_masks(linears, masks.__getitem__)
        ...  # fine-tune one phase, weights trainable (after the last round: the classifier afresh too)
        handle.remove()

Traps: while attached, ``state_dict()`` keys of a masked Linear are
``...parametrizations.weight.original`` (remove before saving weights for
another run); ``copy.deepcopy`` of an attached model copies ``MaskScores`` too
(attach after copying); build optimisers over a Linear's weight before or after
attaching, the Parameter object is the same.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parametrize

from base import outputs
from base.mask_format import pack_masks, read_masks
from base.result import RunResult
from experiments.interventions.handles import Handle
from experiments.models import architecture_of

TAU = 0.01
"""Initial score threshold of mask training (Liu et al.)."""
ROLES = ("query", "key", "value", "attn_out", "ffn_in", "ffn_out")
"""The masked matrices of every layer, in the order ``maskable_weights`` lists them."""
_LAYER_NAME = re.compile(r"^layer\.(\d+)\.(\w+)$")

Masks = Mapping[str, torch.Tensor]


# --------------------------------------------------------------------------- which matrices


def maskable_weights(
    encoder: nn.Module, decoder: nn.Module | None = None, pooler: bool = True
) -> dict[str, nn.Linear]:
    """The Linear layers Liu et al. mask, by architecture-independent name.

    Per layer ``l`` (``models.ARCHITECTURES`` paths): ``layer.<l>.query`` / ``key``
    / ``value`` (``(H*D, hidden)``), ``attn_out`` (``(hidden, H*D)``), ``ffn_in``
    (``(I, hidden)``, the one Linear inside the architecture's ``ffn_act``
    module) and ``ffn_out`` (``(hidden, I)``). Then ``pooler`` (the Linear of
    ``encoder.pooler``, BERT and RoBERTa only) when ``pooler`` is True, and every
    Linear of ``decoder`` as ``decoder.<path>`` (``decoder`` for a bare Linear).
    Note: the project's decoders read the [CLS] hidden state, not the pooler, so
    a pooler mask changes no logit (its scores get no gradient) unless
    ``read_pooler`` puts the pooler in the path, as the reference's
    ``BertForSequenceClassification`` has it.
    DeBERTa-v2's relative-position projections and embeddings are not masked.
    """
    arch = architecture_of(encoder)
    linears: dict[str, nn.Linear] = {}
    paths = {"query": arch.query, "key": arch.key, "value": arch.value,
             "attn_out": arch.attn_out, "ffn_out": arch.ffn_out}
    for index, layer in enumerate(encoder.get_submodule(arch.layers)):
        for role in ROLES:
            module = (_only_linear(layer.get_submodule(arch.ffn_act), arch.ffn_act) if role == "ffn_in"
                      else layer.get_submodule(paths[role]))
            if not isinstance(module, nn.Linear):
                raise TypeError(f"layer {index} {role}: expected nn.Linear, got {type(module).__name__}")
            linears[f"layer.{index}.{role}"] = module
    if pooler and getattr(encoder, "pooler", None) is not None:
        linears["pooler"] = _only_linear(encoder.pooler, "pooler")
    if decoder is not None:
        linears |= decoder_linears(decoder)
    return linears


def decoder_linears(decoder: nn.Module) -> dict[str, nn.Linear]:
    """Every Linear of a task decoder as ``decoder.<path>`` (``decoder`` for a bare Linear): the
    classifier that the reference masks with ``--mask_classifier true``."""
    return {f"decoder.{path}" if path else "decoder": module
            for path, module in decoder.named_modules() if isinstance(module, nn.Linear)}


def uses_pooler(encoder: nn.Module, decoder: nn.Module) -> bool:
    """Whether ``read_pooler`` applies: the encoder has a pooler (BERT, RoBERTa) and the decoder
    is a sentence classifier reading the [CLS] state (tagging decoders read every token)."""
    from experiments.tasks.parts import ClassificationDecoder

    return getattr(encoder, "pooler", None) is not None and isinstance(decoder, ClassificationDecoder)


def read_pooler(encoder: nn.Module) -> Handle:
    """Put the encoder's pooler between it and a [CLS] classifier, as BERT's own
    ``BertForSequenceClassification`` does (``classifier(dropout(pooler_output))``), which the
    reference code trains and masks (its ``P`` matrix: masking/maskers.py ``_bert_roberta_names``).

    A forward hook replaces ``last_hidden_state[:, 0]`` by ``pooler_output`` =
    ``tanh(W_p h_[CLS] + b_p)``, so a ``ClassificationDecoder`` (which reads position 0) reads
    the pooled vector; a mask attached to the pooler's Linear then changes the logits. No model
    file is edited; ``handle.remove()`` gives the plain encoder back.
    """
    if getattr(encoder, "pooler", None) is None:
        raise ValueError(f"{type(encoder).__name__} has no pooler")

    def swap_cls(module, args, output):
        hidden = output.last_hidden_state  # (B, T, Hd)
        pooled = output.pooler_output.to(hidden.dtype)  # (B, Hd); autocast may leave it in bf16
        output.last_hidden_state = torch.cat([pooled[:, None], hidden[:, 1:]], dim=1)
        return output

    return Handle([encoder.register_forward_hook(swap_cls).remove])


def _only_linear(module: nn.Module, where: str) -> nn.Linear:
    found = [m for m in module.modules() if isinstance(m, nn.Linear)]
    if len(found) != 1:
        raise ValueError(f"expected exactly one nn.Linear in {where}, found {len(found)}")
    return found[0]


# --------------------------------------------------------------------------- attaching


class _MaskedWeight(nn.Module):
    """Parametrisation ``weight -> weight * mask``; the mask is fetched at every access."""

    def __init__(self, mask_source: Callable[[], torch.Tensor]):
        super().__init__()
        self.mask_source = mask_source  # a plain attribute: the scores stay out of the model's state_dict

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight * self.mask_source()  # a bool mask promotes to weight's dtype


@dataclass
class MaskHandle(Handle):
    """What ``attach_masks`` returns: a ``Handle`` whose ``remove()`` detaches every parametrisation
    and can bake the masks into the weights."""

    linears: dict[str, nn.Linear] = field(default_factory=dict)

    def remove(self, bake: bool = False) -> None:
        """Give each Linear back its own ``weight`` Parameter (the same object, untouched);
        ``bake=True`` writes the masked values ``W * m`` into it first. Idempotent."""
        for linear in self.linears.values():
            parametrize.remove_parametrizations(linear, "weight", leave_parametrized=bake)
            # removal re-registers weight after bias; put it back first so state_dict()
            # and parameters() list the original order
            params = linear._parameters
            params.update([(key, params.pop(key)) for key in ("weight", "bias") if key in params])
        self.linears = {}


def attach_masks(linears: Mapping[str, nn.Linear], mask_source: Callable[[str], torch.Tensor]) -> MaskHandle:
    """Multiply each Linear's weight by ``mask_source(name)`` at every forward.

    ``mask_source(name)`` returns a ``(out, in)`` tensor on the weight's device:
    float (``MaskScores.mask``, differentiable) or bool (a fixed mask:
    ``masks.__getitem__``). The weight Parameter stays where it is, as
    ``linear.parametrizations.weight.original``, with its ``requires_grad``:
    freeze it for mask training, leave it trainable to fine-tune a subnetwork
    (the masked entries then get zero gradient).
    """
    for name, linear in linears.items():
        if parametrize.is_parametrized(linear, "weight"):
            raise ValueError(f"{name} already has a mask attached")
    for name, linear in linears.items():
        parametrize.register_parametrization(linear, "weight", _MaskedWeight(partial(mask_source, name)))
    return MaskHandle(linears=dict(linears))


def raw_weight(linear: nn.Linear) -> nn.Parameter:
    """The Linear's own weight Parameter, masked or not (never the masked product)."""
    if parametrize.is_parametrized(linear, "weight"):
        return linear.parametrizations.weight.original
    return linear.weight


def weight_snapshot(linears: Mapping[str, nn.Linear]) -> dict[str, torch.Tensor]:
    """CPU copies of the raw weights, ``{name: (out, in)}``: a reference for ``rewind``."""
    return {name: raw_weight(linear).detach().to("cpu", copy=True) for name, linear in linears.items()}


# --------------------------------------------------------------------------- magnitude and IMP


def magnitude_mask(weight: torch.Tensor, sparsity: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Bool mask removing the ``k = round(sparsity * numel)`` smallest ``|W|`` of one matrix.

    Exactly ``k`` entries are False (ties broken by position). With ``mask``,
    entries already removed (False) count as the smallest, so they stay removed
    and only ``k - removed`` more go; ``k`` below ``removed`` is an error.
    """
    if not 0.0 <= sparsity <= 1.0:
        raise ValueError(f"sparsity must be in [0, 1], got {sparsity}")
    k = round(sparsity * weight.numel())
    magnitude = weight.detach().abs().flatten()
    if mask is not None:
        removed = int((~mask).sum())
        if k < removed:
            raise ValueError(f"sparsity {sparsity} removes {k} weights, the mask already removes {removed}")
        magnitude = torch.where(mask.flatten().to(magnitude.device), magnitude, -1.0)  # |W| >= 0 > -1
    keep = torch.ones(weight.numel(), dtype=torch.bool, device=weight.device)
    keep[torch.argsort(magnitude, stable=True)[:k]] = False
    return keep.view(weight.shape)


def imp_round_sparsity(k: int, rounds: int = 10) -> float:
    """Sparsity after IMP round ``k`` (0-based): ``(k + 1) / rounds``.

    Round k removes ``1 / (rounds - k)`` of the weights still there, i.e. another
    ``1 / rounds`` of the original (10 % for 10 rounds). The last round that
    leaves weights is ``k = rounds - 2`` (90 %); ``k = rounds - 1`` would remove
    every weight and is refused.
    """
    if not 0 <= k < rounds - 1:
        raise ValueError(f"IMP round must be in [0, {rounds - 2}] for {rounds} rounds, got {k}")
    return (k + 1) / rounds


def next_imp_mask(weight: torch.Tensor, mask: torch.Tensor | None, k: int, rounds: int = 10) -> torch.Tensor:
    """Round ``k`` of IMP on one matrix: prune the smallest ``|W|`` (L1, per matrix) among
    the kept weights up to sparsity ``imp_round_sparsity(k, rounds)``. ``mask`` is the
    previous round's (None before round 0); the result is a subset of it."""
    return magnitude_mask(weight, imp_round_sparsity(k, rounds), mask)


def imp_prune(weights: Mapping[str, torch.Tensor], masks: Masks | None, k: int, rounds: int = 10) -> dict[str, torch.Tensor]:
    """``next_imp_mask`` for every matrix: ``{name: bool mask}`` after round ``k``.

    ``weights`` are the trained weights (``{n: raw_weight(lin)}``), ``masks`` the previous
    round's (None before round 0).
    """
    return {name: next_imp_mask(w, None if masks is None else masks[name], k, rounds)
            for name, w in weights.items()}


@torch.no_grad()
def rewind(linears: Mapping[str, nn.Linear], reference: Mapping[str, torch.Tensor], masks: Masks) -> None:
    """Lottery-ticket rewinding, in place: each raw weight becomes ``where(mask, reference, 0)``.

    Kept weights get the reference values bit for bit (``reference`` from
    ``weight_snapshot`` of the pretrained model), removed ones 0. Only the masked
    matrices: biases, LayerNorms and embeddings are the caller's to restore
    (e.g. ``encoder.load_state_dict(pretrained)`` with no mask attached).
    """
    for name, linear in linears.items():
        weight = raw_weight(linear)
        ref = reference[name].to(weight.device, weight.dtype)
        weight.copy_(torch.where(masks[name].to(weight.device), ref, torch.zeros_like(ref)))


# --------------------------------------------------------------------------- mask training


class _StraightThrough(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
        return (scores > threshold).to(scores.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def ste_mask(scores: torch.Tensor, threshold: torch.Tensor | float) -> torch.Tensor:
    """``m = 1[S > threshold]`` as a float tensor of ``scores``' shape; gradient ``dL/dS = dL/dm``.

    The straight-through estimator of the reference code: forward uses the binary
    mask, backward passes the gradient through as if ``m = S`` (identity), so
    ``dL/dS_ij = dL/dW~_ij * W_ij`` for ``W~ = W * m``.
    """
    return _StraightThrough.apply(scores, torch.as_tensor(threshold, dtype=scores.dtype))


def kth_threshold(scores: torch.Tensor, sparsity: float, current: torch.Tensor | float) -> torch.Tensor:
    """A matrix's new threshold for ``sparsity`` (a 0-dim tensor): its ``k``-th smallest score,
    ``k = round(sparsity * numel)``, so ``scores > threshold`` removes exactly ``k`` weights
    unless scores tie at the threshold (ties are removed together).

    The reference's guard (mask_trainer.py:425-427, ``reset_threshold``): when the k-th score is
    >= the largest score (every score the same, or the ties reach the top) the threshold would
    remove every weight, so ``current`` is kept. ``k = 0`` gives ``-inf`` (keep every weight;
    the reference leaves the threshold as it is then, which only differs at sparsity 0). The
    reference counts ``k = int(...)``; ``round`` differs only where ``sparsity * numel`` is not
    a whole number.
    """
    current = torch.as_tensor(current, dtype=scores.dtype, device=scores.device)
    k = round(sparsity * scores.numel())
    if k == 0:
        return torch.tensor(float("-inf"), dtype=scores.dtype, device=scores.device)
    flat = scores.detach().flatten()
    kth = torch.kthvalue(flat, k).values
    return kth if kth < flat.max() else current


def magnitude_scores(weight: torch.Tensor, sparsity: float, tau: float = TAU) -> tuple[torch.Tensor, float]:
    """Hard magnitude initialisation (the reference's ``--controlled_init magnitude``): scores ``2 tau``
    where ``magnitude_mask`` keeps, else 0, and the threshold ``tau``."""
    return magnitude_mask(weight, sparsity).to(weight.dtype) * (2.0 * tau), tau


def soft_magnitude_scores(weight: torch.Tensor, sparsity: float, tau: float = TAU) -> tuple[torch.Tensor, float]:
    """Soft magnitude initialisation (the reference's ``--controlled_init magnitude_soft``, maskers.py:182-187):
    scores ``|W|`` and the threshold the ``k``-th smallest ``|W|``, ``k = int(sparsity * numel)`` (0 when
    ``k = 0``), so the first mask keeps ``|W| > threshold`` and a rising sparsity later ranks the weights by
    their magnitude, not among tied scores. ``tau`` is unused (the signature of ``magnitude_scores``)."""
    scores = weight.detach().abs().clone()
    k = int(weight.numel() * sparsity)
    return scores, float(torch.kthvalue(scores.flatten(), k).values) if k > 0 else 0.0


INITS = {"magnitude": magnitude_scores, "magnitude_soft": soft_magnitude_scores}
"""How mask scores start (``MaskScores(init=...)``), by the reference's ``--controlled_init`` names."""


class MaskScores(nn.Module):
    """Real-valued scores ``S`` per weight of each masked matrix, and a threshold per matrix.

    ``MaskScores({name: weight}, sparsity)`` initialises ``S`` by magnitude
    (``magnitude_scores``) and every threshold to ``tau``, so the first mask is
    exactly ``magnitude_mask(weight, sparsity)``; ``init="magnitude_soft"`` starts ``S = |W|`` with
    each threshold its matrix's k-th ``|W|`` (``soft_magnitude_scores``, the reference's gradual scripts). ``mask(name)`` is the
    differentiable ``ste_mask`` used in the forward; ``binary_masks()`` the current
    bool masks. The scores are its parameters (train them with any optimiser), the
    thresholds a buffer, so its ``state_dict`` is a full checkpoint of the masks.
    Give it the raw weights (``raw_weight(lin)``, or ``lin.weight`` before attaching).
    """

    def __init__(self, weights: Mapping[str, torch.Tensor], sparsity: float, tau: float = TAU,
                 init: str = "magnitude"):
        super().__init__()
        if init not in INITS:
            raise ValueError(f"init must be one of {sorted(INITS)}, got {init!r}")
        self.names = tuple(weights)
        self._index = {name: i for i, name in enumerate(self.names)}
        started = [INITS[init](w.detach(), sparsity, tau) for w in weights.values()]
        # A list, not a dict: names hold dots, which module attribute names may not.
        self.scores = nn.ParameterList(scores for scores, _ in started)
        device = next(iter(weights.values())).device if weights else None
        self.register_buffer("thresholds", torch.tensor([t for _, t in started], dtype=torch.float32, device=device))

    def mask(self, name: str) -> torch.Tensor:
        """Float 0/1 mask of matrix ``name``, straight-through to its scores."""
        index = self._index[name]
        return ste_mask(self.scores[index], self.thresholds[index])

    @torch.no_grad()
    def binary_masks(self) -> dict[str, torch.Tensor]:
        """``{name: bool (out, in)}``, True = kept, with the current scores and thresholds."""
        return {name: s > t for name, s, t in zip(self.names, self.scores, self.thresholds, strict=True)}

    @torch.no_grad()
    def reset_thresholds(self, sparsity: float) -> None:
        """Set each matrix's threshold to its ``kth_threshold(scores, sparsity, threshold)``, so
        each matrix reaches ``sparsity`` (up to ties in the scores; a matrix whose k-th score is
        its largest keeps its threshold, as the reference's guard does)."""
        for index, scores in enumerate(self.scores):
            self.thresholds[index] = kth_threshold(scores, sparsity, self.thresholds[index])

    def extra_repr(self) -> str:
        return f"matrices={len(self.names)}"


# --------------------------------------------------------------------------- maps and statistics


def _np(mask: torch.Tensor | np.ndarray) -> np.ndarray:
    return mask.detach().cpu().numpy() if isinstance(mask, torch.Tensor) else np.asarray(mask)


def _layer_masks(masks: Masks) -> dict[int, dict[str, np.ndarray]]:
    """``{layer: {role: bool array}}`` from the ``layer.<l>.<role>`` entries; layers 0..L-1."""
    layers: dict[int, dict[str, np.ndarray]] = {}
    for name, mask in masks.items():
        match = _LAYER_NAME.match(name)
        if match:
            layers.setdefault(int(match[1]), {})[match[2]] = _np(mask).astype(bool)
    if sorted(layers) != list(range(len(layers))):
        raise ValueError(f"masks cover layers {sorted(layers)}, expected 0..{len(layers) - 1}")
    return layers


def head_density(masks: Masks, num_layers: int, num_heads: int) -> np.ndarray:
    """``(L, H)`` float: fraction of kept weights of each head.

    Head h of layer l owns rows ``h*D:(h+1)*D`` of query, key and value and the
    same columns of ``attn_out`` (``D = rows of query / H``); the density pools
    all four blocks: kept entries / ``4 * D * hidden``.
    """
    layers = _layer_masks(masks)
    if len(layers) != num_layers:
        raise ValueError(f"masks cover {len(layers)} layers, expected {num_layers}")
    density = np.zeros((num_layers, num_heads))
    for index, roles in layers.items():
        # each block (H, D * hidden): head h's rows of q/k/v, its columns of attn_out
        blocks = [roles[r].reshape(num_heads, -1) for r in ("query", "key", "value")]
        blocks.append(roles["attn_out"].T.reshape(num_heads, -1))
        density[index] = sum(b.sum(axis=1) for b in blocks) / sum(b.shape[1] for b in blocks)
    return density


def neuron_density(masks: Masks) -> np.ndarray:
    """``(L, I)`` float: fraction of kept weights of each FFN neuron, pooling its row of
    ``ffn_in`` ``(I, hidden)`` and its column of ``ffn_out`` ``(hidden, I)``."""
    layers = _layer_masks(masks)
    rows = [(r["ffn_in"].sum(axis=1) + r["ffn_out"].sum(axis=0)) / (r["ffn_in"].shape[1] + r["ffn_out"].shape[0])
            for _, r in sorted(layers.items())]
    return np.stack(rows)


def role_density(masks: Masks) -> np.ndarray:
    """``(L, 6)`` float: fraction of kept weights of each layer's matrices, columns in ``ROLES`` order."""
    layers = _layer_masks(masks)
    return np.array([[roles[role].mean() for role in ROLES] for _, roles in sorted(layers.items())])


def realised_sparsity(masks: Masks) -> tuple[dict[str, float], float]:
    """``({name: sparsity}, overall)``: fraction removed per matrix and over all masked weights."""
    removed = {name: int((~_np(m).astype(bool)).sum()) for name, m in masks.items()}
    sizes = {name: _np(m).size for name, m in masks.items()}
    per_matrix = {name: removed[name] / sizes[name] for name in masks}
    return per_matrix, sum(removed.values()) / max(1, sum(sizes.values()))


def masked_result(cfg, state, metrics: Mapping[str, float], masks: Masks, initial: Masks | None = None) -> RunResult:
    """What a masked run (mask_train, imp) reports: its metrics and realised ``sparsity``, the
    mask's unit maps ``heads.mask_density`` (L, H), ``neurons.mask_density`` (L, I) and
    ``weights.mask_density`` (L, 6: ``ROLES``), and the mask itself as ``masks.npz``; the mask it
    started from, where given (trained scores), as ``initial_masks.npz`` (what training changed is
    the difference: analysis.questions.masks)."""
    maps = dict([outputs.HEAD_DENSITY(head_density(masks, state.num_layers, state.num_heads)),
                 outputs.NEURON_DENSITY(neuron_density(masks)),
                 outputs.WEIGHT_DENSITY(role_density(masks), f"{outputs.WEIGHT_DENSITY.meaning}: {', '.join(ROLES)}")])
    return RunResult(run_key=cfg.run_key, group_key=cfg.group_key,
                     metrics=dict(metrics) | {"sparsity": realised_sparsity(masks)[1]}, maps=maps,
                     eval_steps=np.asarray(state.values["eval_steps"]), steps=state.step,
                     artifacts={"masks.npz": pack_masks(masks)}
                     | ({} if initial is None else {"initial_masks.npz": pack_masks(initial)}))


# --------------------------------------------------------------------------- storage
# The format (pack_masks, read_masks) and mask_iou live in base/mask_format.py, numpy only,
# so analysis reads masks without torch; unpack_masks gives tensors.


def unpack_masks(data: bytes) -> dict[str, torch.Tensor]:
    """Inverse of ``pack_masks``: ``{name: bool tensor}`` in the packed order, on the CPU."""
    return {name: torch.from_numpy(mask) for name, mask in read_masks(data).items()}
