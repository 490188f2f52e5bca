"""Read and change each head's attention distribution, and read each head's output.

Three tools, for the analyses that look inside attention (Kovaleva et al. 2019;
Voita et al. 2019; He & Choi 2021):

- ``record_attention(encoder)``: a context manager yielding a list; after each
  forward pass inside it, the list holds one ``(B, H, T, T)`` tensor per layer,
  the post-softmax attention (rows = queries, columns = keys; padding as the
  model computed it: 0 on padding keys for real queries; DeBERTa-v2 also masks padding
  queries, whose rows come out uniform over all keys), detached. It appends per forward pass.
- ``disable_heads(encoder, disabled)``: ``disabled`` is bool ``(L, H)``; each
  disabled head's attention distribution is replaced by the uniform one over
  the non-padding keys (``1 / L_eff``), so its output is the mean of its value
  vectors over the real tokens (Kovaleva et al.'s head ablation). A layer is
  disabled by disabling all its heads. Returns a handle with ``remove()``
  (also a context manager).
- ``head_contexts(encoder)``: a context manager yielding a list; after each
  forward pass, one ``(B, T, H, D)`` tensor per layer: every head's attention
  output before the output projection (the input of ``attn_out``, where
  ``experiments.interventions.heads`` gates; gated if gates were attached first), detached.

How, per family (``models.ARCHITECTURES``):

- bert, roberta, electra: their self-attention calls the function that
  ``config._attn_implementation`` names in transformers' ``AttentionInterface``.
  While a recorder or a disable handle is active, the backbone uses our
  registered ``"headsweep"`` implementation (eager attention, then the
  disabling, then the recording; its mask comes from transformers' ``eager_mask``,
  an additive float mask). The original implementation (sdpa or eager) is put
  back when the last user leaves. Outputs equal the original's to float
  rounding (eager vs sdpa, ~1e-7).
- deberta-v2: its ``DisentangledSelfAttention`` computes softmax itself and has
  no interface, so a forward pre-hook on the attention module keeps the
  attention mask and a forward pre-hook on its attention-probability dropout
  (``attention.self.dropout``, applied right after the softmax) replaces and
  records the probabilities. Hooks are removed when the last user leaves.

Any other ``model_type`` raises ``ValueError`` naming it. Physically pruned
models (``heads.prune_heads``) are refused: their heads no longer index the
original ``(L, H)``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from experiments.interventions.handles import Handle
from experiments.interventions.heads import kept_heads
from experiments.models import architecture_of, head_layout

_IMPLEMENTATION = "headsweep"
"""Our name in transformers' AttentionInterface / AttentionMaskInterface."""
_PATCH_ATTR = "_headsweep_attention_patch"
"""Backbone attribute holding its active ``_Patch``."""
_SITE_ATTR = "_headsweep_attention_site"
"""Attention-module attribute: which patch and layer it belongs to (bert family)."""
_INTERFACE_FAMILIES = ("bert", "roberta", "electra")
_HOOK_FAMILIES = ("deberta-v2",)


# ------------------------------------------------------------------------------ public API


