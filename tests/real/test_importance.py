"""Michel et al. (2019)'s head importance on the real pretrained MiniLM and real SST-2 (a minute or
two): `make real`, not in `make test`.

A short fine-tune, then ``head_importance`` (the map and a coarse pruning curve); the map must not
be constant, and on the fine-tuned model in float64 the per-token gradients it sums must equal
central finite differences (one head at one token scaled by 1 +- eps), and its unnormalised
importance of one example the sum of their absolute values.
"""

import copy

import numpy as np
import pytest
import torch

from experiments import RunContext, parse_config
from experiments.maths.losses import task_loss
from experiments.methods.head_importance import head_importance, token_gradients
from experiments.models import architecture_of, head_layout
from experiments.training.loop import forward_logits
from experiments.training.state import set_up

pytestmark = pytest.mark.real

CONFIG = {
    "model": "minilm-l6",
    "method": "head_importance",
    "seed": 0,
    "task": {"name": "sst2", "max_train": 960, "max_eval": 200, "max_length": 40},
    "train": {"max_steps": 60, "batch_size": 16, "eval_every": 60, "lr": 1e-4},
    "head_importance": {"examples": 64, "step": 0.25},
}


@pytest.mark.timeout(1200)  # 6 min at a load of 4-6 (231 s of CPU on 2 threads); 10.5 min at a load of 10
def test_sst2_importance_map_and_finite_differences(run_chain):
    torch.set_num_threads(2)
    cfg = parse_config(copy.deepcopy(CONFIG))
    result, store = run_chain(cfg)
    metrics, importance = result.metrics, result.maps["heads.importance"].values
    curve = [metrics[f"accuracy_pruned_{p}"] for p in (0, 25, 50, 75, 100)]
    print(f"\nSST-2 head_importance: accuracy {metrics['accuracy']:.4f}, pruning curve (0/25/50/75/100 %) "
          f"{[round(a, 3) for a in curve]}\nimportance\n{np.round(importance, 3)}")
    assert metrics["accuracy"] >= 0.75  # chance is 0.5
    assert curve[0] == metrics["accuracy"]
    assert curve[1] >= metrics["accuracy"] - 0.1  # the least important quarter of the heads is expendable
    assert importance.shape == (6, 12) and np.isfinite(importance).all()
    np.testing.assert_allclose(np.linalg.norm(importance, axis=1), 1.0, rtol=1e-5)
    assert importance.std() > 0.02 and (importance.max(axis=1) > 1.5 * importance.min(axis=1)).all()

    # finite differences on the fine-tuned model, in float64, for a few heads at every token of one example
    upstream = cfg.upstreams["init_from"].run_key
    state = set_up(cfg, RunContext(load_upstream=lambda role: store[upstream]))
    state.train(False)
    state.encoder.double(), state.decoder.double()
    split = state.data.train
    length = int(split.attention_mask[0].sum())
    ids, mask, labels = split.input_ids[:1, :length], split.attention_mask[:1, :length], split.labels[:1]
    arch, (_, _, head_dim) = architecture_of(state.encoder), head_layout(state.encoder)
    layers = state.encoder.get_submodule(arch.layers)

    def loss_with(layer: int, token: int, head: int, scale: float) -> float:
        def bump(_module, args):
            heads = args[0].clone()  # (1, T, H * D)
            heads[:, token, head * head_dim:(head + 1) * head_dim] *= scale
            return (heads, *args[1:])

        hook = layers[layer].get_submodule(arch.attn_out).register_forward_pre_hook(bump)
        try:
            with torch.no_grad():
                return task_loss(forward_logits(state.encoder, state.decoder, ids, mask), labels).item()
        finally:
            hook.remove()

    keep = torch.ones(6, 12, dtype=torch.bool)
    grads = token_gradients(state.encoder, state.decoder, ids, mask, labels, keep.double())[:, 0]  # (L, T, H)
    raw = head_importance(state, keep, 1, normalize=False)  # the first training example
    eps = 1e-5
    for layer, head in ((0, 3), (3, 7)):
        fd = torch.tensor([(loss_with(layer, t, head, 1 + eps) - loss_with(layer, t, head, 1 - eps)) / (2 * eps)
                           for t in range(length)], dtype=torch.float64)
        assert fd.abs().max() > 1e-6, (layer, head)  # a signal to match
        torch.testing.assert_close(grads[layer, :, head].double(), fd, rtol=1e-4, atol=1e-9)
        torch.testing.assert_close(float(raw[layer, head]) * length, float(fd.abs().sum()), rtol=1e-4, atol=1e-9)
