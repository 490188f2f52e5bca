"""He & Choi's stem-cell probes against their reference code, re-implemented here step by step.

Reference: emorynlp/stem-cell-hypothesis (commit 842c6ac):

- elit/components/mtl/head_mtl.py:20-38 ``sum_span(h, token_span, mean)``: gather the rows of
  ``h`` at each word's subword indices (``token_span`` (B, W, S), padded with 0), keep the
  non-zero indices (and index 0 of word 0), sum them, divide by their count when ``mean``.
- head_mtl.py:151-159 (``dump_attention_per_head``): each layer's attention (B, H, T, T) is
  pooled ``sum_span(.., mean=True)`` over the query axis, then ``sum_span(.., mean=False)`` over
  the key axis: a word's row is the mean of its subwords' rows, its column the sum of its
  subwords' columns. The dependency task tokenises with ``cls_is_bos=True``,
  ``sep_is_eos=False`` (elit/components/mtl/tasks/dep.py:36-37), so its ``token_span`` starts
  with ``[0]`` ([CLS] is word 0, ROOT: elit/transform/transformer_tokenizer.py:500-518) and
  [SEP] is in no span.
- stem_cell_hypothesis/en_bert_base/head/dep.py:156-170: ``argmax(dim=-1)`` of the pooled map;
  for word i >= 1 with HEAD h (1-based, 0 = ROOT) a hit when ``argmax[i] == h or argmax[h] ==
  i`` (so a root word is a hit when it attends most to [CLS] or [CLS] to it); hits and
  counts per DEPREL, every word counted (root included).
- head_mtl.py:216-223 (``dump_attended_values_per_head``): each layer's attention output before
  the output projection (B, T, H * D), ``sum_span(.., mean=True)`` over each word's subwords
  (POS tokenises with ``cls_is_bos=False``: no ROOT word), viewed (B, W, H, D).
- stem_cell_hypothesis/en_bert_base/head/pos.py:157-182: per tag, the mean word feature over the
  split (the centroid); each word of that same split gets the tag of the centroid of highest
  ``CosineSimilarity(dim=-1, eps=1e-8)``; correct counts per tag.

The first two tests check the maths on hand-built subword splits and attention; the last runs
the ``probes`` method on a tiny random BERT and recomputes both probes the reference's way from
the same model's own outputs (eager attention, ``output_attentions``, a hook on the attention's
self-attention output), with no code of ours in between.
"""

import copy

import numpy as np
import pytest
import torch

from experiments import parse_config
from experiments.components.probing import pretrained
from experiments.maths import probes
from experiments.tasks.dependencies import Tree, arcs

# --------------------------------------------------------------------------- the reference, re-implemented


def ref_sum_span(h: torch.Tensor, token_span: torch.Tensor, mean: bool) -> torch.Tensor:
    """head_mtl.py:20-38. ``h`` (B, T, F), ``token_span`` (B, W, S) subword indices padded with 0
    -> (B, W, F)."""
    if token_span.size(-1) == 1:  # one subword per word everywhere: a plain gather (:37)
        return h.gather(1, token_span[:, :, 0, None].expand(-1, -1, h.size(-1)))
    b, w, s = token_span.shape
    rows = h.gather(1, token_span.reshape(b, w * s, 1).expand(-1, -1, h.size(-1))).reshape(b, w, s, -1)
    kept = token_span != 0
    kept[:, 0, 0] = True  # index 0 of word 0 is real ([CLS] when it is ROOT)
    total = (rows * kept[..., None]).sum(2)
    if not mean:
        return total
    count = kept.sum(-1, keepdim=True)
    return total / count.clamp(min=1)  # padding words: 0 / 1


