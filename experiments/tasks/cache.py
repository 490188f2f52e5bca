"""A task's tokenised data, kept on disk by content hash: every run of a grid tokenises it once.

:func:`load_task` is how a run loads its task: a task's ``load`` (read, subset, tokenise) runs only
when no run before it loaded the same data with the same tokenizer. The key (:func:`data_key`)
hashes what the tensors depend on:

- the task config (every key: files, columns, ``max_length``, ``max_train`` / ``max_eval``,
  ``data_seed``, a generated task's sizes), the task's name and ``VERSION``;
- the data's content: the task's ``fingerprint`` (the sha256 of every file it reads; None for
  generated data, which the config and the code below determine);
- the tokenizer: its class and whole pipeline (normaliser, pre-tokeniser, vocabulary,
  post-processor, added tokens, padding and truncation sides), not its name;
- the code that reads and tokenises (the sources of ``experiments/tasks``) and ``FORMAT``.

So a changed file, tokenizer or reader is a new key, never a stale hit. The files live in
``$HEADSWEEP_HOME/cache/tasks`` (``CACHE_ENV`` is where a sweep's trials find their home); without
it nothing is cached. Writes are atomic (a temporary file renamed), so runs of a grid that load
at once never read half a file; the last writer wins with the same bytes. Nothing evicts: delete
the folder whenever. Integer tensors are kept as int32 (half the bytes) and come back as int64.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any

import torch

from base.costs import timed
from base.sources import hash_sources
from experiments.tasks import get_task
from experiments.tasks.parts import Split, TaskData

FORMAT = "1"
"""Bump when the stored layout changes."""
CACHE_ENV = "HEADSWEEP_HOME"
log = logging.getLogger("headsweep.tasks")


def load_task(cfg, tokenizer) -> TaskData:
    """The task data of task config ``cfg`` tokenised by ``tokenizer``: from the disk cache when a
    run loaded it before, else the task's ``load`` (then kept). Timed as the run's ``data`` part."""
    with timed("data"):
        module = get_task(cfg.name)
        folder = cache_folder()
        if folder is None:
            return module.load(cfg, tokenizer)
        path = folder / f"{data_key(cfg, tokenizer)}.pt"
        if path.is_file():
            try:
                return _from_stored(torch.load(path, weights_only=True))
            except Exception as err:  # noqa: BLE001 - an unreadable entry is rebuilt, never fatal
                log.warning("task data cache: %s unreadable (%s); tokenising again", path, type(err).__name__)
        data = module.load(cfg, tokenizer)
        try:
            _write_atomically(path, _to_stored(data))
        except OSError as err:  # a full or read-only disk: the run goes on uncached
            log.warning("task data cache: could not write %s (%s)", path, err)
        return data


def cache_folder() -> Path | None:
    """``$HEADSWEEP_HOME/cache/tasks`` (created), or None when ``HEADSWEEP_HOME`` is unset."""
    home = os.environ.get(CACHE_ENV)
    if not home:
        return None
    folder = Path(home).expanduser() / "cache" / "tasks"
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def data_key(cfg, tokenizer) -> str:
    """sha256 (32 hex) of everything the tokenised data of ``cfg`` depends on (module docstring)."""
    module = get_task(cfg.name)
    material = {
        "format": FORMAT,
        "code": _tasks_source_hash(),
        "task": cfg.name,
        "version": module.VERSION,
        "config": cfg.model_dump(mode="json"),
        "content": module.fingerprint(cfg),
        "tokenizer": tokenizer_fingerprint(tokenizer),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:32]


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 (16 hex) of what turns text into ids: the class, the padding and truncation sides, and
    a fast tokenizer's pipeline (normaliser, pre-tokeniser, model with its vocabulary, post-processor,
    decoder: each as ``tokenizers`` serialises it) with its added tokens, or else its vocabulary and
    init arguments. Not the truncation and padding that each call sets. ~2 ms for MiniLM's (its
    whole JSON, re-serialised without them, took 15-50 ms: more than tokenising a tiny task)."""
    digest = hashlib.sha256(f"{type(tokenizer).__name__}\0{tokenizer.padding_side}\0{tokenizer.truncation_side}".encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        digest.update(json.dumps([sorted(tokenizer.get_vocab().items()), tokenizer.init_kwargs], default=str).encode())
        return digest.hexdigest()[:16]
    for component in ("normalizer", "pre_tokenizer", "model", "post_processor", "decoder"):
        part = getattr(backend, component)
        digest.update(b"\0" + (part.__getstate__() if part is not None else b"none"))
    digest.update(repr(sorted(backend.get_added_tokens_decoder().items())).encode())
    return digest.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def _tasks_source_hash() -> str:
    """sha256 of this package's sources: a reader or tokenising change is a new key even without a VERSION bump."""
    digest = hashlib.sha256()
    hash_sources(digest, Path(__file__).parent, "tasks")
    return digest.hexdigest()[:16]


# --------------------------------------------------------------------------- stored form


def _to_stored(data: TaskData) -> dict[str, Any]:
    """TaskData as plain dicts and tensors (``torch.load(weights_only=True)`` reads them back)."""
    splits = {"train": data.train, "dev": data.dev} | {f"eval_sets.{k}": v for k, v in data.eval_sets.items()}
    return {
        "splits": {name: {field: _narrow(getattr(split, field)) for field in _FIELDS} for name, split in splits.items()},
        "num_labels": data.num_labels,
        "label_names": list(data.label_names),
    }


def _from_stored(stored: dict[str, Any]) -> TaskData:
    splits = {name: Split(**{field: _widen(value) for field, value in fields.items()})
              for name, fields in stored["splits"].items()}
    return TaskData(
        train=splits.pop("train"), dev=splits.pop("dev"), num_labels=stored["num_labels"],
        label_names=tuple(stored["label_names"]),
        eval_sets={name.removeprefix("eval_sets."): split for name, split in splits.items()},
    )


_FIELDS = ("input_ids", "attention_mask", "labels", "features")


def _narrow(tensor: torch.Tensor | None) -> torch.Tensor | None:
    """int64 -> int32 for storage (token ids, masks and labels all fit)."""
    return tensor.to(torch.int32) if tensor is not None and tensor.dtype == torch.int64 else tensor


def _widen(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return tensor.to(torch.int64) if tensor is not None and tensor.dtype == torch.int32 else tensor


def _write_atomically(path: Path, stored: dict[str, Any]) -> None:
    """Write to a temporary file beside ``path``, then rename it over ``path`` (atomic on POSIX)."""
    partial = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        torch.save(stored, partial)
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
