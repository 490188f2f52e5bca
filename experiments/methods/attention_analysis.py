"""What fine-tuning did to attention, and what roles heads play (Kovaleva et al. 2019; Voita et al. 2019).

Looks at a fine-tuned model: the ``init_from`` stage, by default a ``finetune`` run of the same
model, task, seed and training settings (``finetune_steps`` steps if set), shared with every
other method that starts from it; a config's own ``init_from`` wins. Nothing is trained.

On the task's dev set (its first ``eval_examples``; Kovaleva et al.):

- ``heads.attention_change``: per head, the cosine similarity between the flattened attention
  maps of the pretrained model (``cfg.model`` as ``set_up`` loads it, the same ``random:`` init)
  and the fine-tuned one, padding cropped, averaged over examples (1 = unchanged). The
  reference (dark-secrets-of-BERT, visualize_attention.ipynb) compares whole maps of examples
  padded to ``max_len`` (200) tokens, padding rows included, which pulls every head towards 1 by
  an amount that depends on the sentence lengths: ``attention_change_length: 200`` does that
  (``REFERENCE``);
- ``heads.cls_sep_share``: the fine-tuned model's attention on [CLS]/[SEP] (<s>/</s>), mean over
  queries and examples;
- ``heads.pattern_<type>``: the share of examples whose map the rule of
  ``experiments.maths.probes.classify_patterns`` calls vertical, diagonal, vertical_diagonal,
  block or heterogeneous (a documented stand-in for the paper's CNN). Only sentence pairs can
  be blocks: a task without pairs reports no ``heads.pattern_block``.

On UD EWT test sentences (``sentences`` of them, ``task.data_seed``'s draw; Voita et al.), the
fine-tuned model, words at their first subword:

- ``heads.confidence``: the mean over tokens of the largest attention weight;
- ``heads.positional``: the larger of the shares of tokens whose argmax is the previous / the
  next token (positional when >= 0.9; ``positional_heads`` counts them);
- ``heads.syntactic.<rel>``: for each relation in ``relations``, the share of its arcs whose
  dependent attends most to its head; ``heads.syntactic.<rel>.reverse`` the head to the
  dependent. Metrics ``syntactic/<rel>`` (best head), ``syntactic_reverse/<rel>`` and
  ``syntactic_baseline/<rel>``: Voita's positional baseline, the share of that relation's arcs
  at its most frequent word offset;
- ``heads.rare_word``: the share of sentences whose most-attended word (the most attention
  received over its subwords, averaged over all queries; [CLS]/[SEP] are not words) is one of
  the sentence's least frequent words (lower-cased word counts over the whole UD EWT dev file;
  unseen = 0). Sentences whose words all tie are left out.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch
from pydantic import Field

from base import outputs
from base.naming import suggest
from base.result import RunResult
from base.sections import Section
from experiments.components.finetuning import finetune_stage
from experiments.components.probing import boundary_ids, pretrained, sentence_maps, ud_folder
from experiments.interventions.attention import record_attention
from experiments.maths.probes import (
    PATTERNS,
    POSITIONAL_THRESHOLD,
    argmax_offsets,
    attention_cosine,
    classify_patterns,
    confidence,
    directed_hits,
    label_rates,
    most_attended_word,
    pattern_masses,
    positional,
    positional_baseline,
    rarest_words,
    row_argmax,
    segments,
)
from experiments.tasks.dependencies import FILES, UD_RELATIONS, arcs, load_ud_ewt, read_trees
from experiments.training.context import RunContext
from experiments.training.precision import autocast
from experiments.training.reads import FORWARDS
from experiments.training.state import set_up

VERSION = "1"
PIPELINES = ("none",)
SHORT_NAMES = ()
READS = FORWARDS
"""The ``train.*`` keys its own code reads (experiments/training/reads.py): forwards only, in its own batches;
its finetune stage reads the rest."""
OUTPUTS = outputs.Outputs(
    maps=(outputs.ATTENTION_CHANGE, outputs.CLS_SEP_SHARE, outputs.PATTERN, outputs.CONFIDENCE, outputs.POSITIONAL,
          outputs.SYNTACTIC, outputs.RARE_WORD),
    metrics=tuple(outputs.Metric(n, f"over heads: {n.replace('_', ' ')} (mean, or the best head; /<pattern|relation>)")
                  for n in ("attention_change", "cls_sep_share", "pattern", "confidence", "positional_heads",
                            "syntactic", "syntactic_reverse", "syntactic_baseline", "rare_word")))
"""What its runs report (base.outputs)."""
REFERENCE = {"attention_change_length": 200}
"""The reference notebook pads every example to max_len = 200 and compares the whole maps."""


class Config(Section):
    """attention_analysis' own keys: ``attention_analysis: {eval_examples: 500, relations: [nsubj, obj]}``."""

    eval_examples: int | None = Field(500, gt=0, description="Task dev examples for attention change, [CLS]/[SEP] share and patterns (None = all).")
    sentences: int | None = Field(500, gt=0, description="UD EWT test sentences for Voita's head roles (None = all).")
    max_length: int = Field(128, ge=8, le=512, description="UD EWT: tokens per sentence after truncation (words cut off are dropped).")
    relations: tuple[str, ...] = Field(("nsubj", "obj", "amod", "advmod"), min_length=1,
                                       description="Universal dependency relations with a syntactic-head map each.")
    batch_size: int = Field(32, gt=0, le=4096, description="Examples per forward pass.")
    ud_dir: str | None = Field(None, description="Folder of en_ewt-ud-{dev,test}.conllu; None = <$HEADSWEEP_DATA or ../shared/data>/ud_ewt.")
    finetune_steps: int | None = Field(None, gt=0, description="Training steps of the fine-tune it looks at (None = the same train settings).")
    attention_change_length: int | None = Field(
        None, ge=8, le=512, description="Attention change: None = each example's maps cropped to its real tokens "
        "(padding says nothing about fine-tuning); N = every example padded (or cut) to N tokens and the whole "
        "N x N maps compared, padding rows included: the reference's protocol at N = 200 (Kovaleva et al.'s notebook).")


