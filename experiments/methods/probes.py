"""He & Choi's (2021) "stem cell" probes: what each head knows about syntax, without parameters.

Runs on the model of the config's ``init_from`` stage when it has one (``init_from: {method:
finetune}``, a ``multitask`` run, ...; its encoder weights only), else on the pretrained model
itself (or the ``random:`` init: the pretraining control). Nothing is trained, so the same
numbers compare pretrained, single-task and multi-task models directly.

Data: UD English-EWT, as the ``ud-pos`` task splits it: UD's test file is the scored data
(``score_sentences`` of it), UD's dev file the fitting data of the centroids (``fit_sentences``);
both subsets drawn from ``task.data_seed``, tokenised to ``max_length`` (words cut off dropped).

Both probes read words as the reference code (emorynlp/stem-cell-hypothesis) pools them:

- Dependency attention probe (``heads.dep_probe``): each head's attention of a scored sentence
  is pooled to words (a query word's row: the mean of its subwords' rows; a key word's column:
  the sum of its subwords' columns; elit/components/mtl/head_mtl.py:151-159), with ROOT = the
  first token ([CLS], <s>) as word 0 and [SEP] left out. For every arc (head h, dependent d),
  root arcs included (h = ROOT), ``1(argmax a[d] = h or argmax a[h] = d)`` (head/dep.py:156-170),
  averaged over all arcs and per universal relation (``heads.dep_probe.<rel>``, ``nsubj:pass``
  counted as ``nsubj``, ``root`` for the root arcs).
- Centroid probe (``heads.pos_centroid``): a head's feature for a word is its slice of the
  attention output before the output projection (D values), averaged over the word's subwords
  (head_mtl.py:216-223); per head, the mean feature of each UPOS is that tag's centroid, and each
  scored word gets the tag of the centroid of highest cosine similarity (head/pos.py:157-182).
  Centroids come from the fitting sentences (``centroids_from: fit``, held out: what a head
  encodes beyond the words it is scored on); the reference fits them on the very words it
  scores (``centroids_from: scored``, see ``REFERENCE``). Accuracy over all scored words, and per
  tag (``heads.pos_centroid.<UPOS>``: the share of that tag's words labelled right).

Per-label maps and metrics for the ``top_labels`` most frequent relations / tags of the scored
data. Metrics: the best head's score, ``dep_probe`` and ``dep_probe/<rel>``, ``pos_centroid``
and ``pos_centroid/<UPOS>``; and ``majority/<probe>``, the share of the most frequent tag (the
centroid probe's floor).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Literal

import numpy as np
from pydantic import Field

from base import outputs
from base.result import RunResult
from base.sections import Section
from experiments.components.probing import sentence_maps, stage_encoder, ud_folder
from experiments.maths.probes import (
    class_centroids,
    dep_probe_hits,
    label_accuracy,
    label_rates,
    nearest_centroid,
    row_argmax,
    word_attention,
    word_means,
)
from experiments.tasks.dependencies import EncodedTrees, arcs, load_ud_ewt
from experiments.tasks.ud_pos import LABEL_NAMES as UPOS
from experiments.training.context import RunContext

VERSION = "2"
PIPELINES = ("none",)
SHORT_NAMES = ()
READS = ("precision",)
"""The ``train.*`` keys its own code reads (experiments/training/reads.py): forwards only; an init_from stage
reads the rest."""
OUTPUTS = outputs.Outputs(
    maps=(outputs.DEP_PROBE, outputs.POS_CENTROID),
    metrics=(outputs.Metric("dep_probe", "the best head's DEP probe score (/<relation>: on that relation)"),
             outputs.Metric("pos_centroid", "the best head's POS centroid score (/<upos>: on that tag)"),
             outputs.Metric("majority", "majority-class baseline (/pos_centroid)", score=False),
             *(outputs.Metric(n, f"number of {n.replace('_', ' ')}", score=False)
               for n in ("arcs", "scored_words", "fit_words"))))
"""What its runs report (base.outputs)."""


class Config(Section):
    """probes' own keys: ``probes: {score_sentences: 500, top_labels: 5}``."""

    fit_sentences: int | None = Field(1000, gt=0, description="UD EWT dev sentences the centroids are fitted on (None = all; unused with centroids_from: scored).")
    score_sentences: int | None = Field(500, gt=0, description="UD EWT test sentences the probes score (None = all).")
    centroids_from: Literal["fit", "scored"] = Field(
        "fit", description="Words the POS centroids are fitted on: 'fit' = the fit_sentences (held out from the scored "
        "words); 'scored' = the scored words themselves, as the reference code does (head/pos.py fits and scores on the "
        "test split), which flatters rare tags (a tag seen once is its own centroid).")
    max_length: int = Field(128, ge=8, le=512, description="Tokens per sentence after truncation (words cut off are dropped).")
    top_labels: int = Field(5, ge=0, le=64, description="Per-label maps and metrics for this many most frequent relations / UPOS tags.")
    batch_size: int = Field(32, gt=0, le=4096, description="Sentences per forward pass.")
    ud_dir: str | None = Field(None, description="Folder of en_ewt-ud-{dev,test}.conllu; None = <$HEADSWEEP_DATA or ../shared/data>/ud_ewt.")


REFERENCE: dict[str, Any] = {"centroids_from": "scored"}
"""The keys that restore He & Choi's reference protocol where our default differs."""


