"""Gate and physically prune attention heads without editing model files.

transformers 5 has neither ``head_mask`` nor ``prune_heads``. Every supported
encoder (``models.ARCHITECTURES``) computes the heads' outputs, concatenates
them to ``(B, T, H * D)`` and feeds that to the attention output projection
``attn_out``. So:

- gating (Voita et al. 2019; He & Choi 2021) is a forward pre-hook on
  ``attn_out`` that views its input as ``(B, T, H, D)`` and multiplies head h
  of layer l by ``z[l, h]``;
- physical pruning slices head h's rows out of q/k/v (and DeBERTa-v2's
  relative-position projections) and its input columns out of ``attn_out``.
  A layer with every head removed gets a stub attention returning
  ``(B, T, 0)``, so its attention output is exactly ``attn_out``'s bias, as
  with all its gates at 0.

Per-token gates (Michel et al. 2019's importance, ``attach_token_gates``) are the same pre-hook
with one gate per example, token and head, made fresh at each forward so that their gradient is
``dL/dxi`` per token.

Gates and keep masks always index the ORIGINAL ``(L, H)`` heads, also after
pruning: ``kept_heads(model)`` says which are still there, and
``attach_head_gates`` on a pruned model applies the gates of the remaining
heads only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial

import torch
from torch import nn

from experiments.interventions.handles import Handle
from experiments.models import Architecture, architecture_of, head_layout

_KEPT_ATTR = "_headsweep_kept_heads"


def kept_heads(model: nn.Module) -> torch.Tensor:
    """Bool ``(L, H)``: which original heads are still in the model (all True if never pruned)."""
    kept = getattr(model, _KEPT_ATTR, None)
    if kept is not None:
        return kept.clone()
    num_layers, num_heads, _ = head_layout(model)
    return torch.ones(num_layers, num_heads, dtype=torch.bool)


@dataclass
class GateHandle(Handle):
    """What ``attach_head_gates`` returns: a ``Handle`` that also holds ``gates``, the ``(L, H)``
    gates of the latest forward pass (None before the first)."""

    gates: torch.Tensor | None = None


def attach_head_gates(model: nn.Module, gate_source: Callable[[], torch.Tensor]) -> GateHandle:
    """Multiply every head's output by a gate drawn once per forward pass.

    A forward pre-hook on the backbone calls ``gate_source()`` once per model
    forward: one ``(L, H)`` sample shared by the whole batch, as in Voita et
    al. A pre-hook on each layer's ``attn_out`` then scales head h's slice of
    the concatenated heads, ``x.view(B, T, H, D) * z[l, None, None, :, None]``.
    Gradients flow to whatever produced the gates (e.g. ``gates.HeadGates``).
    A fixed 0/1 mask is ``attach_head_gates(model, lambda: mask)``.
    """
    num_layers, num_heads, head_dim = head_layout(model)
    handle = GateHandle()

    def draw(_module: nn.Module, _args: tuple) -> None:
        gates = gate_source()
        if tuple(gates.shape) != (num_layers, num_heads):
            raise ValueError(
                f"gate_source returned shape {tuple(gates.shape)}, expected "
                f"(layers, heads) = ({num_layers}, {num_heads})"
            )
        handle.gates = gates

    handle.undo.append(model.register_forward_pre_hook(draw).remove)
    _hook_heads(model, handle, partial(_gate_heads, handle, head_dim))
    return handle


def _hook_heads(model: nn.Module, handle: Handle, body: Callable) -> None:
    """Put ``body(layer_index, remaining, module, args)`` on every layer's ``attn_out`` as a forward
    pre-hook (its input holds the heads, concatenated), removed by ``handle``. ``remaining``: the
    original indices of the layer's heads still there; None when all are (no gather on the hot path)."""
    arch = architecture_of(model)
    kept = kept_heads(model)
    for index, layer in enumerate(model.get_submodule(arch.layers)):
        remaining = None if kept[index].all() else kept[index].nonzero().squeeze(-1)
        hook = partial(body, index, remaining)
        handle.undo.append(layer.get_submodule(arch.attn_out).register_forward_pre_hook(hook).remove)


