"""The probe and head-role maths (experiments/maths/probes.py) on hand-built attention and features."""

import numpy as np
import pytest

from experiments.maths import probes


def _one_hot_rows(targets, n):
    """(1, 1, n, n) attention where query i attends only to targets[i]."""
    attn = np.zeros((1, 1, n, n))
    attn[0, 0, np.arange(n), targets] = 1.0
    return attn


def test_crop_removes_padding_rows_and_columns_wherever_it_is():
    attn = np.arange(2 * 1 * 4 * 4, dtype=float).reshape(2, 1, 4, 4)
    cropped = probes.crop(attn, np.array([1, 0, 1, 1]))
    assert cropped.shape == (2, 1, 3, 3)
    np.testing.assert_array_equal(cropped[1, 0], attn[1, 0][np.ix_([0, 2, 3], [0, 2, 3])])


def test_dep_probe_gives_the_expected_rate_per_relation():
    # 6 words (position 0 = ROOT); head 0 of the 2 heads points each query at a fixed key
    argmax = np.stack([
        np.array([0, 2, 1, 2, 3, 0]),  # query 1 -> 2, 2 -> 1, 3 -> 2, 4 -> 3, 5 -> 0
        np.array([0, 0, 0, 0, 0, 0]),  # everything on token 0
    ])[None]  # (1, 2, 6)
    head = np.array([2, 2, 4, 1])  # pairs (head, dependent): (2,1) nsubj, (2,3) obj, (4,5) nsubj, (1,5) amod
    dependent = np.array([1, 3, 5, 5])
    hits = probes.dep_probe_hits(argmax, head, dependent)
    assert hits.shape == (1, 2, 4)
    # head 0: (2,1) hit both ways; (2,3) hit (3 -> 2); (4,5) miss (5 -> 0, 4 -> 3); (1,5) miss
    np.testing.assert_array_equal(hits[0, 0], [True, True, False, False])
    assert not hits[0, 1].any()
    rates = probes.label_rates(hits, ["nsubj", "obj", "nsubj", "amod"])
    assert list(rates) == ["nsubj", "obj", "amod"]
    np.testing.assert_allclose(rates["nsubj"], [[0.5, 0.0]])
    np.testing.assert_allclose(rates["obj"], [[1.0, 0.0]])
    np.testing.assert_allclose(rates["amod"], [[0.0, 0.0]])
    # the reverse direction alone counts too: only the head attends to the dependent
    reverse = probes.dep_probe_hits(np.array([[[0, 0, 1]]]), head=np.array([2]), dependent=np.array([1]))
    assert reverse.all()


def test_centroid_probe_is_perfect_on_separable_features_and_per_label():
    rng = np.random.default_rng(0)
    centres = np.array([[5.0, 0, 0], [0, 5.0, 0], [0, 0, 5.0]])  # 3 classes, D = 3
    train_y, dev_y = rng.integers(0, 3, 60), rng.integers(0, 3, 30)
    # unit 0: separable (class centre + small noise); unit 1: pure noise, labels unrelated
    def feats(y):
        good = centres[y] + rng.normal(0, 0.3, (len(y), 3))
        return np.stack([good, rng.normal(0, 1.0, (len(y), 3))], axis=1)  # (N, U=2, D)

    centroids = probes.class_centroids(feats(train_y), train_y, num_classes=4)  # class 3 never seen
    assert centroids.shape == (2, 4, 3) and np.isnan(centroids[:, 3]).all()
    predicted = probes.nearest_centroid(feats(dev_y), centroids)
    assert predicted.shape == (30, 2) and (predicted != 3).all()
    overall, per_class = probes.label_accuracy(predicted, dev_y)
    assert overall[0] == 1.0 and all(acc[0] == 1.0 for acc in per_class.values())
    assert overall[1] < 0.8  # the noise unit is not separable
    assert set(per_class) == set(np.unique(dev_y).tolist())


def test_nearest_centroid_is_by_cosine_and_word_means_average_subwords():
    # one unit, D = 2: centroid 0 long and along x, centroid 1 short and at 45 degrees
    centroids = np.array([[[10.0, 0.0], [0.1, 0.1], [np.nan, np.nan]]])  # (U=1, C=3, D=2), class 2 unseen
    words = np.array([[[0.2, 0.15]], [[1.0, 0.1]], [[0.0, 0.0]]])  # (N=3, U=1, D)
    # Euclidean would give (1, 1, 1): the short centroid is nearest to all three
    np.testing.assert_array_equal(probes.nearest_centroid(words, centroids)[:, 0], [1, 0, 0])  # zero vector: tie, first
    tokens = np.arange(12, dtype=float).reshape(6, 2)  # [CLS] a b1 b2 b3 [SEP]
    np.testing.assert_allclose(probes.word_means(tokens, [1, 2], [2, 5]), [[2.0, 3.0], [6.0, 7.0]])
    with pytest.raises(ValueError, match="ROOT"):
        probes.word_attention(np.ones((1, 1, 3, 3)), np.array([0]), np.array([2]))


