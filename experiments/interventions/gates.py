"""Hard Concrete head gates as a module: one learnable ``log_alpha`` per head, sampled each forward.

The maths (sampling, test-time gates, the expected-L0 penalty) is ``experiments.maths.hard_concrete``;
``heads.attach_head_gates(model, head_gates)`` puts the gates on a model.
"""

from __future__ import annotations

import torch

from experiments.maths.hard_concrete import eval_gates, init_log_alpha, l0_penalty, sample_gates


class HeadGates(torch.nn.Module):
    """One Hard Concrete gate per attention head: a ``(L, H)`` ``log_alpha``.

    ``forward()`` returns a fresh ``sample_gates`` draw in training mode and
    ``eval_gates`` in eval mode, shape ``(L, H)``. The generator passed in
    initialises ``log_alpha`` and then keeps supplying the noise, so a run is
    reproducible from the generator's seed alone. Call it once per model
    forward pass (``heads.attach_head_gates(model, head_gates)`` does).
    """

    def __init__(self, num_layers: int, num_heads: int, generator: torch.Generator):
        super().__init__()
        self.generator = generator
        self.log_alpha = torch.nn.Parameter(init_log_alpha(num_layers, num_heads, generator))

    def forward(self) -> torch.Tensor:
        # float32 also inside a bf16/fp16 forward (train.precision): log u - log(1 - u) near the
        # ends of U(eps, 1 - eps) and the stretched clamp need float32's precision; the head-gate
        # hook casts the (L, H) result to the activations' dtype, one small copy per layer.
        with torch.autocast(self.log_alpha.device.type, enabled=False):
            if self.training:
                return sample_gates(self.log_alpha, self.generator)
            return eval_gates(self.log_alpha)

    def penalty(self) -> torch.Tensor:
        """``l0_penalty(self.log_alpha)``: expected open heads per layer (mean over layers)."""
        return l0_penalty(self.log_alpha)

    def extra_repr(self) -> str:
        num_layers, num_heads = self.log_alpha.shape
        return f"num_layers={num_layers}, num_heads={num_heads}"