def _gate_heads(
    handle: GateHandle,
    head_dim: int,
    layer_index: int,
    remaining: torch.Tensor | None,
    _module: nn.Module,
    args: tuple,
) -> tuple | None:
    """Pre-hook body: scale the heads in ``args[0]`` (B, T, H * D) by this layer's gates."""
    if handle.gates is None:
        raise RuntimeError(
            "head gates are drawn in the backbone's forward pre-hook: call the backbone, "
            "not one of its layers"
        )
    return _scale_heads(args, handle.gates[layer_index], remaining, head_dim)  # gates (H,)


def _scale_heads(args: tuple, gates: torch.Tensor, remaining: torch.Tensor | None, head_dim: int) -> tuple | None:
    """The pre-hook's new args: head h of ``args[0]`` (B, T, H_kept * D) scaled by ``gates[..., h]``,
    gates ``(H,)`` or ``(B, T, H)`` over the ORIGINAL heads (``remaining`` picks the kept ones)."""
    heads = args[0]  # (B, T, H_kept * D)
    if heads.shape[-1] == 0:  # every head of this layer pruned
        return None
    if remaining is not None:
        gates = gates[..., remaining.to(gates.device)]  # (..., H_kept)
    shape = heads.shape
    per_head = heads.reshape(*shape[:-1], -1, head_dim)  # (B, T, H_kept, D)
    gated = per_head * gates.to(heads.dtype)[..., None]  # * (H_kept, 1) or (B, T, H_kept, 1)
    return (gated.reshape(shape), *args[1:])


@dataclass
class TokenGateHandle(Handle):
    """What ``attach_token_gates`` returns: a ``Handle`` that also holds ``gates``, per layer the
    ``(B, T, H)`` float32 leaves of the latest forward pass (None before the first), each requiring grad."""

    gates: list[torch.Tensor | None] = field(default_factory=list)


def attach_token_gates(model: nn.Module, values: torch.Tensor) -> TokenGateHandle:
    """Give every head its own gate at every token: Michel et al.'s ``xi_h`` per example and token.

    At each forward, each layer's ``attn_out`` pre-hook makes a fresh float32 leaf
    ``xi = values[l]`` broadcast to ``(B, T, H)`` (``requires_grad``), stores it in
    ``handle.gates[l]`` and scales head h at token t of example b by ``xi[b, t, h]``. After a
    loss ``L``, ``torch.autograd.grad(L, handle.gates)`` is ``dL/dxi`` per example, token and head,
    which at ``xi = 1`` equals ``sum_d dL/dctx[b, h, t, d] * ctx[b, h, t, d]``: the gradient of
    the head's output (its context vector) dotted with that output. ``values`` (L, H), e.g. a 0/1
    keep mask; on a physically pruned model the removed heads' gates act on nothing (their
    gradient is 0, and a layer with no head left gets a gate that is not in the graph).
    """
    num_layers, num_heads, head_dim = head_layout(model)
    if tuple(values.shape) != (num_layers, num_heads):
        raise ValueError(f"values must be (layers, heads) = ({num_layers}, {num_heads}), got {tuple(values.shape)}")
    handle = TokenGateHandle(gates=[None] * num_layers)
    _hook_heads(model, handle, partial(_gate_tokens, handle, values.detach().float(), head_dim))
    return handle


def _gate_tokens(
    handle: TokenGateHandle,
    values: torch.Tensor,
    head_dim: int,
    layer_index: int,
    remaining: torch.Tensor | None,
    _module: nn.Module,
    args: tuple,
) -> tuple | None:
    """Pre-hook body: a fresh (B, T, H) gate leaf from ``values[layer_index]``, then scale the heads
    in ``args[0]`` (B, T, H * D)."""
    heads = args[0]  # (B, T, H_kept * D)
    layer_values = values[layer_index].to(heads.device)  # (H,)
    xi = layer_values.expand(*heads.shape[:-1], -1).clone().requires_grad_(True)  # (B, T, H)
    handle.gates[layer_index] = xi
    return _scale_heads(args, xi, remaining, head_dim)