def ref_pool_attention(attn: torch.Tensor, token_span: torch.Tensor) -> torch.Tensor:
    """head_mtl.py:151-158 for one layer: (B, H, T, T) -> (B, H, W, W)."""
    b, heads = attn.shape[:2]
    w = token_span.shape[1]
    spans = token_span[:, None].repeat(1, heads, 1, 1).flatten(0, 1)  # (B * H, W, S)
    queries = ref_sum_span(attn.flatten(0, 1), spans, True)  # (B * H, W, T): mean over the query word
    pooled = ref_sum_span(queries.transpose(1, 2), spans, False)  # (B * H, W_key, W_query): sum over keys
    return pooled.transpose(1, 2).reshape(b, heads, w, w)


def ref_dep_accuracy(pooled: list[torch.Tensor], head_ids: list[list[int]], deprels: list[list[str]]) -> dict:
    """head/dep.py:156-170 and main's division by label counts: {DEPREL: (L, H)}. ``pooled``: one
    (B, H, W, W) per layer; ``head_ids``: per sentence the 1-based HEAD of each word (0 = ROOT)."""
    correct, count = {}, {}
    for layer, per_layer in enumerate(pooled):
        max_attn = per_layer.argmax(dim=-1)  # (B, H, W)
        for head in range(max_attn.size(1)):
            am = max_attn[:, head]
            for b, (heads, rels) in enumerate(zip(head_ids, deprels, strict=True)):
                for i, (h, r) in enumerate(zip([-1, *heads], ["ROOT", *rels], strict=True)):
                    if i == 0:
                        continue
                    if am[b][i].item() == h or am[b][h].item() == i:
                        correct.setdefault(r, torch.zeros(len(pooled), max_attn.size(1)))[layer][head] += 1
    for rels in deprels:
        for r in rels:
            count[r] = count.get(r, 0) + 1
    return {r: (correct.get(r, torch.zeros(len(pooled), pooled[0].size(1))) / n).numpy() for r, n in count.items()}


def ref_centroid_accuracy(values: torch.Tensor, tags: list[str]) -> tuple[np.ndarray, dict]:
    """head/pos.py:157-182 on one split's word features ``values`` (N, L, H, D): centroids fitted
    on it, each word scored against them; (overall (L, H) weighted by count as pos.py:main,
    {tag: (L, H)})."""
    sums, count = {}, {}
    for value, t in zip(values, tags, strict=True):
        sums[t] = sums.get(t, 0) + value
        count[t] = count.get(t, 0) + 1
    centroids = torch.stack([sums[t] / count[t] for t in sums])  # (C, L, H, D), first-seen order
    index = {t: c for c, t in enumerate(sums)}
    cos = torch.nn.CosineSimilarity(dim=-1, eps=1e-08)
    correct = {t: torch.zeros(values.shape[1:3]) for t in sums}
    for value, t in zip(values, tags, strict=True):
        closest = cos(value.expand_as(centroids), centroids).argmax(0)  # (L, H)
        correct[t] += closest == index[t]
    per_tag = {t: (correct[t] / count[t]).numpy() for t in sums}
    overall = sum(per_tag[t] * count[t] for t in sums) / len(tags)
    return overall, per_tag


def ref_token_span(word_spans: list[list[tuple[int, int]]], root: bool) -> torch.Tensor:
    """elit's ``token_span`` (B, W, S) from each sentence's word subword spans [first, end):
    ``[[0], [1], [2, 3], ...]`` with ROOT ([CLS]) first when ``root``, padded with 0."""
    rows = [([[0]] if root else []) + [list(range(a, b)) for a, b in spans] for spans in word_spans]
    w, s = max(map(len, rows)), max(len(x) for r in rows for x in r)
    out = torch.zeros(len(rows), w, s, dtype=torch.long)
    for b, r in enumerate(rows):
        for i, x in enumerate(r):
            out[b, i, : len(x)] = torch.tensor(x)
    return out


# --------------------------------------------------------------------------- hand-built sentences

