"""Config validation: every mistake is one line naming the key, with a suggestion."""

import pytest

from experiments.config import (
    ConfigError,
    RunConfig,
    apply_overrides,
    flatten,
    parse_config,
    valid_keys,
)


def _error(raw, **kw) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(raw, **kw)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_defaults_are_valid_and_fill_the_method_pipeline():
    cfg = parse_config({})
    assert cfg.method == "head_gates" and cfg.pipeline == "dp"
    assert parse_config({"method": "finetune"}).pipeline == "none"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"train": {"lrr": 1e-4}}, "unknown key 'train.lrr'; did you mean 'train.lr'?"),
        ({"lambda": 0.1}, "unknown key 'lambda'; did you mean 'gates.lambda'?"),
        ({"sead": 1}, "unknown key 'sead'; did you mean 'seed'?"),
        ({"task": {"nmae": "sst2"}}, "did you mean 'task.name'?"),
    ],
)
def test_unknown_keys_name_the_key_and_suggest(raw, expected):
    assert expected in _error(raw)


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"gates": {"lambda": -0.1}}, "gates.lambda"),
        ({"sparsity": 1.5}, "sparsity"),
        ({"train": {"batch_size": 0}}, "train.batch_size"),
        ({"seed": "zero"}, "seed"),
    ],
)
def test_values_out_of_range_name_the_key(raw, key):
    assert _error(raw).startswith(f"{key}:")


def test_unknown_names_suggest_the_nearest():
    assert "did you mean 'minilm-l6'?" in _error({"model": "minlm-l6"})
    assert "did you mean 'sst2'?" in _error({"task": {"name": "sst-2"}})
    assert "did you mean 'head_gates'?" in _error({"method": "head-gates"})
    assert "has no pipeline 'ft'" in _error({"method": "head_gates", "pipeline": "ft"})


def test_missing_data_file_fails_at_validation(tmp_path):
    message = _error({"task": {"name": "sst2", "data_dir": str(tmp_path)}})
    assert "train.tsv" in message and str(tmp_path) in message
    parse_config({"task": {"name": "sst2", "data_dir": str(tmp_path)}}, check_files=False)


def test_run_key_is_stable_and_group_key_ignores_the_seed():
    a, b = parse_config({"seed": 1}), parse_config({"seed": 1})
    assert a.run_key == b.run_key and len(a.run_key) == 16
    c = parse_config({"seed": 2})
    assert c.run_key != a.run_key and c.group_key == a.group_key
    assert parse_config({"seed": 1, "gates": {"lambda": 0.02}}).group_key != a.group_key
    # an explicit default is the same run as an omitted one
    assert parse_config({"seed": 1, "train": {"lr": 5e-5}}).run_key == a.run_key


def test_overrides_and_flatten():
    raw = apply_overrides({"train": {"lr": 1e-5}}, ["train.lr=2e-4", "gates.lambda=0.5", "seed=3"])
    cfg = parse_config(raw)
    assert (cfg.train.lr, cfg.gates.lambda_, cfg.seed) == (2e-4, 0.5, 3)
    flat = flatten(cfg.to_dict())
    assert flat["gates.lambda"] == 0.5 and flat["task.name"] == "synthetic-cls"
    assert set(flat) == set(valid_keys())
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides({}, ["train.lr"])


def test_config_is_frozen():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="frozen"):
        RunConfig().seed = 3
