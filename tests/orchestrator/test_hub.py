"""Hub ids resolved at submit (orchestrator/hub.py), without any network: a hub-layout cache built
from the shipped MiniLM under a hub-style id, and the one-line error for an id neither cached nor
reachable. Each test runs the Hugging Face libraries in a child process: they read HF_HUB_CACHE and
HF_HUB_OFFLINE when first imported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.models import is_hub_id

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from hub_caches import DATASET_ID, MODEL_ID, dataset_cache, hub_cache  # noqa: E402  (tests/hub_caches.py)


def _in_child(code: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {name: value for name, value in os.environ.items() if not name.startswith(("HF_", "TRANSFORMERS_"))}
    return subprocess.run([sys.executable, "-c", code], env=clean | env, capture_output=True, text=True, timeout=300)


RESOLVE = """
import json, sys
from base.sections import ConfigError
from orchestrator import hub
configs = json.loads(sys.argv[1]) if len(sys.argv) > 1 else []
try:
    print(json.dumps({"resolved": hub.resolve(configs), "env": hub.trial_env()}))
except ConfigError as err:
    print(json.dumps({"error": str(err)}))
"""


def _resolve(configs, env) -> dict:
    done = subprocess.run([sys.executable, "-c", RESOLVE, json.dumps(configs)], capture_output=True, text=True,
                          timeout=300, env={k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))} | env)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_hub_ids_are_told_from_the_models_headsweep_knows(tmp_path):
    from orchestrator.hub import hub_models

    assert is_hub_id("google-bert/bert-base-uncased") and is_hub_id(MODEL_ID)
    assert not is_hub_id("minilm-l6") and not is_hub_id("tiny-bert") and not is_hub_id(str(tmp_path))
    configs = [{"model": "tiny-bert"}, {"model": "random:FacebookAI/roberta-base"},
               {"model": "minilm-l6", "init_from": {"model": MODEL_ID}}, {"teacher": [{"model": MODEL_ID}]}]
    assert hub_models(configs) == ["FacebookAI/roberta-base", MODEL_ID]
    from orchestrator.driving.grid import (  # what submit hands it: validated RunConfigs
        expand,
        parse_grid,
    )

    grid = parse_grid({"name": "g", "base": {"model": "tiny-bert", "task": {"name": "synthetic-cls"}},
                       "axes": {"model": ["tiny-bert", MODEL_ID, "random:org/other"]}})
    assert hub_models(expand(grid)) == [MODEL_ID, "org/other"]


def test_a_cached_hub_model_resolves_offline_and_loads_from_the_cache(tmp_path):
    """No network, the hub offline: the id resolves to its snapshot, the trials get the same cache
    and the hub offline, and transformers loads weights and tokenizer from it (0 missing keys)."""
    cache = hub_cache(tmp_path / "hub")
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    said = _resolve([{"model": MODEL_ID}, {"model": "tiny-bert"}], env)
    assert list(said["resolved"]) == [MODEL_ID]
    assert said["resolved"][MODEL_ID].startswith(str(cache / "models--headsweep-test--minilm-l6" / "snapshots"))
    assert said["env"]["HF_HUB_CACHE"] == str(cache) and said["env"]["HF_HUB_OFFLINE"] == "1"
    load = _in_child(
        "from experiments.models import load_backbone\n"
        f"model, tokenizer = load_backbone({MODEL_ID!r}, 0)\n"
        "print(model.config.num_hidden_layers, model.config.num_attention_heads, tokenizer('a b')['input_ids'][:1])",
        said["env"])
    assert load.returncode == 0, load.stderr[-2000:]
    assert load.stdout.split()[:3] == ["6", "12", "[101]"]


def test_an_id_neither_cached_nor_reachable_is_one_line_naming_it(tmp_path):
    """Offline by the user's choice, or a hub that cannot be reached (here: no network at all, and
    an endpoint nobody listens on): one line, naming the id and the cache looked in."""
    cache = hub_cache(tmp_path / "hub")
    offline = _resolve([{"model": "no-such-org/no-such-model"}], {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})
    assert offline["error"] == (f"model 'no-such-org/no-such-model' is not in the hub cache ({cache}) and the hub is "
                                "offline here (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE): unset it where the hub is "
                                "reachable, or fill that cache first")
    unreachable = _resolve([{"model": "no-such-org/no-such-model"}],
                           {"HF_HUB_CACHE": str(cache), "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_ETAG_TIMEOUT": "5",
                            "HF_HUB_DOWNLOAD_TIMEOUT": "5"})
    assert unreachable["error"].startswith(f"model 'no-such-org/no-such-model' is not in the hub cache ({cache}) "
                                           "and could not be downloaded: ")
    assert "\n" not in unreachable["error"]


@pytest.mark.parametrize("missing", ["config.json", "model.safetensors"])
def test_a_cached_snapshot_without_config_or_weights_is_not_taken_as_resolved(tmp_path, missing):
    cache = hub_cache(tmp_path / "hub")
    next((cache / "models--headsweep-test--minilm-l6" / "snapshots").iterdir()).joinpath(missing).unlink()
    said = _resolve([{"model": MODEL_ID}], {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})
    assert said["error"].startswith(f"model '{MODEL_ID}' is not in the hub cache")


def test_a_dataset_by_name_loads_offline_from_a_filled_cache(tmp_path):
    """The cache a submit with the hub leaves (made here without one) is what trials read offline."""
    cache = dataset_cache(tmp_path / "datasets", [{"sentence": "good", "label": 1}, {"sentence": "bad", "label": 0}])
    load = _in_child(f"import datasets; d = datasets.load_dataset({DATASET_ID!r}, split='validation'); print(d.num_rows, d[0])",
                     {"HF_DATASETS_CACHE": str(cache), "HF_HUB_OFFLINE": "1"})
    assert load.returncode == 0, load.stderr[-2000:]
    assert load.stdout.strip() == "2 {'sentence': 'good', 'label': 1}"


RESUME = """
import sys
from base.sections import ConfigError
from orchestrator import settings
from orchestrator.driving import sweeps
from orchestrator.driving.grid import expand, parse_grid
from orchestrator.registry import Registry
spec = parse_grid({"name": "resume-hub", "base": {"model": sys.argv[1], "task": "synthetic-cls"}, "axes": {"seed": [0, 1]}})
registry = Registry(settings.registry_url())
sweep_id, _ = registry.create_sweep(spec.name, "", expand(spec), {"cpus": 1}, 1, 0)
try:
    sweeps.resume(sweep_id)
    print("resumed")
except ConfigError as err:
    print("error:", err)
"""


def test_a_resume_resolves_the_hub_models_again(tmp_path):
    """A sweep resumed on a host (or after a cache clean) whose cache lacks its hub model: the resume
    stops with submit's one line, before any driver starts (the trials, offline, would fail one by one)."""
    cache = hub_cache(tmp_path / "hub")
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "HEADSWEEP_HOME": str(tmp_path / "home")}
    done = _in_child(RESUME.replace("sys.argv[1]", repr("no-such-org/no-model")), env)
    assert done.stdout.strip().splitlines()[-1:] == [
        f"error: model 'no-such-org/no-model' is not in the hub cache ({cache}) and the hub is offline here "
        "(HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE): unset it where the hub is reachable, or fill that cache first"], \
        done.stderr[-2000:]