# Two sentences, hand-split into subwords. Tokens of sentence 0:
#   0 [CLS] | 1 the | 2 cat 3 ##s | 4 sat | 5 down | 6 [SEP]      (7 tokens)
# sentence 1 (padded to 7 in a batch):
#   0 [CLS] | 1 un 2 ##believ 3 ##ably | 4 yes | 5 [SEP]          (6 tokens)
TREES = [
    Tree(("the", "cats", "sat", "down"), ("DET", "NOUN", "VERB", "ADV"), (1, 2, -1, 2), ("det", "nsubj", "root", "advmod")),
    Tree(("unbelievably", "yes"), ("ADV", "INTJ"), (1, -1), ("advmod", "root")),
]
SPANS = [[(1, 2), (2, 4), (4, 5), (5, 6)], [(1, 4), (4, 5)]]
LENGTHS = [7, 6]


def _attention(rng, layers=2, heads=5) -> list[np.ndarray]:
    """One (L, H, n, n) map per sentence: random rows, plus designed heads.
    Head 0: every query puts 0.4 on [SEP] and splits 0.3 + 0.3 over the next word's subwords when
    it has two or more, else 0.35 on the next token: a first-subword argmax over tokens finds [SEP]
    or a subword, a word-pooled one finds the next word. Head 1: everything on [CLS] (ROOT)."""
    maps = []
    for n in LENGTHS:
        attn = rng.dirichlet(np.full(n, 0.3), size=(layers, heads, n))  # (L, H, n, n), rows sum to 1
        attn[:, 1] = 0.0
        attn[:, 1, :, 0] = 1.0
        maps.append(attn)
    for attn, spans, n in zip(maps, SPANS, LENGTHS, strict=True):
        attn[:, 0] = 0.0
        attn[:, 0, :, n - 1] = 0.4
        for q in range(n):
            nxt = next(((a, b) for a, b in spans if a > q), None)
            if nxt is None:
                attn[:, 0, q, 0] += 0.6
            elif nxt[1] - nxt[0] >= 2:
                attn[:, 0, q, nxt[0]] += 0.3
                attn[:, 0, q, nxt[0] + 1] += 0.3
            else:
                attn[:, 0, q, nxt[0]] += 0.35
                attn[:, 0, q, 0] += 0.25
    return maps


def _ours_dep(maps: list[np.ndarray]) -> dict[str, np.ndarray]:
    """Our dependency probe on the hand-built maps: {relation: (L, H)}."""
    hits, labels = [], []
    for attn, tree, spans in zip(maps, TREES, SPANS, strict=True):
        first, end = np.array([a for a, _ in spans]), np.array([b for _, b in spans])
        dependents, governors, rels = arcs(tree, len(spans), root=True)
        argmax = probes.row_argmax(probes.word_attention(attn, first, end))
        hits.append(probes.dep_probe_hits(argmax, governors + 1, dependents + 1))
        labels += rels
    return probes.label_rates(np.concatenate(hits, -1), labels)


def _reference_dep(maps: list[np.ndarray]) -> dict[str, np.ndarray]:
    """The reference's pooling and scoring on the same maps, padded into one batch per layer."""
    t = max(LENGTHS)
    batch = np.zeros((len(maps), *maps[0].shape[:2], t, t))  # (B, L, H, T, T), padding zero
    for b, attn in enumerate(maps):
        batch[b, ..., : attn.shape[-1], : attn.shape[-1]] = attn
    span = ref_token_span(SPANS, root=True)
    pooled = [ref_pool_attention(torch.from_numpy(batch[:, layer]), span) for layer in range(batch.shape[1])]
    heads = [[h + 1 for h in tree.heads] for tree in TREES]
    return ref_dep_accuracy(pooled, heads, [list(tree.deprels) for tree in TREES])


