"""Issue 31 item 6, second pass: is prune_only's collapse at score lr 1e-3 a lost logit OFFSET?

Not a test (no test lane collects it): a rerunnable measurement on the real MiniLM and SST-2.

    PYTHONPATH=$PWD .venv/bin/python tests/science/mask_offset.py --seed 1 --out o.jsonl [--train-bias 1e-2]

The product's mask_train.run in the collapsing setting (prune_only, 50 %, score lr 1e-3, reset_every 50,
2,000 training phrases, 300 dev, batch 32, 200 steps). Every ``--every`` steps, with the masks of that
step, in eval mode, on the 300 dev phrases: the margin ``m = logit_1 - logit_0``'s mean and std across
inputs, the AUC of ``m`` (does the model still RANK the sentences?), the accuracy (argmax, i.e. m > 0)
and the share predicted positive, [CLS]'s variance across the dev inputs at each layer (``cls_ratio_var``:
0 = the same vector for every input; ``read`` is what the classifier reads); then the offset ``b`` re-fitted on 256 training phrases (the ``b``
minimising the mean logistic loss of ``m + b``, weights and masks untouched) and the dev accuracy of
``m + b``. ``--train-bias LR`` lets the classifier's bias (one scalar per class, frozen in prune_only,
as in the reference's ``--train_classifier false``) train with the scores at that lr: does a movable
offset prevent the collapse? One JSON line per check; Wilson 95 % intervals (n = 300).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from experiments import RunContext, parse_config
from experiments.methods import mask_train
from experiments.training.loop import batches
from tests.science.mask_collapse import ratio_var
from tests.science.skill_prune import wilson


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """P(score of a random positive > score of a random negative), ties half (Mann-Whitney)."""
    pos, neg = scores[labels == 1], scores[labels == 0]
    greater = (pos[:, None] > neg[None, :]).float().mean()
    ties = (pos[:, None] == neg[None, :]).float().mean()
    return float(greater + 0.5 * ties)


def fit_offset(margin: torch.Tensor, labels: torch.Tensor) -> float:
    """argmin_b mean softplus(-(2y - 1)(m + b)): 50 Newton steps on one scalar."""
    sign, b = 2.0 * labels.double() - 1.0, torch.zeros((), dtype=torch.float64)
    m = margin.double()
    for _ in range(50):
        p = torch.sigmoid(-sign * (m + b))  # d/db softplus(-s(m+b)) = -s p
        grad, hess = (-sign * p).mean(), (p * (1 - p)).mean().clamp_min(1e-12)
        b = b - grad / hess
    return float(b)


@torch.no_grad()
def margins(state, split, n: int | None = None, layers: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Dev margins in eval mode; with ``layers``, fills it with each layer's [CLS] ``ratio_var`` across the
    inputs (``emb``, ``L1``.., and ``read``: the vector the classifier reads, after the pooler where read)."""
    state.encoder.eval()
    state.decoder.eval()
    out, labels, cls = [], [], []
    for ids, mask, y in batches(split, 64, state.device, n):
        encoded = state.encoder(input_ids=ids, attention_mask=mask, output_hidden_states=layers is not None)
        logits = state.decoder(encoded.last_hidden_state, mask)
        out.append((logits[:, 1] - logits[:, 0]).float())
        labels.append(y)
        if layers is not None:
            cls.append([h[:, 0] for h in encoded.hidden_states] + [encoded.last_hidden_state[:, 0]])
    state.encoder.train()
    state.decoder.train()
    if layers is not None:
        names = ["emb", *(f"L{i}" for i in range(1, len(cls[0]) - 1)), "read"]
        layers |= {name: round(ratio_var(torch.cat([c[k] for c in cls])), 5) for k, name in enumerate(names)}
    return torch.cat(out), torch.cat(labels)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=25)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--train-bias", type=float, default=None, help="lr of the classifier's bias (default frozen)")
    parser.add_argument("--model", default="minilm-l6", help="tiny-bert: a smoke test of the script")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = parse_config({
        "model": args.model, "method": "mask_train", "seed": args.seed,
        "task": {"name": "sst2", "max_train": 2000, "max_eval": 300, "max_length": 64},
        "train": {"max_steps": args.steps, "batch_size": 32, "eval_every": args.steps},
        "mask_train": {"pipeline": "prune_only", "sparsity": 0.5, "lr": args.lr, "reset_every": 50},
    })
    out = open(args.out, "a")
    started = time.time()
    seen: dict = {}

    def emit(row: dict) -> None:
        out.write(json.dumps(row | {"seed": args.seed, "train_bias": args.train_bias,
                                    "load_1min": round(os.getloadavg()[0], 1),
                                    "wall_s": round(time.time() - started, 1)}) + "\n")
        out.flush()

    real_linears, real_adam, real_train_steps = mask_train.masked_linears, mask_train.adam, mask_train.train_steps

    def linears(encoder, decoder, *rest):
        seen["decoder"] = decoder
        return real_linears(encoder, decoder, *rest)

    def adam(groups, **kw):
        if args.train_bias is not None:  # after decoder.requires_grad_(False): the bias alone trains
            bias = seen["decoder"].classifier.bias
            bias.requires_grad_(True)
            groups = [*groups, {"params": [bias], "lr": args.train_bias, "weight_decay": 0.0}]
        return real_adam(groups, **kw)

    def check(state) -> None:
        layers: dict = {}
        m, y = margins(state, state.data.dev, layers=layers)
        mt, yt = margins(state, state.data.train, 256)
        b = fit_offset(mt, yt)
        n = len(y)
        acc, acc_b = float(((m > 0).long() == y).float().mean()), float((((m + b) > 0).long() == y).float().mean())
        bias = seen["decoder"].classifier.bias.detach()
        emit({"step": state.step, "margin_mean": round(float(m.mean()), 4), "margin_std": round(float(m.std()), 4),
              "auc": round(auc(m, y), 4), "accuracy": round(acc, 4), "ci": [round(x, 3) for x in wilson(acc * n, n)],
              "share_positive": round(float((m > 0).float().mean()), 4), "refit_offset": round(b, 4),
              "accuracy_refit": round(acc_b, 4), "ci_refit": [round(x, 3) for x in wilson(acc_b * n, n)],
              "bias_gap": round(float(bias[1] - bias[0]), 4), "cls_ratio_var": layers})

    def train_steps(state, ctx, total, step_fn, *rest, **kw):
        check(state)

        def step(state, batch):
            values = step_fn(state, batch)
            if (state.step + 1) % args.every == 0:
                state.step += 1  # the step this update finishes (train_steps counts it after the call)
                check(state)
                state.step -= 1
            return values

        return real_train_steps(state, ctx, total, step, *rest, **kw)

    mask_train.masked_linears, mask_train.adam, mask_train.train_steps = linears, adam, train_steps
    result = mask_train.run(cfg, RunContext())
    emit({"final": {k: v for k, v in result.metrics.items() if isinstance(v, float)}})
    out.close()


if __name__ == "__main__":
    main()