def test_confidence_and_positional_shares():
    prev = _one_hot_rows([0, 0, 1, 2, 3], 5)  # query i -> i - 1 (query 0 -> itself)
    nxt = _one_hot_rows([1, 2, 3, 4, 4], 5)
    uniform = np.full((1, 1, 5, 5), 0.2)
    attn = np.concatenate([prev, nxt, uniform], axis=1)  # (1, 3, 5, 5)
    np.testing.assert_allclose(probes.confidence(attn.max(-1)), [[1.0, 1.0, 0.2]])
    minus, plus = probes.positional(probes.argmax_offsets(probes.row_argmax(attn)))
    np.testing.assert_allclose(minus, [[0.8, 0.0, 0.2]])  # uniform: every argmax is key 0 (ties go first)
    np.testing.assert_allclose(plus, [[0.0, 0.8, 0.0]])
    assert probes.POSITIONAL_THRESHOLD == 0.9


def test_syntactic_directions_and_the_positional_baseline():
    argmax = np.array([[[0, 2, 2, 2]]])  # every query but 0 attends to token 2
    dependent, head = np.array([1, 3, 2]), np.array([2, 2, 1])
    to_head = probes.directed_hits(argmax, dependent, head)  # dependent's argmax is its head
    to_dependent = probes.directed_hits(argmax, head, dependent)
    np.testing.assert_array_equal(to_head[0, 0], [True, True, False])
    np.testing.assert_array_equal(to_dependent[0, 0], [False, False, True])  # token 1 (a head) -> 2
    baseline = probes.positional_baseline([1, -1, 1, 1, 2], ["amod", "amod", "amod", "obj", "obj"])
    assert baseline["amod"] == (1, pytest.approx(2 / 3))
    assert baseline["obj"][1] == 0.5


def test_rare_word_counts_attention_over_every_subword_of_a_word():
    # tokens: [CLS] w0 w1a w1b w2 [SEP]; word 1 has two subwords
    first, end = np.array([1, 2, 4]), np.array([2, 4, 5])
    received = np.array([0.3, 0.2, 0.15, 0.15, 0.1, 0.1])  # every query row the same
    attn = np.broadcast_to(received, (1, 1, 6, 6)).copy()
    # w0 gets 0.2 alone, w1 gets 0.3 over its two subwords: w1 is the most attended word; [CLS] cannot win
    assert probes.most_attended_word(attn, first, end)[0, 0] == 1
    np.testing.assert_array_equal(probes.rarest_words([10, 2, 2]), [1, 2])


def _pair_special(n_a, n_b):
    return np.array([1] + [0] * n_a + [1] + [0] * n_b + [1], dtype=bool)


def test_pattern_rule_labels_hand_built_maps():
    special = np.array([1, 0, 0, 0, 0, 0, 1], dtype=bool)  # [CLS] 5 words [SEP]
    n = special.size
    vertical = np.zeros((n, n))
    vertical[:, 0], vertical[:, -1] = 0.6, 0.4
    diagonal = np.zeros((n, n))
    diagonal[np.arange(n), np.maximum(np.arange(n) - 1, 0)] = 1.0
    diagonal[0, 0], diagonal[0, 1] = 0.0, 1.0  # [CLS] looks at the next token
    mixed = 0.5 * vertical + 0.5 * diagonal
    rng = np.random.default_rng(1)
    spread = rng.dirichlet(np.ones(n), size=n)  # no structure
    single = np.stack([vertical, diagonal, mixed, spread])[None]  # (1, 4, n, n)
    masses = probes.pattern_masses(single, special)
    np.testing.assert_allclose(sum(masses.values()), 1.0)
    np.testing.assert_allclose(masses["special"][0, 0], 1.0)
    names = [probes.PATTERNS[c] for c in probes.classify_patterns(masses, pair=False)[0]]
    assert names == ["vertical", "diagonal", "vertical_diagonal", "heterogeneous"]

    # a pair: [CLS] a a a a [SEP] b b b b [SEP]; block = uniform inside the query's own sentence
    special = _pair_special(4, 4)
    seg = probes.segments(special)
    np.testing.assert_array_equal(seg, [0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2])
    words = ~special
    block = ((seg[:, None] == seg[None, :]) & words[None, :]).astype(float)
    block[special] = words  # [CLS]/[SEP] rows spread over every word
    block /= block.sum(-1, keepdims=True)
    across = ((seg[:, None] != seg[None, :]) & words[None, :]).astype(float)  # each sentence reads the other
    across /= across.sum(-1, keepdims=True)
    masses = probes.pattern_masses(np.stack([block, across])[None], special)
    codes = probes.classify_patterns(masses, pair=True)[0]
    assert [probes.PATTERNS[c] for c in codes] == ["block", "heterogeneous"]
    # the same block map read as a single sentence is not a block
    assert probes.PATTERNS[probes.classify_patterns(masses, pair=False)[0, 0]] == "heterogeneous"


def test_attention_cosine_per_head():
    a = _one_hot_rows([1, 2, 0], 3)
    b = _one_hot_rows([1, 2, 2], 3)
    both = probes.attention_cosine(np.concatenate([a, a], 1), np.concatenate([a, b], 1))
    np.testing.assert_allclose(both, [[1.0, 2 / 3]])
