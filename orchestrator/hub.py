"""Hub models, resolved once where a sweep is submitted, read by every trial from that cache.

A grid may name models by hub id (``google-bert/bert-base-uncased``, ``random:FacebookAI/roberta-base``)
and datasets by name (``task.hf``). headsweep never forces the hub offline. At submit
(:func:`resolve`), each hub model is looked up in the Hugging Face cache (``HF_HUB_CACHE``, else
``HF_HOME``'s, else ``~/.cache/huggingface/hub``) and downloaded into it when missing and the hub is
reachable: its config, tokenizer and PyTorch weights (safetensors, else ``pytorch_model*.bin``),
never the other frameworks' files. A model that is neither cached nor reachable is a one-line error
naming it, before anything runs. (Datasets by name are loaded by the grid's validation at submit
already, into ``datasets``' cache.)

The sweep's driver and trials then get :func:`trial_env`: the same cache paths and the hub offline,
so thousands of trials neither download nor ask the hub for updates, and a worker host without the
hub loads what the submitting host fetched. The caches must therefore be on a filesystem every node
reads (a shared home, as on SLURM clusters; or ``HF_HOME`` pointed at one).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from base.sections import ConfigError

WEIGHTS = ("*.safetensors", "pytorch_model*.bin")
PATTERNS = ("*.json", "*.txt", "*.model", "*.tiktoken")
"""Config, tokenizer and vocabulary files; the weights are WEIGHTS' first kind the repo has."""


def hub_models(configs: list[Any]) -> list[str]:
    """The hub ids among the runs' models (``model`` keys at any depth: stages and teachers too) of
    run configs (``RunConfig`` or their dicts), ``random:`` stripped (its config and tokenizer come
    from the hub), sorted."""
    from experiments.models import RANDOM_PREFIX, is_hub_id

    found: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                if key == "model" and isinstance(inner, str) and is_hub_id(inner.removeprefix(RANDOM_PREFIX)):
                    found.add(inner.removeprefix(RANDOM_PREFIX))
                else:
                    walk(inner)
        elif isinstance(value, list):
            for inner in value:
                walk(inner)

    walk([config.model_dump() if hasattr(config, "model_dump") else config for config in configs])
    return sorted(found)


def cache_dirs() -> dict[str, str]:
    """Where this process's Hugging Face libraries read and write (what the trials must read too)."""
    from huggingface_hub import constants

    dirs = {"HF_HUB_CACHE": constants.HF_HUB_CACHE}
    datasets_cache = os.environ.get("HF_DATASETS_CACHE") or os.path.join(constants.HF_HOME, "datasets")
    return dirs | {"HF_DATASETS_CACHE": datasets_cache}


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def _complete(folder: str) -> bool:
    """A snapshot with a config and PyTorch weights in it."""
    path = Path(folder)
    return (path / "config.json").is_file() and any(next(path.glob(pattern), None) for pattern in WEIGHTS)


def resolve_model(model_id: str) -> str:
    """The local snapshot folder of ``model_id``, downloaded first when it is not cached (and the hub
    is reachable); ConfigError in one line naming it when neither."""
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(model_id, local_files_only=True, allow_patterns=[*PATTERNS, *WEIGHTS])
        if _complete(folder):
            return folder
    except Exception:  # noqa: BLE001 - not cached (each library version names it differently)
        pass
    cache = cache_dirs()["HF_HUB_CACHE"]
    if _offline():
        raise ConfigError(f"model {model_id!r} is not in the hub cache ({cache}) and the hub is offline here "
                          "(HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE): unset it where the hub is reachable, or fill "
                          "that cache first")
    print(f"headsweep: downloading {model_id} from the hub into {cache} (once; the trials read it there)",
          file=sys.stderr, flush=True)
    try:
        folder = snapshot_download(model_id, allow_patterns=[*PATTERNS, WEIGHTS[0]])
        if not _complete(folder):  # no safetensors in the repo: its PyTorch bin files
            folder = snapshot_download(model_id, allow_patterns=[*PATTERNS, WEIGHTS[1]])
    except Exception as err:  # noqa: BLE001 - unreachable, unknown, gated: the message says which
        root = err
        while root.__cause__ is not None or root.__context__ is not None:  # what went wrong first
            root = root.__cause__ or root.__context__
        reason = f"{type(root).__name__}: {' '.join(str(root).split())}"[:200]
        raise ConfigError(f"model {model_id!r} is not in the hub cache ({cache}) and could not be downloaded: "
                          f"{reason}") from None
    if not _complete(folder):
        raise ConfigError(f"model {model_id!r}: the hub has no config.json with PyTorch weights "
                          "(safetensors or pytorch_model.bin) for it")
    return folder


def resolve(configs: list[Any]) -> dict[str, str]:
    """Every hub model of the runs resolved into the local cache; {id: snapshot folder}."""
    return {model_id: resolve_model(model_id) for model_id in hub_models(configs)}


def trial_env() -> dict[str, str]:
    """What the driver and its trials get: the caches the submit filled, and the hub offline (every
    hub model was resolved at submit; a dataset by name was loaded there by the grid's validation)."""
    return cache_dirs() | {"HF_HUB_OFFLINE": "1"}