def test_word_pooling_matches_the_reference_sum_span():
    maps = _attention(np.random.default_rng(0))
    span = ref_token_span(SPANS, root=True)
    for b, (attn, spans) in enumerate(zip(maps, SPANS, strict=True)):
        first, end = np.array([a for a, _ in spans]), np.array([e for _, e in spans])
        ours = probes.word_attention(attn, first, end)  # (L, H, W + 1, W + 1)
        for layer in range(attn.shape[0]):
            padded = np.zeros((1, attn.shape[1], 7, 7))
            padded[0, :, : attn.shape[-1], : attn.shape[-1]] = attn[layer]
            ref = ref_pool_attention(torch.from_numpy(padded), span[b : b + 1])[0].numpy()
            w = len(spans) + 1
            np.testing.assert_allclose(ours[layer], ref[:, :w, :w], atol=1e-12)
    # the designed head 0, sentence 0: "the" sends 0.3 + 0.3 to "cat ##s", 0.4 to [SEP], which is in no
    # column: "cats" (0.6) wins, where a first-subword argmax over tokens finds [SEP]
    ours = probes.word_attention(maps[0], np.array([1, 2, 4, 5]), np.array([2, 4, 5, 6]))
    np.testing.assert_allclose(ours[0, 0, 1], [0.0, 0.0, 0.6, 0.0, 0.0])
    assert probes.row_argmax(maps[0])[0, 0, 1] == 6  # [SEP]
    # "cats" = mean of the rows of "cat" (next word: sat, 0.35) and "##s" (next word: sat, 0.35)
    np.testing.assert_allclose(ours[0, 0, 2], [0.25, 0.0, 0.0, 0.35, 0.0])


def test_dep_probe_matches_the_reference_per_relation_root_arcs_included():
    maps = _attention(np.random.default_rng(1))
    ours, ref = _ours_dep(maps), _reference_dep(maps)
    assert set(ours) == set(ref) == {"det", "nsubj", "root", "advmod"}
    for rel in ref:
        np.testing.assert_array_equal(ours[rel], ref[rel], err_msg=rel)
    # head 1 (all on [CLS]): every root word attends most to ROOT -> root arcs are all hits
    np.testing.assert_array_equal(ours["root"][:, 1], 1.0)
    # head 0: "the" -> "cats" (pooled 0.6 beats [SEP] 0.4, which is no candidate) is a det hit
    np.testing.assert_array_equal(ours["det"][:, 0], 1.0)
    for seed in range(2, 8):  # more random maps: equal on every label, layer and head
        maps = _attention(np.random.default_rng(seed))
        ours, ref = _ours_dep(maps), _reference_dep(maps)
        for rel in ref:
            np.testing.assert_array_equal(ours[rel], ref[rel], err_msg=f"seed {seed}, {rel}")


