"""Mask training on the real pretrained MiniLM and real SST-2 (minutes): `make real`, not in `make test`."""

import pytest
import torch

from experiments import parse_config
from experiments.core.seeding import derive_seed
from experiments.core.state import build_decoder
from experiments.models import load_backbone
from experiments.tasks import TASKS

pytestmark = pytest.mark.real


@pytest.mark.timeout(1200)  # ~3 min on 2 quiet cores; 10 under a load of 8
def test_sst2_prune_only_learns_through_the_mask_alone(run_chain):
    """Liu et al.'s pipeline (c) as the reference scripts run it: masks on the frozen pretrained
    MiniLM, the pooler and a random classifier, masked and never trained. 2,000 training phrases,
    150 steps of 32; the score lr is 1e-3, not the reference's 5e-5 (at 5e-5 no weight flips
    before ~200 steps). Measured at 7da99f0's protocol (a trained dense decoder, no pooler, lr
    1e-3 constant): 0.470; with this protocol: 0.776 on 1 thread, 0.728 on 2 (seed 0) on 2026-11-25's install, and
    0.596 on 2 on 2026-11-26's fresh install (transformers 5.24.0, numpy 2.4.6), the same at 1be455c and after
    the redesign of issue 21: the number moves with the installed stack. Dev accuracy (500 examples: one
    standard error at chance is 0.022) must be above chance (0.5) by three standard errors at 50 % sparsity,
    and no weight may change."""
    torch.set_num_threads(2)
    cfg = parse_config({
        "model": "minilm-l6", "method": "mask_train", "seed": 0,
        "task": {"name": "sst2", "max_train": 2000, "max_eval": 500, "max_length": 64},
        "train": {"max_steps": 150, "batch_size": 32, "eval_every": 150},
        "mask_train": {"pipeline": "prune_only", "sparsity": 0.5, "lr": 1e-3, "reset_every": 50},
    })
    result, store = run_chain(cfg)
    print(f"\nSST-2 mask_train prune_only 50 %: accuracy {result.metrics['accuracy']:.4f}, "
          f"sparsity {result.metrics['sparsity']:.4f}")
    assert result.metrics["accuracy"] >= 0.5 + 3 * 0.022
    assert result.metrics["sparsity"] == pytest.approx(0.5, abs=0.01)
    encoder, _ = load_backbone(cfg.model, derive_seed(cfg.seed, "model_init"))
    decoder = build_decoder(TASKS["sst2"], encoder.config.hidden_size, 2, cfg.seed)
    weights = store[cfg.run_key]
    assert all(torch.equal(weights[f"encoder.{k}"], v) for k, v in encoder.state_dict().items())
    assert all(torch.equal(weights[f"decoders.task.{k}"], v) for k, v in decoder.state_dict().items())