def stages(section: Config) -> dict[str, dict]:
    """A fine-tuned model to look at: a ``finetune`` run of the same model, task, seed and training
    settings (shared with head_gates' SP and the other analyses that start from it)."""
    return finetune_stage(section.finetune_steps)


def check(cfg) -> None:
    for rel in cfg.section.relations:
        if rel not in UD_RELATIONS or rel == "root":
            raise ValueError(f"attention_analysis.relations: '{rel}' is not a universal dependency relation with a head word"
                             f"{suggest(rel, UD_RELATIONS)}")


def run(cfg, ctx: RunContext) -> RunResult:
    own = cfg.section
    state = set_up(cfg, ctx)  # the fine-tuned model (init_from)
    tuned = state.encoder
    base, tokenizer = pretrained(cfg, ctx.device)
    up = cfg.upstreams["init_from"]
    model = f"{cfg.model} after {up.method} on {up.task.name}"
    maps, metrics = {}, {}
    _kovaleva(maps, metrics, tuned, base, state.data.dev, boundary_ids(tokenizer), own, ctx.device,
              f"{cfg.task.name} dev", model, state.precision, tokenizer.pad_token_id or 0)
    _voita(maps, metrics, tuned, tokenizer, own, cfg.task.data_seed, ctx.device, model, state.precision)
    return RunResult(run_key=cfg.run_key, group_key=cfg.group_key, metrics=metrics, maps=maps)


@torch.no_grad()
def padded_attention_change(base, tuned, input_ids: torch.Tensor, attention_mask: torch.Tensor, length: int,
                            pad_id: int, batch_size: int, device: str, precision: str = "fp32") -> np.ndarray:
    """(L, H) mean over examples of the cosine between the two models' whole attention maps of
    each example padded (or cut) to ``length`` tokens, padding rows and columns included: the
    reference notebook's protocol (``convert_to_bert_inputs(..., max_len)``, then
    ``cosine_similarity(base.view(L, H, -1), tuned.view(L, H, -1))``)."""
    n, t = input_ids.shape
    ids = torch.full((n, length), pad_id, dtype=input_ids.dtype)
    mask = torch.zeros((n, length), dtype=attention_mask.dtype)
    ids[:, : min(t, length)], mask[:, : min(t, length)] = input_ids[:, :length], attention_mask[:, :length]
    total = 0.0
    for start in range(0, n, batch_size):
        maps = []
        for encoder in (base, tuned):
            encoder.eval()
            with record_attention(encoder) as probs, autocast(precision, device):
                encoder(input_ids=ids[start : start + batch_size].to(device),
                        attention_mask=mask[start : start + batch_size].to(device))
            maps.append(torch.stack(probs, dim=1).float().cpu().numpy())  # (B, L, H, N, N)
        total = total + sum(attention_cosine(a, b) for a, b in zip(*maps, strict=True))
    return total / n


