"""Parity of head_importance with Michel et al. (2019)'s reference code, on a tiny 2-layer random BERT.

Reference: the ``paul`` branch of pmichel31415/pytorch-pretrained-BERT,

- ``examples/classifier_eval.py:230-253`` (``calculate_head_importance``)::

      loss = model(input_ids, segment_ids, input_mask, label_ids).sum()      # l. 234
      loss.backward()                                                          # l. 235
      for layer in range(n_layers):
          ctx = self_att.context_layer_val; grad_ctx = ctx.grad                # l. 239-240
          dot = torch.einsum("bhli,bhli->bhl", [grad_ctx, ctx])                 # l. 242
          head_importance[layer] += dot.abs().sum(-1).sum(0).detach()          # l. 243
      tot_tokens += input_mask.float().detach().sum().data                     # l. 245
      head_importance[:-1] /= tot_tokens                                       # l. 246
      head_importance[-1] /= subset_size                                       # l. 247
      norm_by_layer = torch.pow(torch.pow(head_importance, 2).sum(-1), 1/2)   # l. 251
      head_importance /= norm_by_layer.unsqueeze(-1) + 1e-20                   # l. 252

- ``pytorch_pretrained_bert/modeling.py:296-307``: ``ctx = (attention_probs * head_mask) @ V``
  (B, H, T, D), a masked head's ctx is 0, then ``retain_grad()``; l. 1078-1079: the loss is
  ``CrossEntropyLoss()``, the batch MEAN (so ``.sum()`` above sums one scalar);
- ``examples/pruning.py:50``: ``n_to_prune = int(total_heads * prune_percent / 100)``, with
  ``--prune_percent `seq 5 5 100``` (are-16-heads-really-better-than-1,
  ``experiments/BERT/heads_pruning.sh``) and importance computed once (``run_classifier.py:401``:
  ``if step == 0 or args.exact_pruning``).

The reference batches are padded to the full length (``max_seq_length``); its padded positions are
summed too. Here the reference's computation runs on the untrimmed rows, ours on rows trimmed to
each batch's longest sequence.

On 7da99f0 these fail: it took ``|dL_batch/dxi_h|``, the absolute value of the batch-mean loss's
gradient with respect to one gate per head (signs of examples and tokens cancel), divided every
layer by the tokens, and rounded the pruning counts.
"""

import copy

import pytest
import torch

from experiments import parse_config
from experiments.interventions.heads import attach_head_gates
from experiments.maths.head_importance import pruning_counts
from experiments.maths.losses import task_loss
from experiments.methods.head_importance import head_importance
from experiments.models import load_backbone
from experiments.tasks import TASKS
from experiments.training.loop import forward_logits
from experiments.training.state import RunState, build_decoder

TINY = {
    "model": "tiny-bert",
    "method": "head_importance",
    "task": {"name": "synthetic-cls", "num_train": 64, "num_eval": 32, "max_length": 24},
    "train": {"max_steps": 6, "batch_size": 8, "eval_every": 6, "lr": 1e-3},
}


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


def _state(dtype=torch.float32) -> RunState:
    """A random 2-layer, 4-head BERT with a random decoder over synthetic-cls, in eval mode."""
    cfg = parse_config(copy.deepcopy(TINY))
    task = TASKS[cfg.task.name]
    encoder, tokenizer = load_backbone(cfg.model, 0)
    data = task.load(cfg.task, tokenizer)
    decoder = build_decoder(task, encoder.config.hidden_size, data.num_labels, seed=0)
    encoder.to(dtype).eval(), decoder.to(dtype).eval()
    return RunState(cfg=cfg, task=task, data=data, encoder=encoder, decoders={"task": decoder})


def _reference_importance(state: RunState, keep: torch.Tensor, subset_size: int, normalize: bool) -> torch.Tensor:
    """``calculate_head_importance`` (classifier_eval.py:230-253), step by step: hooks keep each
    layer's context ``ctx`` (B, H, T, D) with ``retain_grad``, masked heads' ctx zeroed (their
    ``attention_probs * head_mask``), the batch-mean loss backpropagated, then the einsum."""
    encoder, decoder = state.encoder, state.decoder
    split, batch_size = state.data.train, state.cfg.train.batch_size
    num_layers, num_heads = keep.shape
    head_dim = encoder.config.hidden_size // num_heads
    contexts: dict[int, torch.Tensor] = {}

    def keep_context(layer, _module, args):
        heads = args[0]  # (B, T, H * D): ctx.permute(0, 2, 1, 3).view(B, T, H * D), modeling.py:308-310
        bthd = heads.view(*heads.shape[:2], num_heads, head_dim) * keep[layer].to(heads.dtype)[:, None]
        ctx = bthd.permute(0, 2, 1, 3)  # (B, H, T, D), the reference's context_layer
        ctx.retain_grad()
        contexts[layer] = ctx
        return (ctx.permute(0, 2, 1, 3).reshape(heads.shape), *args[1:])

    hooks = [layer.attention.output.dense.register_forward_pre_hook(lambda m, a, i=i: keep_context(i, m, a))
             for i, layer in enumerate(encoder.encoder.layer)]
    importance = torch.zeros(num_layers, num_heads, dtype=torch.float64)
    tot_tokens = 0.0
    try:
        for start in range(0, subset_size, batch_size):
            rows = slice(start, min(start + batch_size, subset_size))
            input_ids, input_mask = split.input_ids[rows], split.attention_mask[rows]  # padded to max_length
            label_ids = split.labels[rows]
            encoder.zero_grad(), decoder.zero_grad()
            loss = task_loss(forward_logits(encoder, decoder, input_ids, input_mask), label_ids).sum()
            loss.backward()
            for layer in range(num_layers):
                ctx = contexts[layer]
                grad_ctx = ctx.grad
                dot = torch.einsum("bhli,bhli->bhl", grad_ctx, ctx)
                importance[layer] += dot.abs().sum(-1).sum(0).detach().double()
            tot_tokens += float(input_mask.float().sum())
    finally:
        for hook in hooks:
            hook.remove()
    importance[:-1] /= tot_tokens
    importance[-1] /= subset_size
    if normalize:
        norm_by_layer = torch.pow(torch.pow(importance, 2).sum(-1), 1 / 2)
        importance /= norm_by_layer.unsqueeze(-1) + 1e-20
    return importance.float()