def test_centroid_probe_matches_the_reference_cosine_on_subword_means():
    rng = np.random.default_rng(3)
    layers, heads, dim = 2, 3, 4
    tags = [list(tree.upos) for tree in TREES] * 3  # 6 sentences: every tag seen 3+ times
    spans = SPANS * 3
    n_tokens = LENGTHS * 3
    # per token (n, L, H, D) head outputs; norms vary a lot so cosine and Euclidean disagree
    tokens = [rng.normal(size=(n, layers, heads, dim)) * rng.uniform(0.1, 10, size=(n, 1, 1, 1)) for n in n_tokens]
    ours_feats = np.concatenate([probes.word_means(x, [a for a, _ in s], [b for _, b in s]) for x, s in zip(tokens, spans, strict=True)])
    flat_tags = [t for ts in tags for t in ts]
    names = sorted(set(flat_tags))
    ids = np.array([names.index(t) for t in flat_tags])
    predicted = np.stack([probes.nearest_centroid(ours_feats[:, layer], probes.class_centroids(ours_feats[:, layer], ids, len(names)))
                          for layer in range(layers)], axis=1)  # (N, L, H)
    overall, per_class = probes.label_accuracy(predicted.reshape(len(ids), -1), ids)

    # the reference: (B, T, H * D) values, sum_span mean over token_span without ROOT, view (B, W, H, D)
    t = max(n_tokens)
    span = ref_token_span(spans, root=False)
    values = []
    for layer in range(layers):
        batch = torch.zeros(len(tokens), t, heads * dim, dtype=torch.float64)
        for b, x in enumerate(tokens):
            batch[b, : len(x)] = torch.from_numpy(x[:, layer].reshape(len(x), -1))
        values.append(ref_sum_span(batch, span, True).view(len(tokens), span.shape[1], heads, dim))
    stacked = torch.stack(values, dim=2)  # (B, W, L, H, D), as pos.py:157
    words = torch.stack([stacked[b, i] for b, ts in enumerate(tags) for i in range(len(ts))])
    np.testing.assert_allclose(ours_feats, words.numpy(), atol=1e-12)  # subword means
    ref_overall, ref_per_tag = ref_centroid_accuracy(words, flat_tags)
    np.testing.assert_allclose(overall.reshape(layers, heads), ref_overall, atol=1e-12)
    for c, name in enumerate(names):
        np.testing.assert_allclose(per_class[c].reshape(layers, heads), ref_per_tag[name], atol=1e-12, err_msg=name)
    # cosine, not Euclidean: scaling one word's feature changes nothing
    scaled = ours_feats.copy()
    scaled[0] *= 1000.0
    centroids = probes.class_centroids(ours_feats[:, 0], ids, len(names))
    np.testing.assert_array_equal(probes.nearest_centroid(scaled[:, 0], centroids),
                                  probes.nearest_centroid(ours_feats[:, 0], centroids))


# --------------------------------------------------------------------------- the method, end to end

CONLLU_WORDS = [
    # (word, upos, head, deprel): 1-based heads, several words split into subwords by WordPiece
    [("Unbelievably", "ADV", 3, "advmod"), ("headsweeps", "NOUN", 3, "nsubj"), ("reconfigured", "VERB", 0, "root"),
     ("the", "DET", 5, "det"), ("Zyzzyva", "PROPN", 3, "obj"), (".", "PUNCT", 3, "punct")],
    [("The", "DET", 2, "det"), ("cat", "NOUN", 3, "nsubj"), ("sat", "VERB", 0, "root"), ("quietly", "ADV", 3, "advmod"),
     ("on", "ADP", 7, "case"), ("the", "DET", 7, "det"), ("mat", "NOUN", 3, "obl"), ("!", "PUNCT", 3, "punct")],
    [("Antidisestablishmentarianism", "NOUN", 2, "nsubj"), ("bewilders", "VERB", 0, "root"),
     ("philologists", "NOUN", 2, "obj"), (".", "PUNCT", 2, "punct")],
    [("Yes", "INTJ", 0, "root"), (",", "PUNCT", 4, "punct"), ("we", "PRON", 4, "nsubj"), ("tokenised", "VERB", 1, "parataxis"),
     ("it", "PRON", 4, "obj"), ("carefully", "ADV", 4, "advmod")],
    [("Dogs", "NOUN", 2, "nsubj"), ("bark", "VERB", 0, "root"), ("at", "ADP", 5, "case"), ("noisy", "ADJ", 5, "amod"),
     ("motorcyclists", "NOUN", 2, "obl"), (".", "PUNCT", 2, "punct")],
]


def _write_ud(folder) -> None:
    """The same sentences as UD's dev (centroids fitted) and test (scored) file: fitting on the
    scored words, as the reference does, whatever ``centroids_from`` says."""
    lines = []
    for s, sentence in enumerate(CONLLU_WORDS):
        lines.append(f"# sent_id = {s}")
        for i, (word, upos, head, rel) in enumerate(sentence, start=1):
            lines.append("\t".join([str(i), word, word.lower(), upos, "_", "_", str(head), rel, "_", "_"]))
        lines.append("")
    for name in ("en_ewt-ud-dev.conllu", "en_ewt-ud-test.conllu"):
        (folder / name).write_text("\n".join(lines) + "\n")