def _kovaleva(maps, metrics, tuned, base, dev, boundary, own, device, split, model, precision="fp32",
              pad_id: int = 0) -> None:
    """attention_change, cls_sep_share and pattern_<type> on the task's dev examples (forwards in
    ``precision``, maps read as float32)."""
    n = len(dev) if own.eval_examples is None else min(own.eval_examples, len(dev))
    where = f"{split}, {n} examples, {model}"
    ids, mask = dev.input_ids[:n], dev.attention_mask[:n]
    cosine, special_share, counts, pairs = 0.0, 0.0, 0.0, 0
    if own.attention_change_length is not None:
        cosine = padded_attention_change(base, tuned, ids, mask, own.attention_change_length, pad_id,
                                         own.batch_size, device, precision) * n
    for (i, after, _), (_, before, _) in zip(sentence_maps(tuned, ids, mask, own.batch_size, device, precision=precision),
                                             sentence_maps(base, ids, mask, own.batch_size, device, precision=precision),
                                             strict=True):
        if own.attention_change_length is None:
            cosine = cosine + attention_cosine(before, after)
        special = np.isin(ids[i][mask[i].bool()].numpy(), boundary)  # (n,)
        masses = pattern_masses(after, special)
        special_share = special_share + masses["special"]
        pair = np.unique(segments(special)[~special]).size >= 2
        pairs += pair
        counts = counts + (classify_patterns(masses, pair)[..., None] == np.arange(len(PATTERNS)))  # (L, H, 5)
    padded = ("" if own.attention_change_length is None
              else f", maps padded to {own.attention_change_length} tokens (the reference's protocol)")
    maps |= [outputs.ATTENTION_CHANGE(cosine / n, f"{where}: {outputs.ATTENTION_CHANGE.meaning}{padded}"),
             outputs.CLS_SEP_SHARE(special_share / n, f"{where}: {outputs.CLS_SEP_SHARE.meaning}")]
    for k, pattern in enumerate(PATTERNS):
        if pattern == "block" and not pairs:  # single sentences: no map can be a block
            continue
        maps |= [outputs.PATTERN(counts[..., k] / n, f"{where}: share of examples with a {pattern} attention map (rule)",
                                 pattern)]
        metrics[f"pattern/{pattern}"] = float(counts[..., k].mean() / n)
    metrics["attention_change"] = float(maps[outputs.ATTENTION_CHANGE.name].values.mean())
    metrics["cls_sep_share"] = float(maps[outputs.CLS_SEP_SHARE.name].values.mean())


def _voita(maps, metrics, tuned, tokenizer, own, data_seed, device, model, precision="fp32") -> None:
    """confidence, positional, syntactic.<rel> (and .reverse) and rare_word on UD EWT test sentences
    (forwards in ``precision``, maps read as float32)."""
    folder = ud_folder(own.ud_dir)
    frequency = Counter(w.lower() for tree in read_trees(folder / FILES["train"]) for w in tree.words)
    data = load_ud_ewt(folder, "dev", tokenizer, own.max_length, own.sentences, data_seed)
    wanted = set(own.relations)
    row_max, offsets, to_head, to_dependent, relations, word_offsets, rare = [], [], [], [], [], [], []
    for i, attn, _ in sentence_maps(tuned, data.input_ids, data.attention_mask, own.batch_size, device,
                                    precision=precision):
        argmax = row_argmax(attn)  # (L, H, n)
        row_max.append(attn.max(axis=-1))
        offsets.append(argmax_offsets(argmax))
        first, end = data.first[i], data.end[i]
        dependents, governors, rels = arcs(data.trees[i], len(first))
        keep = np.array([r in wanted for r in rels], dtype=bool)
        dependents, governors = dependents[keep], governors[keep]
        to_head.append(directed_hits(argmax, first[dependents], first[governors]))
        to_dependent.append(directed_hits(argmax, first[governors], first[dependents]))
        relations += [r for r, k in zip(rels, keep, strict=True) if k]
        word_offsets += (governors - dependents).tolist()
        counts = [frequency[w.lower()] for w in data.trees[i].words[: len(first)]]
        rarest = rarest_words(counts)
        if len(rarest) < len(counts):
            rare.append(np.isin(most_attended_word(attn, first, end), rarest))  # (L, H)
    where = f"UD EWT test, {len(data)} sentences, {model}"
    maps |= [outputs.CONFIDENCE(confidence(np.concatenate(row_max, -1)), f"{where}: {outputs.CONFIDENCE.meaning}")]
    prev, nxt = positional(np.concatenate(offsets, -1))
    maps |= [outputs.POSITIONAL(np.maximum(prev, nxt), f"{where}: share of tokens whose argmax is the previous or "
                                                       f"(if more) the next token (positional >= {POSITIONAL_THRESHOLD})")]
    metrics["confidence"] = float(maps[outputs.CONFIDENCE.name].values.mean())
    metrics["positional_heads"] = float((maps[outputs.POSITIONAL.name].values >= POSITIONAL_THRESHOLD).sum())
    forward = label_rates(np.concatenate(to_head, -1), relations)
    backward = label_rates(np.concatenate(to_dependent, -1), relations)
    baseline = positional_baseline(word_offsets, relations)
    for rel in own.relations:
        if rel not in forward:  # no arc of it in these sentences
            continue
        maps |= [outputs.SYNTACTIC(forward[rel], f"{where}: share of {rel} arcs where the dependent attends most to its "
                                                 "head", rel),
                 outputs.SYNTACTIC(backward[rel], f"{where}: share of {rel} arcs where the head attends most to its "
                                                  "dependent", f"{rel}.reverse")]
        metrics[f"syntactic/{rel}"] = float(forward[rel].max())
        metrics[f"syntactic_reverse/{rel}"] = float(backward[rel].max())
        metrics[f"syntactic_baseline/{rel}"] = baseline[rel][1]
    if rare:
        maps |= [outputs.RARE_WORD(np.mean(rare, axis=0), f"{where}: {outputs.RARE_WORD.meaning}")]
        metrics["rare_word"] = float(maps[outputs.RARE_WORD.name].values.max())