@contextmanager
def record_attention(encoder: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Yield a list that gets one ``(B, H, T, T)`` post-softmax attention per layer per forward pass."""
    probs: list[torch.Tensor] = []
    patch = _acquire(encoder)
    patch.recorders.append(probs)
    try:
        yield probs
    finally:
        patch.recorders.remove(probs)  # by identity: lists compare by value
        _release(encoder)


def disable_heads(encoder: nn.Module, disabled: torch.Tensor) -> Handle:
    """Give every head where ``disabled`` (bool ``(L, H)``) is True the uniform attention over real tokens.

    The head's output becomes the mean of its value vectors over the non-padding
    tokens, for every query (Kovaleva et al. 2019). Handles stack: a head is
    disabled while any active handle disables it. ``remove()`` (or leaving its ``with``)
    re-enables the heads.
    """
    num_layers, num_heads, _ = head_layout(encoder)
    if tuple(disabled.shape) != (num_layers, num_heads):
        raise ValueError(f"disabled must be (layers, heads) = ({num_layers}, {num_heads}), got {tuple(disabled.shape)}")
    mask = disabled.detach().to(torch.bool).clone()
    patch = _acquire(encoder)
    patch.masks.append(mask)
    return Handle([partial(_enable, encoder, mask)])


@contextmanager
def head_contexts(encoder: nn.Module) -> Iterator[list[torch.Tensor]]:
    """Yield a list that gets one ``(B, T, H, D)`` per layer per forward pass: each head's output
    before the attention output projection (the input of ``attn_out``, viewed per head)."""
    arch = architecture_of(encoder)
    _refuse_pruned(encoder)
    _, num_heads, head_dim = head_layout(encoder)
    contexts: list[torch.Tensor] = []

    def keep(_module: nn.Module, args: tuple) -> None:
        heads = args[0]  # (B, T, H * D)
        contexts.append(heads.detach().reshape(*heads.shape[:-1], num_heads, head_dim))

    hooks = [layer.get_submodule(arch.attn_out).register_forward_pre_hook(keep)
             for layer in encoder.get_submodule(arch.layers)]
    try:
        yield contexts
    finally:
        for hook in hooks:
            hook.remove()


# ------------------------------------------------------------------------------ the shared step


@dataclass
class _Patch:
    """What is active on one backbone: the disable masks, the recorders, and how to undo the patch."""

    masks: list[torch.Tensor] = field(default_factory=list)  # bool (L, H) each; a head is off if any says so
    recorders: list[list[torch.Tensor]] = field(default_factory=list)
    users: int = 0
    undo: list = field(default_factory=list)  # callables that restore the model

    def disabled(self, layer: int) -> torch.Tensor | None:
        """Bool ``(H,)`` of the heads of ``layer`` to disable, or None when none is."""
        if not self.masks:
            return None
        row = torch.stack([mask[layer] for mask in self.masks]).any(dim=0)
        return row if row.any() else None


def _after_softmax(patch: _Patch, layer: int, probs: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
    """Disable, then record: ``probs`` (B, H, Tq, Tk); ``key_valid`` bool (B, 1, 1, Tk), True = a real token."""
    disabled = patch.disabled(layer)
    if disabled is not None:
        valid = key_valid.to(probs.dtype)
        uniform = valid / valid.sum(dim=-1, keepdim=True).clamp(min=1)  # (B, 1, 1, Tk): 1 / L_eff
        probs = torch.where(disabled.to(probs.device)[None, :, None, None], uniform, probs)
    for recorder in patch.recorders:
        recorder.append(probs.detach())
    return probs


def _attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
               attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
               **_kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Our AttentionInterface function: eager attention (as transformers' bert code) with
    ``_after_softmax`` between the softmax and the dropout. query/key/value (B, H, T, D)."""
    if scaling is None:
        scaling = query.size(-1) ** -0.5
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # (B, H, Tq, Tk)
    if attention_mask is None:
        key_valid = torch.ones(scores.shape[0], 1, 1, scores.shape[-1], dtype=torch.bool, device=scores.device)
    elif attention_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
        key_valid = attention_mask.any(dim=-2, keepdim=True)
    else:  # additive: 0 where allowed, the dtype's minimum where masked
        scores = scores + attention_mask
        key_valid = (attention_mask > torch.finfo(attention_mask.dtype).min / 2).any(dim=-2, keepdim=True)
    probs = nn.functional.softmax(scores, dim=-1)
    site = getattr(module, _SITE_ATTR, None)
    if site is not None:
        probs = _after_softmax(*site, probs, key_valid)
    probs = nn.functional.dropout(probs, p=dropout, training=module.training)
    output = torch.matmul(probs, value).transpose(1, 2).contiguous()  # (B, T, H, D)
    return output, probs


# ------------------------------------------------------------------------------ installing

_registered = False


def _register() -> None:
    """Register ``"headsweep"`` with transformers once (a global name; it does nothing until a
    backbone's config names it)."""
    global _registered
    if not _registered:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, eager_mask

        AttentionInterface.register(_IMPLEMENTATION, _attention)
        AttentionMaskInterface.register(_IMPLEMENTATION, eager_mask)
        _registered = True


def _acquire(encoder: nn.Module) -> _Patch:
    """The backbone's patch, installed by its first user."""
    patch = getattr(encoder, _PATCH_ATTR, None)
    if patch is None:
        arch = architecture_of(encoder)
        _refuse_pruned(encoder)
        family = encoder.config.model_type
        patch = _Patch()
        attentions = [layer.get_submodule(arch.attention) for layer in encoder.get_submodule(arch.layers)]
        if family in _INTERFACE_FAMILIES:
            _install_interface(encoder, patch, attentions)
        elif family in _HOOK_FAMILIES:
            _install_hooks(patch, attentions)
        else:
            raise ValueError(
                f"attention recording/disabling supports {', '.join(_INTERFACE_FAMILIES + _HOOK_FAMILIES)}, "
                f"not model_type {family!r}"
            )
        setattr(encoder, _PATCH_ATTR, patch)
    patch.users += 1
    return patch


def _release(encoder: nn.Module) -> None:
    """One user fewer; the last one restores the backbone."""
    patch = getattr(encoder, _PATCH_ATTR)
    patch.users -= 1
    if patch.users == 0:
        for undo in reversed(patch.undo):
            undo()
        delattr(encoder, _PATCH_ATTR)


def _enable(encoder: nn.Module, mask: torch.Tensor) -> None:
    """Undo one ``disable_heads``: drop its mask (by identity) and release the patch."""
    patch = getattr(encoder, _PATCH_ATTR)
    patch.masks = [m for m in patch.masks if m is not mask]
    _release(encoder)


def _install_interface(encoder: nn.Module, patch: _Patch, attentions: list[nn.Module]) -> None:
    _register()
    original = encoder.config._attn_implementation
    for index, attention in enumerate(attentions):
        setattr(attention, _SITE_ATTR, (patch, index))
        patch.undo.append(partial(delattr, attention, _SITE_ATTR))
    encoder.set_attn_implementation(_IMPLEMENTATION)
    patch.undo.append(partial(encoder.set_attn_implementation, original))


def _install_hooks(patch: _Patch, attentions: list[nn.Module]) -> None:
    """DeBERTa-v2: keep the mask at the attention's entry, intervene at its probability dropout."""
    hooks: list[RemovableHandle] = []
    for index, attention in enumerate(attentions):
        masks: list[torch.Tensor] = []  # this forward's attention mask (B, 1, T, T), 1 = may attend

        def keep_mask(_module, args, kwargs, masks=masks) -> None:
            mask = args[1] if len(args) > 1 else kwargs["attention_mask"]
            masks[:] = [mask.bool()]

        def intervene(_module, args, masks=masks, index=index) -> tuple:
            probs = args[0]  # (B, H, T, T)
            key_valid = masks[0].any(dim=-2, keepdim=True)  # (B, 1, 1, T)
            return (_after_softmax(patch, index, probs, key_valid), *args[1:])

        hooks.append(attention.register_forward_pre_hook(keep_mask, with_kwargs=True))
        hooks.append(attention.dropout.register_forward_pre_hook(intervene))
    patch.undo.extend(hook.remove for hook in hooks)


def _refuse_pruned(encoder: nn.Module) -> None:
    if not kept_heads(encoder).all():
        raise ValueError("attention tools need every original head: this backbone was physically pruned")
