"""He & Choi's stem-cell probes on the real pretrained MiniLM and real UD EWT (`make real`, not `make test`).

What would catch a broken probe: the best head for a relation must beat the best purely positional
head (one that always attends to the word k places away hits exactly the arcs of length k, in
either direction) by a margin, a per-relation map must not be flat, and the centroid probe's best
head must tag far better than always answering the most frequent tag.
"""

from collections import Counter

import numpy as np
import pytest
import torch

from experiments import parse_config, run
from experiments.components.probing import pretrained, ud_folder
from experiments.tasks.dependencies import arcs, load_ud_ewt

pytestmark = pytest.mark.real

PROBES = {"fit_sentences": 300, "score_sentences": 200, "top_labels": 20}


def _positional_ceiling(cfg) -> dict[str, float]:
    """Per relation, the best score of a head that always attends k words away: the largest share
    of that relation's arcs (scored sentences, root arcs left out) at one distance |h - d|."""
    _, tokenizer = pretrained(cfg)
    data = load_ud_ewt(ud_folder(None), "dev", tokenizer, cfg.section.max_length, cfg.section.score_sentences,
                       cfg.task.data_seed)
    lengths: dict[str, Counter] = {}
    for tree, first in zip(data.trees, data.first, strict=True):
        dependents, heads, rels = arcs(tree, len(first))
        for d, h, r in zip(dependents, heads, rels, strict=True):
            lengths.setdefault(r, Counter())[abs(int(h) - int(d))] += 1
    return {r: c.most_common(1)[0][1] / sum(c.values()) for r, c in lengths.items()}


def test_pretrained_minilm_has_syntactic_heads_and_tag_centroids():
    torch.set_num_threads(2)
    cfg = parse_config({"model": "minilm-l6", "method": "probes", "probes": PROBES})
    result = run(cfg)
    maps, metrics = result.maps, result.metrics
    ceiling = _positional_ceiling(cfg)
    shown = {k: round(v, 3) for k, v in metrics.items() if "/" in k}
    print(f"\nprobes on MiniLM: {shown}; positional ceilings {ceiling}")

    assert metrics["arcs"] == metrics["scored_words"] > 2000  # every word's arc, the root's included
    # MiniLM, 500 sentences: best head vs positional ceiling, case 0.72 vs 0.40, det 0.81 vs 0.57, obj 0.57 vs 0.36
    for rel in ("case", "det", "obj"):
        assert metrics[f"dep_probe/{rel}"] >= ceiling[rel] + 0.12, rel
        values = maps[f"heads.dep_probe.{rel}"].values
        assert values.shape == (6, 12) and values.std() > 0.05 and values.min() < 0.5 * values.max(), rel
    assert metrics["dep_probe/root"] >= 0.5  # some head links the root word and [CLS]

    # 500 sentences: the best head tags 0.41 of the words (majority tag 0.16); NOUN 0.56, PUNCT 0.63,
    # CCONJ 0.74 of their words, where one of 17 tags at random gets 0.06
    assert metrics["pos_centroid"] >= 2 * metrics["majority/pos_centroid"]
    for tag in ("NOUN", "PUNCT", "CCONJ"):
        assert metrics[f"pos_centroid/{tag}"] >= 0.4, tag
    overall = maps["heads.pos_centroid"].values
    assert overall.std() > 0.02 and np.median(overall) < overall.max() - 0.05
