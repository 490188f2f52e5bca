"""probes and attention_analysis on tiny random models, and the UD EWT dependency reader they use."""

import copy

import numpy as np
import pytest
import torch

from base.sections import ConfigError
from experiments import parse_config
from experiments.maths.probes import PATTERNS
from experiments.tasks import dependencies
from experiments.training.tracking import MemoryTracker

SMALL = {"fit_sentences": 30, "score_sentences": 15, "max_length": 32, "top_labels": 1}
FINETUNE = {
    "task": {"name": "synthetic-cls", "num_train": 64, "num_eval": 16, "max_length": 24},
    "train": {"max_steps": 4, "batch_size": 8, "eval_every": 4, "lr": 5e-2},  # big steps: attention moves
}


@pytest.fixture(autouse=True)
def _one_thread():
    torch.set_num_threads(1)


@pytest.fixture
def _no_pngs(monkeypatch):
    """Skip drawing the maps (~1 s each on this machine; these runs report up to 18): the test that
    checks the PNGs draws them."""
    monkeypatch.setattr("experiments.harness.runner.map_png", lambda *args, **kwargs: b"")


CONLLU = """# sent_id = 1
1\tThe\tthe\tDET\tDT\t_\t2\tdet\t_\t_
2\tcat\tcat\tNOUN\tNN\t_\t5\tnsubj:pass\t_\t_
3-4\tdon't\t_\t_\t_\t_\t_\t_\t_\t_
3\tdo\tdo\tAUX\tVBP\t_\t5\taux\t_\t_
4\tn't\tnot\tPART\tRB\t_\t5\tadvmod\t_\t_
4.1\tgone\tgo\tVERB\tVBN\t_\t_\t_\t5:conj\t_
5\tunbelievably\tunbelievably\tADV\tRB\t_\t0\troot\t_\t_

1\tYes\tyes\tINTJ\tUH\t_\t0\troot\t_\t_
"""


def test_trees_skip_ranges_and_empty_nodes_and_truncation_drops_words(tmp_path, minilm_tokenizer):
    path = tmp_path / "tiny.conllu"
    path.write_text(CONLLU)
    trees = dependencies.read_trees(path)
    assert len(trees) == 2
    first = trees[0]
    assert first.words == ("The", "cat", "do", "n't", "unbelievably")
    assert first.heads == (1, 4, 4, 4, -1) and first.upos[1] == "NOUN" and first.deprels[1] == "nsubj:pass"
    enc = dependencies.encode_trees(minilm_tokenizer, trees, max_length=64)
    tokens = minilm_tokenizer.convert_ids_to_tokens(enc.input_ids[0])
    for w, word in enumerate(first.words):  # each span's subwords spell the word
        piece = "".join(t.removeprefix("##") for t in tokens[enc.first[0][w] : enc.end[0][w]])
        assert piece == word.lower()
    dependents, heads, rels = dependencies.arcs(first, len(enc.first[0]))
    assert dependents.tolist() == [0, 1, 2, 3] and heads.tolist() == [1, 4, 4, 4]  # the root has no arc
    assert rels == ["det", "nsubj", "aux", "advmod"]  # universal part of nsubj:pass
    # He & Choi's probe scores the root arc too: head -1 (ROOT), relation root
    dependents, heads, rels = dependencies.arcs(first, len(enc.first[0]), root=True)
    assert dependents.tolist() == [0, 1, 2, 3, 4] and heads.tolist() == [1, 4, 4, 4, -1] and rels[-1] == "root"
    # truncated: [CLS] the cat do n ' t [SEP] keeps 4 words; arcs into the cut root are dropped
    cut = dependencies.encode_trees(minilm_tokenizer, trees[:1], max_length=8)
    assert len(cut.first[0]) == 4 and cut.end[0][-1] <= 7
    dependents, heads, _ = dependencies.arcs(first, len(cut.first[0]))
    assert dependents.tolist() == [0] and heads.tolist() == [1]
    assert dependencies.arcs(first, len(cut.first[0]), root=True)[0].tolist() == [0]  # the root word was cut


def _probes(model, **stage):
    raw = {"model": model, "method": "probes", "probes": dict(SMALL)}
    if stage:
        raw |= copy.deepcopy(FINETUNE) | stage
    return parse_config(raw)


def test_probes_on_a_random_model_give_per_head_rates_and_their_best_heads(run_chain):
    tracker = MemoryTracker()
    result, _ = run_chain(_probes("random:tiny-roberta"), tracker)
    maps, metrics = result.maps, result.metrics
    overall = [name for name in maps if name.count(".") == 1]
    assert overall == ["heads.dep_probe", "heads.pos_centroid"]
    assert sum(name.startswith("heads.dep_probe.") for name in maps) == 1  # top_labels
    assert sum(name.startswith("heads.pos_centroid.") for name in maps) == 1
    for name, unit_map in maps.items():
        assert unit_map.values.shape == (2, 4)
        assert ((unit_map.values >= 0) & (unit_map.values <= 1)).all(), name
        probe, _, label = name.removeprefix("heads.").partition(".")
        assert metrics[f"{probe}/{label}" if label else probe] == pytest.approx(unit_map.values.max())
    assert "heads.dep_probe.png" in tracker.artifacts and "heads.pos_centroid.NOUN.png" in tracker.artifacts
    assert metrics["arcs"] > 50 and 0 < metrics["majority/pos_centroid"] < 1
    assert metrics["arcs"] == metrics["scored_words"]  # every kept word's arc, the root's to ROOT included


