"""Issue 31 item 8, the product path: ``skill_neurons.run`` with the grid's setting (MiniLM, SST-2 1,000 /
300, 2 epochs of 32 = 63 steps, learned read-out), its own ``pruned_accuracy``, with ``recalibrate_bn``
true or false. Not a test (no lane collects it); one JSON line with the Wilson 95 % interval (n = 300).

    PYTHONPATH=$PWD .venv/bin/python tests/science/skill_prune_product.py true
"""

import json
import sys
import time

import torch

from experiments import RunContext, parse_config
from experiments.methods import skill_neurons
from tests.science.skill_prune import wilson

torch.set_num_threads(1)
started = time.time()
cfg = parse_config({
    "model": "minilm-l6", "method": "skill_neurons", "seed": 0,
    "task": {"name": "sst2", "max_train": 1000, "max_eval": 300, "max_length": 64},
    "train": {"epochs": 2, "batch_size": 32, "eval_every": 64},
    "skill_neurons": {"perturb_fractions": [0.02], "recalibrate_bn": sys.argv[1] == "true"},
})
metrics = skill_neurons.run(cfg, RunContext()).metrics
row = {k: metrics[k] for k in ("accuracy", "pruned_accuracy", "pruned_loss")}
row |= {"pruned_ci": [round(x, 3) for x in wilson(metrics["pruned_accuracy"] * 300, 300)],
        "recalibrate_bn": sys.argv[1] == "true", "wall_s": round(time.time() - started)}
print(json.dumps(row), flush=True)
