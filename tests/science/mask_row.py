"""Issue 31 item 1: PARITY.md's mask-training row on today's code, one run per call.

Not a test (no test lane collects it): the run of examples/grid_sst2_masks.yaml's prune_only cells, in process.

    PYTHONPATH=$PWD .venv/bin/python tests/science/mask_row.py --seed 0 --sparsity 0.5 --out r.jsonl

MiniLM, SST-2 (4,000 training phrases, 500 dev, 64 tokens), prune_only, 200 steps of 32, reset_every 50,
score lr ``--lr`` (3e-4: the grid's, the advised short-run setting). One JSON line: the dev metrics, the
collapse flag's measures, the Wilson 95 % interval (n = 500), wall time and load.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from base.collapse import collapsed
from experiments import RunContext, parse_config
from experiments.methods import mask_train
from tests.science.skill_prune import wilson


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sparsity", type=float, default=0.5)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--model", default="minilm-l6", help="tiny-bert: a smoke test of the script")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cfg = parse_config({
        "model": args.model, "method": "mask_train", "seed": args.seed,
        "task": {"name": "sst2", "max_train": 4000, "max_eval": 500, "max_length": 64},
        "train": {"max_steps": args.steps, "batch_size": 32, "lr": 5.0e-5, "eval_every": 100},
        "mask_train": {"pipeline": "prune_only", "sparsity": args.sparsity, "reset_every": 50, "lr": args.lr},
    })
    started, load0 = time.time(), os.getloadavg()[0]
    metrics = mask_train.run(cfg, RunContext()).metrics
    n, acc = 500, float(metrics["accuracy"])
    row = {"seed": args.seed, "sparsity": args.sparsity, "lr": args.lr, "accuracy": round(acc, 4),
           "ci": [round(x, 3) for x in wilson(acc * n, n)], "loss": round(float(metrics["loss"]), 4),
           "top_class_share": round(float(metrics["top_class_share"]), 4), "collapsed": collapsed(metrics),
           "version": mask_train.VERSION, "wall_s": round(time.time() - started, 1),
           "load_1min": [round(load0, 1), round(os.getloadavg()[0], 1)]}
    with open(args.out, "a") as out:
        out.write(json.dumps(row) + "\n")
    print(json.dumps(row))


if __name__ == "__main__":
    main()