def test_probes_read_the_model_of_their_stage(run_chain, _no_pngs):
    before, _ = run_chain(_probes("tiny-bert"))
    staged = _probes("tiny-bert", init_from={"method": "finetune"})
    assert staged.upstreams["init_from"].method == "finetune"
    after, store = run_chain(staged)
    assert store  # the fine-tune ran first and handed its weights on
    for name in ("heads.dep_probe", "heads.pos_centroid"):
        assert not np.array_equal(before.maps[name].values, after.maps[name].values), name


@pytest.mark.parametrize("model", ["tiny-bert", "tiny-deberta-v2"])
def test_attention_analysis_of_a_fine_tuned_model(model, run_chain, _no_pngs):
    cfg = parse_config({"model": model, "method": "attention_analysis", **copy.deepcopy(FINETUNE),
                        "attention_analysis": {"sentences": 15, "max_length": 32, "relations": ["nsubj", "det"]}})
    assert cfg.upstreams["init_from"].method == "finetune"  # the default stage
    result, _ = run_chain(cfg)
    maps = result.maps
    expected = {"heads.attention_change", "heads.cls_sep_share", "heads.confidence", "heads.positional",
                "heads.rare_word", "heads.syntactic.nsubj", "heads.syntactic.nsubj.reverse",
                "heads.syntactic.det", "heads.syntactic.det.reverse"}
    expected |= {f"heads.pattern_{p}" for p in PATTERNS if p != "block"}  # single sentences: no block
    assert set(maps) == expected
    for name, unit_map in maps.items():
        assert unit_map.values.shape == (2, 4)
        assert ((unit_map.values >= 0) & (unit_map.values <= 1 + 1e-6)).all(), name
    change = maps["heads.attention_change"].values
    assert change.min() < 0.999  # fine-tuning moved some head's attention
    np.testing.assert_allclose(sum(maps[f"heads.pattern_{p}"].values for p in PATTERNS if p != "block"), 1.0, atol=1e-6)
    assert (maps["heads.confidence"].values > 1 / 32).all()  # the largest weight is at least uniform
    assert 0 < result.metrics["syntactic_baseline/det"] <= 1


def test_attention_analysis_names_a_relation_it_does_not_know():
    with pytest.raises(ConfigError, match=r"attention_analysis.relations: 'nsub' .*did you mean 'nsubj'"):
        parse_config({"method": "attention_analysis", "attention_analysis": {"relations": ["nsub"]}})


def test_padded_attention_change_is_the_reference_notebooks_cosine():
    """Kovaleva et al.'s visualize_attention.ipynb: each example padded to max_len, both models'
    attention ``(L, H, max_len, max_len)`` (output_attentions), ``cosine_similarity(base.view(L, H, -1),
    tuned.view(L, H, -1), dim=-1)``, averaged over examples: recomputed here with transformers' own
    attentions; and it differs from the cropped default (padding rows pull it towards 1)."""
    import torch

    from experiments.maths.probes import attention_cosine, crop
    from experiments.methods.attention_analysis import padded_attention_change
    from experiments.models import load_backbone

    base, _ = load_backbone("tiny-bert", 0)
    tuned, _ = load_backbone("tiny-bert", 1)
    for encoder in (base, tuned):
        encoder.config._attn_implementation = "eager"  # output_attentions needs the eager kernel
    with torch.no_grad():  # sharp attention in the "fine-tuned" model: random tiny models attend ~uniformly
        for name, weight in tuned.named_parameters():
            if name.endswith("query.weight"):
                weight.mul_(40)
    ids = torch.tensor([[101, 2023, 2003, 1037, 3231, 102], [101, 7592, 102, 0, 0, 0]])
    mask = (ids != 0).long()
    max_len = 10
    ours = padded_attention_change(base, tuned, ids, mask, max_len, 0, batch_size=1, device="cpu")

    padded = torch.zeros((2, max_len), dtype=torch.long)
    padded[:, :6] = ids
    padded_mask = (padded != 0).long()
    sims = []
    with torch.no_grad():
        for b in range(2):
            out = [m(input_ids=padded[b : b + 1], attention_mask=padded_mask[b : b + 1], output_attentions=True)
                   for m in (base, tuned)]
            vecs = [torch.stack(o.attentions).squeeze(1) for o in out]  # (L, H, N, N)
            L, H = vecs[0].shape[:2]
            sims.append(torch.nn.functional.cosine_similarity(vecs[0].view(L, H, -1), vecs[1].view(L, H, -1), dim=-1))
    reference = torch.stack(sims).mean(0).numpy()
    np.testing.assert_allclose(ours, reference, atol=1e-5)

    with torch.no_grad():
        cropped = []
        for b in range(2):
            real = mask[b].numpy()
            maps = []
            for m in (base, tuned):
                o = m(input_ids=ids[b : b + 1], attention_mask=mask[b : b + 1], output_attentions=True)
                maps.append(crop(torch.stack(o.attentions).squeeze(1)[None].numpy()[0], real))
            cropped.append(attention_cosine(*maps))
    assert not np.allclose(np.mean(cropped, axis=0), reference, atol=1e-3)