def test_importance_equals_the_reference_computation_with_padding_and_a_pruned_head():
    state = _state()
    for module in (state.encoder, state.decoder):
        module.requires_grad_(True)  # the reference's model: ctx.retain_grad needs a graph
    keep = torch.ones(2, 4, dtype=torch.bool)
    keep[0, 3] = False
    n = 20  # batches of 8, 8 and 4: the last one's mean weighs its examples more, as in the reference
    assert (state.data.train.attention_mask[:n] == 0).any()  # some padding to handle
    for normalize in (False, True):
        reference = _reference_importance(state, keep, n, normalize)
        ours = head_importance(state, keep, n, normalize)
        torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-9)
    assert ours[0, 3] == 0 and (ours[0, :3] > 0).all()


def test_importance_is_not_the_absolute_gradient_of_the_batch_mean():
    """Per example and token, |.| before the sum: at least |sum|, strictly more where signs differ."""
    state = _state()
    keep = torch.ones(2, 4, dtype=torch.bool)
    ours = head_importance(state, keep, 16, normalize=False)
    split = state.data.train
    xi = torch.ones(2, 4, requires_grad=True)
    handle = attach_head_gates(state.encoder, lambda: xi)
    batch_mean = torch.zeros(2, 4)
    for rows in (slice(0, 8), slice(8, 16)):
        loss = task_loss(forward_logits(state.encoder, state.decoder, split.input_ids[rows], split.attention_mask[rows]),
                         split.labels[rows])
        (grad,) = torch.autograd.grad(loss, xi)
        batch_mean += grad.abs()
    handle.remove()
    tokens = int(split.attention_mask[:16].sum())
    old = batch_mean / tokens
    old[-1] = batch_mean[-1] / 16
    assert (ours >= old - 1e-7).all()
    assert (ours > 1.5 * old).any()  # cancellation across examples and tokens is real here


def test_importance_of_one_example_equals_finite_differences_per_token():
    """dL/dxi_{h,t} by central differences (one head at one token scaled by 1 +- eps), in float64:
    each equals our per-token gradient, and the sum of their absolute values over tokens is our
    unnormalised importance of that example (times its tokens)."""
    # imported here, so that on 7da99f0 (which has none) only this test fails to import
    from experiments.methods.head_importance import token_gradients

    state = _state(torch.float64)
    split = state.data.train
    length = int(split.attention_mask[0].sum())
    ids, mask, labels = split.input_ids[:1, :length], split.attention_mask[:1, :length], split.labels[:1]
    keep = torch.ones(2, 4, dtype=torch.bool)

    def loss_with(layer: int, token: int, head: int, scale: float) -> float:
        def bump(_module, args):
            heads = args[0].clone()  # (1, T, H * D)
            heads[:, token, head * 8:(head + 1) * 8] *= scale  # head_dim = 32 / 4
            return (heads, *args[1:])

        hook = state.encoder.encoder.layer[layer].attention.output.dense.register_forward_pre_hook(bump)
        try:
            with torch.no_grad():
                return task_loss(forward_logits(state.encoder, state.decoder, ids, mask), labels).item()
        finally:
            hook.remove()

    grads = token_gradients(state.encoder, state.decoder, ids, mask, labels, keep.double())  # (L, 1, T, H)
    eps = 1e-5
    fd = torch.zeros(2, length, 4, dtype=torch.float64)
    for layer in range(2):
        for token in range(length):
            for head in range(4):
                fd[layer, token, head] = (loss_with(layer, token, head, 1 + eps)
                                          - loss_with(layer, token, head, 1 - eps)) / (2 * eps)
    assert fd.abs().max() > 1e-4  # a real signal to match
    torch.testing.assert_close(grads[:, 0].double(), fd, rtol=1e-5, atol=1e-9)
    assert (fd[1, 1:] == 0).all()  # the last layer reaches the loss only through [CLS]
    importance = head_importance(state, keep, 1, normalize=False)
    expected = fd.abs().sum(dim=1)
    torch.testing.assert_close(importance[0].double() * length, expected[0], rtol=1e-5, atol=1e-9)
    torch.testing.assert_close(importance[1].double(), expected[1], rtol=1e-5, atol=1e-9)  # per example


def test_pruning_counts_are_the_reference_scripts():
    """``int(total_heads * prune_percent / 100)`` at ``seq 5 5 100`` (pruning.py:50)."""
    for total in (8, 72, 144):
        reference = [0] + [int(total * percent / 100) for percent in range(5, 101, 5)]
        assert pruning_counts(total, 0.05) == reference
    assert pruning_counts(72, 0.05)[6] == 21  # 30 %: int(21.6), not round()'s 22
