"""Issue 31 item 8: which part of skill-neuron pruning loses the accuracy on MiniLM.

Not a test (no test lane collects it): a rerunnable measurement on the real MiniLM and SST-2.

    PYTHONPATH=$PWD .venv/bin/python tests/science/skill_prune.py --seed 0 --out s.jsonl

Runs the product's skill_neurons.run with the grid's setting (1,000 training phrases, 300 dev, 2 epochs
of 32 = 63 steps, learned read-out) and, in place of its one pruned evaluation, evaluates pruned copies
changing ONE thing at a time from the default (layers 2-5 of 6, each keeping its top 2 %, the removed
neurons' prompt-position means folded into the output bias):
- ``layers``: which layers are pruned (5 only ... 0-5);
- ``fold``: ``all`` (the reference prune.py), ``removed`` (ours), ``zero`` (no mean folded: the null of the fold);
- ``baseline``: the prompt positions' training mean (reference) or every token's;
- ``keep``: the skill neurons or as many random neurons per layer (the null of the selection), ``fraction``;
- ``recal``: the read-out's standardisation (a parameter-free BatchNorm) re-estimated on 256 training
  phrases through the pruned backbone (forward only, no label read), or left at the unpruned model's statistics.
One JSON line per variant: dev accuracy, its Wilson 95 % interval (n = 300), and the wall time.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time

import torch

from experiments import RunContext, parse_config
from experiments.components.prompting import PromptedEncoder
from experiments.interventions.ffn_prune import prune_ffn
from experiments.maths.predictivity import by_layer, random_like, skill_neuron_mask
from experiments.methods import skill_neurons
from experiments.training.loop import batches, evaluate
from experiments.training.seeding import generator


def wilson(correct: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a proportion ``correct / n``."""
    p = correct / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


@torch.no_grad()
def recalibrate(model: PromptedEncoder, readout, state, n: int) -> None:
    """Re-estimate the read-out's BatchNorm running statistics through ``model`` on ``n`` training phrases."""
    norm = readout.norm
    norm.reset_running_stats()
    momentum, norm.momentum = norm.momentum, None  # cumulative average over the batches
    model.eval()
    readout.train()
    for ids, mask, _ in batches(state.data.train, state.cfg.train.batch_size, state.device, n):
        readout(model(ids, mask).last_hidden_state, mask)
    readout.eval()
    norm.momentum = momentum


def variants(layers_default: list[int]) -> list[dict]:
    """Default first, then one change at a time (each with and without recalibration where it matters)."""
    base = {"layers": layers_default, "fold": "removed", "baseline": "prompt", "keep": "skill", "fraction": 0.02}
    out = [base | {"recal": False}, base | {"recal": True},
           base | {"fold": "all", "recal": False}, base | {"fold": "all", "recal": True},
           base | {"keep": "random", "recal": True},
           base | {"layers": [5], "recal": False}, base | {"layers": [5], "recal": True},
           base | {"layers": [0, 1, 2, 3, 4, 5], "recal": True},
           base | {"fold": "zero", "recal": True},
           base | {"baseline": "tokens", "recal": True},
           base | {"fraction": 0.1, "recal": True},
           base | {"layers": [3, 4, 5], "recal": True},
           base | {"keep": "random", "recal": False}]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--recal-n", type=int, default=256)
    parser.add_argument("--model", default="minilm-l6", help="tiny-bert: a smoke test of the script")
    parser.add_argument("--max-train", type=int, default=1000)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = parse_config({
        "model": args.model, "method": "skill_neurons", "seed": args.seed,
        "task": {"name": "sst2", "max_train": args.max_train, "max_eval": 300, "max_length": 64},
        "train": {"epochs": 2, "batch_size": 32, "eval_every": 64},
        "skill_neurons": {"perturb_fractions": [0.02]},
    })
    out = open(args.out, "a")
    started = time.time()

    def emit(row: dict) -> None:
        out.write(json.dumps(row | {"seed": args.seed, "wall_s": round(time.time() - started, 1)}) + "\n")
        out.flush()

    def all_variants(model: PromptedEncoder, state, found: dict, hp) -> dict[str, float]:
        emit({"phase": "trained", "n_dev": len(state.data.dev)})
        per_subtask, inner = found["per_subtask"], found["per_subtask"].shape[-1]
        prompt_mean = found["train_mean"].mean(dim=0)  # (P, L, I) -> (L, I): the reference's baseline
        tokens_mean = None
        n_dev = len(state.data.dev)
        for v in variants(skill_neurons.pruned_layers(state.num_layers)):
            chosen = by_layer(skill_neuron_mask(per_subtask, v["fraction"]))
            if v["keep"] == "random":
                chosen = random_like(chosen, inner, generator(args.seed, "perturb_neurons"))
            keep = {layer: chosen[layer] for layer in v["layers"]}
            if v["baseline"] == "tokens":
                if tokens_mean is None:
                    from experiments.interventions.ffn_prune import mean_ffn_activations
                    tokens_mean = mean_ffn_activations(model.backbone, batches(state.data.train, 32, state.device),
                                                       forward=lambda b: model(b[0], b[1]))
                mean = tokens_mean
            else:
                mean = {layer: prompt_mean[layer].float() for layer in range(len(prompt_mean))}
            if v["fold"] == "zero":
                mean = {layer: torch.zeros_like(m) for layer, m in mean.items()}
            backbone = copy.deepcopy(model.backbone)
            prune_ffn(backbone, keep, mean, "all" if v["fold"] == "all" else "removed")
            pruned = PromptedEncoder(backbone, model.prompt)
            readout = copy.deepcopy(state.decoder)
            if v["recal"]:
                recalibrate(pruned, readout, state, args.recal_n)
            metrics = evaluate(pruned, readout, state.data.dev, state.task, 32, state.device)
            acc = float(metrics["accuracy"])
            low, high = wilson(acc * n_dev, n_dev)
            emit({"variant": v, "accuracy": acc, "ci": [round(low, 3), round(high, 3)], "loss": metrics["loss"]})
        # the unpruned model with a recalibrated read-out: what recalibration alone does
        readout = copy.deepcopy(state.decoder)
        recalibrate(model, readout, state, args.recal_n)
        acc = float(evaluate(model, readout, state.data.dev, state.task, 32, state.device)["accuracy"])
        emit({"variant": "unpruned, recalibrated", "accuracy": acc, "ci": [round(x, 3) for x in wilson(acc * n_dev, n_dev)]})
        return {}

    skill_neurons._pruned = all_variants
    result = skill_neurons.run(cfg, RunContext())
    acc = result.metrics["accuracy"]
    emit({"final": {k: v for k, v in result.metrics.items() if not isinstance(v, str)},
          "unpruned_ci": [round(x, 3) for x in wilson(acc * 300, 300)]})
    out.close()


if __name__ == "__main__":
    main()
