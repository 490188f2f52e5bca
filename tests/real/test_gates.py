"""Head gates on the real pretrained MiniLM and real SST-2 (minutes): `make real`, not in `make test`."""

import pytest
import torch

from experiments import parse_config, run
from orchestrator.cli import load_yaml

pytestmark = pytest.mark.real


def test_sst2_dp_gates_keep_accuracy_with_fewer_heads():
    """MiniLM, SST-2, 3,000 training phrases, one epoch, DP gates: dev accuracy >= 0.80, < 72 heads."""
    torch.set_num_threads(2)
    cfg = parse_config(load_yaml("examples/run_sst2_gates.yaml"))
    result = run(cfg)
    print(f"\nSST-2 DP gates: accuracy {result.metrics['accuracy']:.4f}, open heads {result.metrics['open_heads']:.0f}")
    assert result.metrics["accuracy"] >= 0.80
    assert result.metrics["open_heads"] < 72