def prune_heads(model: nn.Module, keep: torch.Tensor) -> nn.Module:
    """Physically remove the heads where ``keep`` (bool ``(L, H)``) is False; in place.

    Slices head h's D rows (weights and biases) out of the query, key and
    value projections (and DeBERTa-v2's ``pos_key_proj`` / ``pos_query_proj``
    when present) and its D input columns out of ``attn_out``, then updates
    ``num_attention_heads`` / ``all_head_size``, which the attention forwards
    read to split heads. A layer left with no head gets a stub attention
    returning ``(B, T, 0)``, so its attention output is ``attn_out``'s bias.
    The outputs equal those of the unpruned model gated with ``keep`` (Michel
    et al. 2019's speed-up without the mask). ``keep`` indexes the original
    heads; pruning again may only remove more. Parameters are replaced, so
    build optimizers after pruning. ``model.config`` is left as it was (it
    describes the original heads), so to reload a pruned model, load the
    original and prune it again with the saved ``kept_heads(model)``.
    """
    arch = architecture_of(model)
    num_layers, num_heads, head_dim = head_layout(model)
    keep = keep.detach().to("cpu", torch.bool)
    if tuple(keep.shape) != (num_layers, num_heads):
        raise ValueError(
            f"keep must be (layers, heads) = ({num_layers}, {num_heads}), got {tuple(keep.shape)}"
        )
    current = kept_heads(model)
    if (keep & ~current).any():
        raise ValueError(
            "keep asks for heads that were already pruned; pruning cannot restore them"
        )
    for index, layer in enumerate(model.get_submodule(arch.layers)):
        local = keep[index][current[index]]  # (H_current,) which of the remaining heads stay
        if local.all():
            continue
        _prune_layer(layer, arch, local, head_dim)
    setattr(model, _KEPT_ATTR, keep.clone())
    return model


def _prune_layer(layer: nn.Module, arch: Architecture, local: torch.Tensor, head_dim: int) -> None:
    """Keep the heads of one layer where ``local`` (bool, one per current head) is True."""
    rows = _head_rows(local, head_dim)  # (H_kept * D,)
    num_kept = int(local.sum())
    if num_kept == 0:
        parent, _, child = arch.attention.rpartition(".")
        setattr(layer.get_submodule(parent), child, _NoHeads(head_dim))
    else:
        for path in (arch.query, arch.key, arch.value, *arch.extra_head_projections):
            projection = _submodule_or_none(layer, path)
            if projection is not None:
                _slice_linear(projection, rows, dim=0)
        attention = layer.get_submodule(arch.attention)
        attention.num_attention_heads = num_kept
        attention.all_head_size = num_kept * head_dim
    _slice_linear(layer.get_submodule(arch.attn_out), rows, dim=1)


def _head_rows(local: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Indices of the ``H * D`` features belonging to the heads kept in ``local``."""
    heads = local.nonzero().squeeze(-1)  # (H_kept,)
    return (heads[:, None] * head_dim + torch.arange(head_dim)).reshape(-1)  # (H_kept * D,)


def _slice_linear(linear: nn.Linear, index: torch.Tensor, dim: int) -> None:
    """Keep ``index`` along ``dim`` of a Linear's weight (0: outputs, bias too; 1: inputs)."""
    index = index.to(linear.weight.device)
    weight = linear.weight.detach().index_select(dim, index).clone()
    linear.weight = nn.Parameter(weight, requires_grad=linear.weight.requires_grad)
    if dim == 0:
        if linear.bias is not None:
            bias = linear.bias.detach()[index].clone()
            linear.bias = nn.Parameter(bias, requires_grad=linear.bias.requires_grad)
        linear.out_features = len(index)
    else:
        linear.in_features = len(index)


def _submodule_or_none(root: nn.Module, path: str) -> nn.Module | None:
    try:
        return root.get_submodule(path)
    except AttributeError:
        return None


class _NoHeads(nn.Module):
    """Stands in for a self-attention whose heads were all pruned: returns ``(B, T, 0)``.

    Accepts any of the supported attention forwards' arguments; DeBERTa-v2
    may pass ``query_states`` (its enhanced mask decoder), whose length wins.
    """

    def __init__(self, head_dim: int):
        super().__init__()
        self.num_attention_heads = 0
        self.attention_head_size = head_dim
        self.all_head_size = 0

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> tuple[torch.Tensor, None]:
        query_states = kwargs.get("query_states")
        reference = hidden_states if query_states is None else query_states
        return reference.new_zeros(*reference.shape[:-1], 0), None  # (B, T, 0)
