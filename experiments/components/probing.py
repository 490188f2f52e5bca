"""What the probe and attention-analysis methods share: the model to look at, the UD EWT folder,
and one pass of an encoder over sentences that hands back each sentence's padding-cropped
attention maps and head outputs as numpy arrays (the input of experiments/maths/probes.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import torch

from experiments.interventions.attention import head_contexts, record_attention
from experiments.maths.probes import crop
from experiments.models import load_backbone
from experiments.tasks.dependencies import UD_EWT
from experiments.tasks.parts import default_data_dir
from experiments.training.precision import autocast
from experiments.training.seeding import derive_seed


def ud_folder(path: str | None) -> Path:
    """The folder of the UD EWT CoNLL-U files: ``path``, else ``<$HEADSWEEP_DATA or ../shared/data>/ud_ewt``."""
    return Path(path).expanduser() if path else default_data_dir() / UD_EWT


def pretrained(cfg, device: str = "cpu"):
    """(encoder, tokenizer) the run's model starts from: ``cfg.model`` as ``set_up`` loads it (the
    'model_init' seed stream, so a ``random:`` model is the same random init), before any stage."""
    encoder, tokenizer = load_backbone(cfg.model, derive_seed(cfg.seed, "model_init"))
    return encoder.to(device), tokenizer


def stage_encoder(cfg, ctx):
    """(encoder, tokenizer) of the run's ``init_from`` stage if it has one (its final encoder
    weights only: gates, masks or decoders the upstream had are not applied), else the pretrained
    (or ``random:``) model itself."""
    from experiments.training.state import upstream_weights

    encoder, tokenizer = pretrained(cfg)
    if cfg.init_from is not None:
        weights = upstream_weights(cfg, ctx, "init_from")
        encoder.load_state_dict({k.removeprefix("encoder."): v for k, v in weights.items() if k.startswith("encoder.")})
    return encoder.to(ctx.device).eval(), tokenizer


def boundary_ids(tokenizer) -> list[int]:
    """Ids of the sentence-boundary tokens ([CLS]/[SEP], <s>/</s>): Kovaleva's vertical targets.
    Not [UNK], [MASK] or padding."""
    names = ("cls_token_id", "sep_token_id", "bos_token_id", "eos_token_id")
    return sorted({i for i in (getattr(tokenizer, n, None) for n in names) if i is not None})


@torch.no_grad()
def sentence_maps(encoder, input_ids: torch.Tensor, attention_mask: torch.Tensor, batch_size: int, device: str,
                  attention: bool = True, contexts: bool = False,
                  precision: str = "fp32") -> Iterator[tuple[int, np.ndarray | None, np.ndarray | None]]:
    """Run ``encoder`` (eval mode) over (N, T) examples in batches; yield per example, in order,
    ``(index, attn, heads)``: ``attn`` (L, H, n, n) float32, the post-softmax attention over its
    n real tokens (``attention``), and ``heads`` (n, L, H, D) float32, each head's output before
    the output projection at each real token (``contexts``); None for what was not asked.
    The forward runs in ``precision`` (``train.precision``); what it records is cast to float32."""
    encoder.eval()
    for start in range(0, len(input_ids), batch_size):
        mask = attention_mask[start : start + batch_size]
        length = int(mask.sum(dim=1).max())
        ids, mask = input_ids[start : start + batch_size, :length], mask[:, :length]
        with ExitStack() as stack:
            probs = stack.enter_context(record_attention(encoder)) if attention else None
            outputs = stack.enter_context(head_contexts(encoder)) if contexts else None
            with autocast(precision, device):
                encoder(input_ids=ids.to(device), attention_mask=mask.to(device))
        attn = torch.stack(probs, dim=1).float().cpu().numpy() if attention else None  # (B, L, H, T, T)
        heads = torch.stack(outputs, dim=2).float().cpu().numpy() if contexts else None  # (B, T, L, H, D)
        for b in range(len(ids)):
            real = mask[b].numpy()
            yield (start + b,
                   crop(attn[b], real) if attention else None,
                   heads[b][np.flatnonzero(real)] if contexts else None)