def _reference_run(cfg) -> tuple[dict, dict, np.ndarray, dict]:
    """Both probes the reference's way on the model ``cfg`` loads: (dep {rel: (L, H)}, centroid
    overall (L, H), centroid {UPOS: (L, H)})."""
    encoder, tokenizer = pretrained(cfg)
    encoder.set_attn_implementation("eager")
    words = [[w for w, *_ in s] for s in CONLLU_WORDS]
    enc = tokenizer(words, is_split_into_words=True, padding="longest", return_tensors="pt")
    spans = []
    for b in range(len(words)):
        per_word: dict[int, list[int]] = {}
        for t, w in enumerate(enc.word_ids(b)):
            if w is not None:
                per_word.setdefault(w, [t, t + 1])[1] = t + 1
        spans.append([tuple(per_word[w]) for w in range(len(words[b]))])
    values = []  # (B, T, H * D) per layer: the self-attention's output, before the output projection
    hooks = [layer.attention.self.register_forward_hook(lambda _m, _a, out: values.append(out[0].double()))
             for layer in encoder.encoder.layer]
    with torch.no_grad():
        out = encoder(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], output_attentions=True)
    for hook in hooks:
        hook.remove()
    heads = out.attentions[0].shape[1]
    dep_span = ref_token_span(spans, root=True)
    pooled = [ref_pool_attention(a.double(), dep_span) for a in out.attentions]
    dep = ref_dep_accuracy(pooled, [[h for _, _, h, _ in s] for s in CONLLU_WORDS], [[r for *_, r in s] for s in CONLLU_WORDS])
    pos_span = ref_token_span(spans, root=False)
    b, w = pos_span.shape[:2]
    stacked = torch.stack([ref_sum_span(v, pos_span, True).view(b, w, heads, -1) for v in values], dim=2)
    feats = torch.stack([stacked[i, j] for i, s in enumerate(CONLLU_WORDS) for j in range(len(s))])
    overall, per_tag = ref_centroid_accuracy(feats, [u for s in CONLLU_WORDS for _, u, _, _ in s])
    return dep, overall, per_tag


@pytest.mark.parametrize("centroids_from", [None, "scored"])
def test_probes_method_equals_the_reference_on_a_tiny_bert(tmp_path, run_chain, monkeypatch, centroids_from):
    monkeypatch.setattr("experiments.harness.runner.map_png", lambda *args, **kwargs: b"")
    torch.set_num_threads(1)
    _write_ud(tmp_path)
    section = {"fit_sentences": None, "score_sentences": None, "max_length": 64, "top_labels": 64, "ud_dir": str(tmp_path)}
    if centroids_from:  # the reference protocol's key; the default fits on UD dev, here the same sentences
        section["centroids_from"] = centroids_from
    cfg = parse_config({"model": "tiny-bert", "method": "probes", "probes": copy.deepcopy(section)})
    result, _ = run_chain(cfg)
    dep, overall, per_tag = _reference_run(cfg)
    maps = result.maps
    assert {name.removeprefix("heads.dep_probe.") for name in maps if name.startswith("heads.dep_probe.")} == set(dep)
    for rel, ref in dep.items():
        np.testing.assert_array_equal(maps[f"heads.dep_probe.{rel}"].values, ref, err_msg=rel)
    n_words = sum(map(len, CONLLU_WORDS))
    assert result.metrics["arcs"] == n_words  # every word's arc, the root's included
    counts = {r: sum(x[3] == r for s in CONLLU_WORDS for x in s) for r in dep}
    np.testing.assert_allclose(maps["heads.dep_probe"].values, sum(dep[r] * counts[r] for r in dep) / n_words)
    np.testing.assert_allclose(maps["heads.pos_centroid"].values, overall, atol=1e-12)
    for tag, ref in per_tag.items():
        np.testing.assert_allclose(maps[f"heads.pos_centroid.{tag}"].values, ref, atol=1e-12, err_msg=tag)
