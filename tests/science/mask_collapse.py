"""Issue 31 item 6: what happens, step by step, when prune_only mask training collapses at score lr 1e-3.

Not a test (no test lane collects it): a rerunnable measurement on the real MiniLM and SST-2.

    PYTHONPATH=$PWD .venv/bin/python tests/science/mask_collapse.py --seed 1 --lr 1e-3 --steps 200 --out m.jsonl

Runs the product's own mask_train.run (the grid's setting: prune_only, 50 %, reset_every 50,
2,000 training phrases, batch 32) and, through forward hooks on the training forwards, records per step:
- ``cls_var``: [CLS]'s variance across the batch (mean over dims) / its mean square: 0 = input-independent;
- ``pre_sat``: fraction of the pooler's pre-activations ``W_p h + b`` with |z| > 2 (tanh' < 0.07);
- ``pooled_var``: the pooled vector's variance across the batch / its mean square;
- ``logit_gap_mean`` / ``logit_gap_std``: the mean and the across-batch std of logit1 - logit0;
- the density of every masked matrix (pooler, classifier, each layer's mean) and the loss.
One JSON line per step. torch runs on 1 thread (a shared machine).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from experiments import RunContext, parse_config
from experiments.methods import mask_train


def ratio_var(x: torch.Tensor) -> float:
    """Across-batch variance over mean square, both averaged over the feature dims."""
    x = x.detach().float()
    return float(x.var(dim=0).mean() / x.pow(2).mean().clamp_min(1e-30))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--reset-every", type=int, default=50)
    parser.add_argument("--eval-every", type=int, default=25)
    parser.add_argument("--max-eval", type=int, default=300)
    parser.add_argument("--set", action="append", default=[], help="extra mask_train key=value (json value)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)

    section = {"pipeline": "prune_only", "sparsity": 0.5, "lr": args.lr, "reset_every": args.reset_every}
    for item in args.set:
        key, value = item.split("=", 1)
        section[key] = json.loads(value)
    cfg = parse_config({
        "model": "minilm-l6", "method": "mask_train", "seed": args.seed,
        "task": {"name": "sst2", "max_train": 2000, "max_eval": args.max_eval, "max_length": 64},
        "train": {"max_steps": args.steps, "batch_size": 32, "eval_every": args.eval_every},
        "mask_train": section,
    })
    record: dict = {}
    out = open(args.out, "w")
    started = time.time()
    original = mask_train.train_steps

    def instrumented(state, ctx, total, step_fn, *rest, **kw):
        pooler_dense = state.encoder.pooler.dense
        scores = state.interventions["masks"]

        def on_pooler(module, inputs, output):
            if module.training:
                record["cls_var"] = ratio_var(inputs[0])
                record["cls_norm"] = float(inputs[0].detach().norm(dim=-1).mean())
                record["pre_sat"] = float((output.detach().abs() > 2).float().mean())
                record["pre_abs_mean"] = float(output.detach().abs().mean())
                record["pooled_var"] = ratio_var(torch.tanh(output))

        def on_decoder(module, inputs, output):
            if module.training:
                gap = (output[:, 1] - output[:, 0]).detach()
                record["logit_gap_mean"], record["logit_gap_std"] = float(gap.mean()), float(gap.std())

        hooks = [pooler_dense.register_forward_hook(on_pooler), state.decoder.register_forward_hook(on_decoder)]

        def step(state, batch):
            values = step_fn(state, batch)
            masks = scores.binary_masks()
            density = {name: float(m.float().mean()) for name, m in masks.items()}
            layers = {}
            for name, d in density.items():
                if name.startswith("layer."):
                    layers.setdefault(int(name.split(".")[1]), []).append(d)
            row = {"step": state.step + 1, "loss": values["loss"], **record,
                   "density_pooler": density.get("pooler"),
                   "density_decoder": density.get("decoder.classifier"),
                   "density_layers": [round(sum(v) / len(v), 4) for _, v in sorted(layers.items())],
                   "density_min_matrix": min(density.values()), "density_max_matrix": max(density.values()),
                   "wall_s": round(time.time() - started, 1)}
            out.write(json.dumps(row) + "\n")
            out.flush()
            return values

        try:
            return original(state, ctx, total, step, *rest, **kw)
        finally:
            for hook in hooks:
                hook.remove()

    mask_train.train_steps = instrumented

    class Tracker:
        def log_metrics(self, metrics, step):
            out.write(json.dumps({"eval_step": step, **{k: float(v) for k, v in metrics.items()}}) + "\n")
            out.flush()

        def __getattr__(self, name):
            return lambda *a, **k: None

    result = mask_train.run(cfg, RunContext(tracker=Tracker()))
    out.write(json.dumps({"final": result.metrics, "wall_s": round(time.time() - started, 1)}) + "\n")
    out.close()


if __name__ == "__main__":
    main()
