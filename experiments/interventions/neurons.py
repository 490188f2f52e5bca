"""Read and perturb FFN neurons without editing model files (skill neurons, Wang et al. 2022).

A "neuron" is one unit of a layer's FFN activation after the non-linearity: the output
``(B, T, I)`` of the module ``models.ARCHITECTURES[...].ffn_act`` (BERT's ``intermediate``:
``act(dense(x))``). Both tools are forward hooks on that module:

- :func:`capture_ffn` records the activations of every layer, optionally only at some
  token positions (the soft prompt's, so a pass over a data set stays small);
- :func:`perturb_neurons` adds Gaussian noise ``N(0, std^2)`` to chosen neurons (the paper's
  perturbation check: noise on the skill neurons should hurt the task more than noise on as
  many random neurons). As the reference code (THU-KEG/Skill-Neuron ``src/modelzoo.py:82-87``,
  ``BaseModel.addmask``, type gaussian) does: ONE noise vector per sequence,
  ``randn([B, I]) * std`` masked to the chosen neurons, added at EVERY position (prompt, text
  and padding alike), a fresh draw each forward. A consistent shift of the neuron for the
  whole sequence, far stronger than independent noise per token, which attention averages out.

Hooks run in order, and a hook that returns a value replaces the output the next one sees.
Perturbations are put FIRST in the module's hooks (``prepend``) and captures last, so a
capture records what the next layer reads (the noisy values), whichever was attached first.
Neuron indices always address the ORIGINAL ``(L, I)`` neurons of an unpruned model.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from experiments.interventions.handles import Handle
from experiments.models import architecture_of


def ffn_act_modules(encoder: nn.Module) -> list[nn.Module]:
    """The ``ffn_act`` module of every layer, layer 0 first."""
    arch = architecture_of(encoder)
    return [layer.get_submodule(arch.ffn_act) for layer in encoder.get_submodule(arch.layers)]


@dataclass
class FfnCapture:
    """What :func:`capture_ffn` yields: the activations recorded since the last :meth:`take`."""

    num_layers: int
    recorded: dict[int, list[torch.Tensor]] = field(default_factory=dict)

    def take(self) -> torch.Tensor:
        """The recorded activations as one ``(N, P, L, I)`` tensor (forwards concatenated over
        the batch dimension, layers stacked), and forget them. ``P`` is the number of recorded
        positions (all ``T`` without ``positions``). Every layer must have seen the same forwards."""
        counts = {layer: len(self.recorded.get(layer, [])) for layer in range(self.num_layers)}
        if len(set(counts.values())) != 1 or counts[0] == 0:
            raise RuntimeError(f"no complete forward pass recorded (forwards seen per layer: {counts})")
        per_layer = [torch.cat(self.recorded[layer]) for layer in range(self.num_layers)]  # L x (N, P, I)
        self.recorded.clear()
        return torch.stack(per_layer, dim=2)


@contextmanager
def capture_ffn(encoder: nn.Module, positions: torch.Tensor | slice | None = None) -> Iterator[FfnCapture]:
    """Record every layer's FFN activation after the non-linearity during the block.

    ``positions``: token positions to keep (a LongTensor or a slice of the ``T`` axis); None
    keeps all. Records are detached copies on the model's device; call ``capture.take()``
    after each forward (or a few) to collect ``(B, P, L, I)`` and free them. The hooks are
    removed when the block ends, also on an error.
    """
    modules = ffn_act_modules(encoder)
    capture = FfnCapture(num_layers=len(modules))
    index = slice(None) if positions is None else positions

    def hook(layer: int, module: nn.Module, args, output: torch.Tensor) -> None:
        capture.recorded.setdefault(layer, []).append(output[:, index, :].detach().clone())

    handles = [module.register_forward_hook(lambda m, a, o, layer=layer: hook(layer, m, a, o))
               for layer, module in enumerate(modules)]
    try:
        yield capture
    finally:
        for handle in handles:
            handle.remove()


def perturb_neurons(encoder: nn.Module, neurons: Mapping[int, torch.Tensor], std: float,
                    generator: torch.Generator) -> Handle:
    """Add ``N(0, std^2)`` noise to the chosen neurons' activations, one draw per sequence, every forward.

    ``neurons``: layer -> LongTensor of neuron indices in that layer (a layer left out, or an
    empty tensor, is untouched). Each forward of a layer draws ``randn((B, I), generator) * std``
    (``I`` the layer's FFN width, all of it drawn as the reference draws ``randn([B, 3072])``),
    keeps the chosen neurons' columns and adds them at every position: ``(B, 1, I)`` broadcast over
    ``T``. ``generator`` draws the noise (on the model's device), so two evaluations from
    generators in the same state see the same noise. Returns a handle whose ``remove()``
    restores the plain model.
    """
    modules = ffn_act_modules(encoder)
    handle = Handle()
    for layer, index in neurons.items():
        if not 0 <= layer < len(modules):
            raise ValueError(f"layer {layer} out of range: the encoder has {len(modules)} layers")
        index = torch.as_tensor(index, dtype=torch.long).flatten()
        if index.numel() == 0:
            continue

        def hook(module: nn.Module, args, output: torch.Tensor, index: torch.Tensor = index) -> torch.Tensor:
            index = index.to(output.device)
            noise = torch.randn((output.shape[0], output.shape[-1]), generator=generator,
                                device=output.device, dtype=output.dtype) * std  # (B, I): one per sequence
            noisy = output.clone()
            noisy[..., index] += noise[:, None, index]  # (B, 1, k) broadcast over the T positions
            return noisy

        handle.undo.append(modules[layer].register_forward_hook(hook, prepend=True).remove)  # before any capture
    return handle