def run(cfg, ctx: RunContext) -> RunResult:
    own = cfg.section
    encoder, tokenizer = stage_encoder(cfg, ctx)
    folder = ud_folder(own.ud_dir)
    scored = load_ud_ewt(folder, "dev", tokenizer, own.max_length, own.score_sentences, cfg.task.data_seed)
    up = cfg.upstreams.get("init_from")
    model = cfg.model if up is None else f"{cfg.model} after {up.method} on {up.task.name}"
    where = f"UD EWT test, {len(scored)} sentences, {model}"

    # One pass over the scored sentences: word attention for the DEP probe, word features for centroids.
    hits, relations, features, tags = [], [], [], []
    for i, attn, heads in sentence_maps(encoder, scored.input_ids, scored.attention_mask, own.batch_size,
                                        ctx.device, contexts=True, precision=cfg.train.precision):
        first, end = scored.first[i], scored.end[i]
        dependents, governors, rels = arcs(scored.trees[i], len(first), root=True)
        argmax = row_argmax(word_attention(attn, first, end))  # (L, H, W + 1): ROOT 0, word w at w + 1
        hits.append(dep_probe_hits(argmax, governors + 1, dependents + 1))  # (L, H, P)
        relations += rels
        features.append(word_means(heads, first, end).astype(np.float32))  # (W, L, H, D)
        tags += _tag_ids(scored, i)
    features, tags = np.concatenate(features), np.asarray(tags)
    if own.centroids_from == "scored":
        fit_features, fit_tags = features, tags
    else:
        fit = load_ud_ewt(folder, "train", tokenizer, own.max_length, own.fit_sentences, cfg.task.data_seed)
        fit_features, fit_tags = _word_features(encoder, fit, own.batch_size, ctx.device, cfg.train.precision)

    maps, metrics = {}, {}
    hits_all = np.concatenate(hits, axis=-1)  # (L, H, P)
    by_rel = label_rates(hits_all, relations)
    _report(maps, metrics, outputs.DEP_PROBE, hits_all.mean(axis=-1), by_rel, _top(relations, own.top_labels),
            f"DEP probe, {where}: share of arcs where argmax word attention links head and dependent")

    overall, by_tag = _centroid_probe(fit_features, fit_tags, features, tags)
    fitted = "the scored words" if own.centroids_from == "scored" else "UD EWT dev"
    _report(maps, metrics, outputs.POS_CENTROID, overall, {UPOS[c]: acc for c, acc in by_tag.items()},
            _top([UPOS[t] for t in tags], own.top_labels),
            f"POS centroid probe, {where}: share of words whose head output is closest (cosine) to its "
            f"UPOS centroid (fitted on {fitted})")
    metrics[f"majority/{outputs.POS_CENTROID.name.partition('.')[2]}"] = Counter(tags.tolist()).most_common(1)[0][1] / len(tags)
    metrics |= {"arcs": float(hits_all.shape[-1]), "scored_words": float(len(tags)), "fit_words": float(len(fit_tags))}
    return RunResult(run_key=cfg.run_key, group_key=cfg.group_key, metrics=metrics, maps=maps)


def _tag_ids(data: EncodedTrees, i: int) -> list[int]:
    """UPOS ids of sentence i's kept words."""
    return [UPOS.index(tag) for tag in data.trees[i].upos[: len(data.first[i])]]


def _word_features(encoder, data: EncodedTrees, batch_size: int, device: str,
                   precision: str = "fp32") -> tuple[np.ndarray, np.ndarray]:
    """((N, L, H, D) head outputs averaged over each kept word's subwords, (N,) its UPOS id)."""
    features, tags = [], []
    for i, _, heads in sentence_maps(encoder, data.input_ids, data.attention_mask, batch_size, device,
                                     attention=False, contexts=True, precision=precision):
        features.append(word_means(heads, data.first[i], data.end[i]).astype(np.float32))
        tags += _tag_ids(data, i)
    return np.concatenate(features), np.asarray(tags)


def _centroid_probe(fit: np.ndarray, fit_tags: np.ndarray, scored: np.ndarray, tags: np.ndarray):
    """(overall (L, H), {tag id: (L, H)}): the centroid probe, one layer at a time (memory)."""
    layers = []
    for layer in range(fit.shape[1]):
        centroids = class_centroids(fit[:, layer], fit_tags, len(UPOS))  # (H, C, D)
        layers.append(label_accuracy(nearest_centroid(scored[:, layer], centroids), tags))
    overall = np.stack([o for o, _ in layers])
    return overall, {c: np.stack([per[c] for _, per in layers]) for c in layers[0][1]}


def _top(labels: list[str], k: int) -> list[str]:
    """The k most frequent labels (ties: first seen)."""
    return [label for label, _ in Counter(labels).most_common(k)]


def _report(maps: dict, metrics: dict, probe: outputs.MapOutput, overall: np.ndarray, per_label: dict,
            top: list[str], meaning: str) -> None:
    """Maps ``heads.<name>`` and ``heads.<name>.<label>``; metrics ``<name>`` and ``<name>/<label>``: the
    best head's score of each."""
    name = probe.name.partition(".")[2]
    maps |= [probe(overall, meaning)]
    metrics[name] = float(overall.max())
    for label in top:
        maps |= [probe(per_label[label], f"{meaning} ({label} only)", label)]
        metrics[f"{name}/{label}"] = float(per_label[label].max())
