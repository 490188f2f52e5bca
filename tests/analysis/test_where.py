"""``--where``: the one parser (pure) and the selection it makes on the shared sweep (conftest.py)."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.data import select
from analysis.data.errors import QueryError
from analysis.data.where import Condition, describe, parse_where

CLS = "synthetic-cls"


@pytest.mark.parametrize(("text", "conditions"), [
    ("", ()),
    ("metrics.accuracy > 0.8 and params.train.lr = 3e-4 and seed != 1",
     (Condition("metrics.accuracy", ">", ("0.8",)), Condition("params.train.lr", "=", ("3e-4",)),
      Condition("seed", "!=", ("1",)))),
    ("task:sst2|ud-pos,seed:0", (Condition("task", "=", ("sst2", "ud-pos")), Condition("seed", "=", ("0",)))),
    ("params.`head_gates.pipeline` IN ('dp', \"sp\") AND metrics.accuracy/ood>=.5",
     (Condition("params.head_gates.pipeline", "=", ("dp", "sp")), Condition("metrics.accuracy/ood", ">=", (".5",)))),
    ("model:random:minilm-l6|minilm-l6", (Condition("model", "=", ("random:minilm-l6", "minilm-l6")),)),
    ("lambda == 0.1 and lambda <= 1 and lambda < 2 and lambda > -1",
     (Condition("lambda", "=", ("0.1",)), Condition("lambda", "<=", ("1",)), Condition("lambda", "<", ("2",)),
      Condition("lambda", ">", ("-1",)))),
])
def test_parse_where_reads_mlflow_style_and_the_short_form(text, conditions):
    assert parse_where(text) == conditions
    assert parse_where(describe(conditions) if conditions else "") == conditions  # what it prints parses back


@pytest.mark.parametrize(("text", "message"), [
    ("metrics.accuracy >", "at its end: expected a value after '>'"),
    ("seed 1", "at '1' (character 6): expected an operator"),
    ("seed = 1 or task = x", "at 'or' (character 10): expected 'and' or ','"),
    ("seed = 1 and", "at its end: expected a condition after 'and'"),
    ("task = 'sst2", "at ''' (character 8): an unmatched quote"),
    ("seed ! 1", "at '!' (character 6): '!' is no operator"),
    ("seed in 1", "at '1' (character 9): expected '(' after IN"),
    ("seed in (1, 2", "at its end: expected ')'"),
    ("= 1", "at '=' (character 1): expected a key"),
])
def test_a_malformed_expression_names_the_bad_token(text, message):
    with pytest.raises(QueryError, match="^--where '.*': " + message.replace("(", r"\(").replace(")", r"\)")):
        parse_where(text)


def _keys(data, text: str) -> set[str]:
    return set(select.select(data, text).run_key.tolist())


def test_comparisons_select_what_numpy_selects(data):
    accuracy, seed = data.metrics["accuracy"], data.seed
    lam = data.labels["lambda"]
    want = set(data.run_key[(accuracy > 0.75) & (seed != 1)].tolist())  # NaN accuracy (pending) is never > 0.75
    assert _keys(data, "metrics.accuracy > 0.75 and seed != 1") == want and 0 < len(want) < len(data)
    assert _keys(data, "params.head_gates.lambda >= 0.05") == set(data.run_key[lam >= 0.05].tolist())
    assert _keys(data, f"lambda < 0.05 and task = {CLS}") == set(data.run_key[(lam < 0.05) & (data.task == CLS)].tolist())
    # = and the short form are one condition; != leaves out runs without the value (the fine-tunes' lambda)
    assert _keys(data, "lambda:0.01|0.1") == _keys(data, "lambda IN (0.01, 0.1)") == set(data.run_key[~np.isnan(lam)].tolist())
    assert _keys(data, "lambda != 0.1") == set(data.run_key[lam == 0.01].tolist())
    assert _keys(data, "metrics.open_heads = 30") == set(data.run_key[data.metrics["open_heads"] == 30].tolist())


@pytest.mark.parametrize(("text", "message"), [
    ("metrics.acc > 0.5", "unknown metric 'acc'; did you mean 'accuracy'"),
    ("params.head_gates.lamda > 0", "unknown axis 'head_gates.lamda'; did you mean 'head_gates.lambda'"),
    ("task > 3", "task is text"),
    ("lambda > high", "lambda > high: lambda is a number, 'high' is not"),
    ("task != synthetic-cl", "no run with task 'synthetic-cl'; did you mean 'synthetic-cls'"),
])
def test_a_bad_key_or_value_is_one_line_naming_it(data, text, message):
    with pytest.raises(QueryError, match=message):
        select.select(data, text)
