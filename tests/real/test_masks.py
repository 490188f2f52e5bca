"""Mask training on the real pretrained MiniLM and real SST-2 (minutes): `make real`, not in `make test`."""

import pytest
import torch

from experiments import parse_config
from experiments.models import load_backbone
from experiments.tasks import TASKS
from experiments.training.seeding import derive_seed
from experiments.training.state import build_decoder

pytestmark = pytest.mark.real


@pytest.mark.timeout(1200)  # ~3 min on 2 quiet cores; 10 under a load of 8
def test_sst2_prune_only_learns_through_the_mask_alone(run_chain):
    """Liu et al.'s pipeline (c) as the reference scripts run it: masks on the frozen pretrained
    MiniLM, the pooler and a random classifier, masked and never trained. 2,000 training phrases,
    200 steps of 32; the score lr is 3e-4, not the reference's 5e-5 (at 5e-5 no weight flips
    before ~200 steps). At 1e-3 (this test until 2026-11-27) the run learns, then collapses: seed 1
    reached 0.75 at step 50 and predicted one class from step ~75 on (dev loss ln 2); seeds 1 and 2
    ended at 0.53 (the majority class), seed 0 at 0.74 here and 0.53 in CI: the number moved with the
    machine. At 3e-4 (measured 2026-11-27, 2 threads unless said): seed 0 0.842, seed 1 0.834,
    seed 2 0.856, seed 1 on 1 thread 0.830; 300 steps, seed 1: 0.53 at step 50, 0.82 at 100, 0.84 at 300.
    Dev accuracy must reach 0.70 at 50 % sparsity (chance 0.5; a collapsed run gives 0.53; on 500
    examples one standard error at 0.84 is 0.016: the measured runs sit 8 of them above 0.70), and
    no weight may change."""
    torch.set_num_threads(2)
    cfg = parse_config({
        "model": "minilm-l6", "method": "mask_train", "seed": 0,
        "task": {"name": "sst2", "max_train": 2000, "max_eval": 500, "max_length": 64},
        "train": {"max_steps": 200, "batch_size": 32, "eval_every": 200},
        "mask_train": {"pipeline": "prune_only", "sparsity": 0.5, "lr": 3e-4, "reset_every": 50},
    })
    result, store = run_chain(cfg)
    print(f"\nSST-2 mask_train prune_only 50 %: accuracy {result.metrics['accuracy']:.4f}, "
          f"sparsity {result.metrics['sparsity']:.4f}")
    assert result.metrics["accuracy"] >= 0.70
    assert result.metrics["sparsity"] == pytest.approx(0.5, abs=0.01)
    encoder, _ = load_backbone(cfg.model, derive_seed(cfg.seed, "model_init"))
    decoder = build_decoder(TASKS["sst2"], encoder.config.hidden_size, 2, cfg.seed)
    weights = store[cfg.run_key]
    assert all(torch.equal(weights[f"encoder.{k}"], v) for k, v in encoder.state_dict().items())
    assert all(torch.equal(weights[f"decoders.task.{k}"], v) for k, v in decoder.state_dict().items())
