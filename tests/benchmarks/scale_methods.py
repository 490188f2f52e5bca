"""``gpu_sleep``: the scale runs' plug-in method (named in ``HEADSWEEP_METHODS``, shipped with the job).

It trains nothing: it sleeps a seeded time between ``min_s`` and ``max_s`` and records where
and when it ran, one JSON line at its start and one at its end, appended to
``$HEADSWEEP_HOME/where.jsonl`` (lines under 4 KiB appended with O_APPEND are not interleaved):
the Ray node id and address, ``CUDA_VISIBLE_DEVICES`` (the logical GPU ids Ray gave the
trial), the process and ``time.time()``. An attempt killed with its node has a start and no
end. tests/benchmarks/scale_gpus.py reads the lines.
"""

from __future__ import annotations

import json
import os
import time
import uuid

import numpy as np
from pydantic import Field

from base.result import RunResult, UnitMap
from base.sections import Section
from experiments.training.seeding import derive_seed

NAME = "gpu_sleep"
VERSION = "1"
PIPELINES = ("sleep",)
SHORT_NAMES = ("min_s", "max_s")
RECORD = "where.jsonl"


class Config(Section):
    """``gpu_sleep: {min_s: 0.2, max_s: 1.0}``."""

    min_s: float = Field(0.2, ge=0, description="Shortest sleep, seconds.")
    max_s: float = Field(1.0, ge=0, description="Longest sleep, seconds.")


def _record(line: dict) -> None:
    with open(os.path.join(os.environ["HEADSWEEP_HOME"], RECORD), "a") as out:
        out.write(json.dumps(line) + "\n")


def run(cfg, ctx) -> RunResult:
    import ray  # the trial runs on Ray: where it runs is the point

    hp = cfg.section
    seconds = hp.min_s + (hp.max_s - hp.min_s) * np.random.default_rng(derive_seed(cfg.seed, "sleep")).random()
    where = {"run_key": cfg.run_key, "attempt": uuid.uuid4().hex, "node": ray.get_runtime_context().get_node_id(),
             "ip": ray.util.get_node_ip_address(), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
             "pid": os.getpid()}
    _record(where | {"event": "start", "t": time.time()})
    time.sleep(seconds)
    _record(where | {"event": "end", "t": time.time()})
    return RunResult(
        run_key=cfg.run_key, group_key=cfg.group_key, metrics={"slept_s": seconds},
        maps={"heads.sleep": UnitMap(np.zeros((1, 1), dtype=np.float32), "heads", "nothing: a placeholder")},
        steps=1,
    )
