"""Config validation and run keys: each method owns its section; every mistake is one line
naming the key, with a suggestion; a run key hashes what the run reads and survives growth."""

import json
import pickle
import types
from pathlib import Path

import pytest
from pydantic import Field

from base.naming import suggest
from base.sections import CONFIG_VERSION, ConfigError, Section, flatten
from experiments.harness import config_keys as keys
from experiments.harness.config import RunConfig, apply_overrides, config_class, parse_config
from experiments.methods import METHODS, check_method, finetune, head_gates

DEFAULTS_FILE = Path(__file__).with_name("config_defaults.json")


def _error(raw, **kw) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(raw, **kw)
    message = str(info.value)
    assert "\n" not in message
    return message


# --------------------------------------------------------------------------- sections


def test_a_run_config_is_the_shared_sections_plus_its_method_section():
    cfg = parse_config({"head_gates": {"lambda": 0.05, "pipeline": "sp"}})
    assert cfg.method == "head_gates" and isinstance(cfg.section, head_gates.Config)
    assert (cfg.section.lambda_, cfg.section.pipeline, cfg.section.lr) == (0.05, "sp", 1e-3)
    # SP starts from a fine-tuned model: head_gates fills that stage by default
    assert list(cfg.to_dict()) == ["seed", "model", "method", "task", "train", "init_from", "head_gates"]
    assert cfg.init_from == {"method": "finetune"} and cfg.upstreams["init_from"].method == "finetune"
    assert cfg.labels() == {"task": "synthetic-cls", "data": "synthetic-cls(data_seed=0)", "model": "minilm-l6",
                            "method": "head_gates", "pipeline": "sp", "seed": 0, "sparsity": None, "lambda": 0.05}
    assert cfg.run_name() == "synthetic-cls-head_gates-sp-seed0"

    ft = parse_config({"method": "finetune"})
    assert isinstance(ft.section, finetune.Config) and list(ft.to_dict())[-1] == "finetune"
    # its pipeline and its own short names are its labels: loss, no pipeline (it has one), sparsity or lambda
    assert ft.labels() == {"task": "synthetic-cls", "data": "synthetic-cls(data_seed=0)", "model": "minilm-l6",
                           "method": "finetune", "seed": 0,
                           "pipeline": None, "loss": "ce"}
    assert ft.run_name() == "synthetic-cls-finetune-seed0"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"train": {"lrr": 1e-4}}, "unknown key 'train.lrr'; did you mean 'train.lr'?"),
        ({"sead": 1}, "unknown key 'sead'; did you mean 'seed'?"),
        ({"task": {"nmae": "sst2"}}, "unknown key 'task.nmae'; did you mean 'task.name'?"),
        ({"trian": {}}, "unknown key 'trian'; did you mean 'train'?"),
        # a method's key at the top or in a shared section: the dotted key where it lives
        ({"lambda": 0.1}, "unknown key 'lambda'; did you mean 'head_gates.lambda'?"),
        ({"train": {"sparsity": 0.5}}, "unknown key 'train.sparsity'; did you mean 'head_gates.sparsity'?"),
        ({"gates": {"lambda": 0.1}}, "unknown key 'gates'; did you mean 'head_gates'?"),  # the old section
        # an unknown key in the method's own section
        ({"head_gates": {"lamda": 0.1}}, "unknown key 'head_gates.lamda'; did you mean 'head_gates.lambda'?"),
        ({"method": "finetune", "finetune": {"lambda": 0.1}},
         "unknown key 'finetune.lambda'; 'lambda' is a key of method 'head_gates', not of 'finetune'"),
        # the section of another method
        ({"method": "finetune", "head_gates": {"lambda": 0.1}},
         "section 'head_gates' belongs to method 'head_gates', this run's method is 'finetune'"),
    ],
)
def test_unknown_keys_and_wrong_sections_name_the_key_and_suggest(raw, expected):
    assert _error(raw) == expected


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"head_gates": {"lambda": -0.1}}, "head_gates.lambda: Input should be greater than or equal to 0 (got -0.1)"),
        ({"head_gates": {"sparsity": 1.5}}, "head_gates.sparsity: Input should be less than 1 (got 1.5)"),
        ({"head_gates": 3}, "head_gates: Input should be a valid dictionary or instance of Config (got 3)"),
        ({"train": {"batch_size": 0}}, "train.batch_size: Input should be greater than 0 (got 0)"),
        ({"seed": "zero"}, "seed: Input should be a valid integer, unable to parse string as an integer (got 'zero')"),
    ],
)
def test_bad_values_name_the_key(raw, expected):
    assert _error(raw) == expected


def test_unknown_names_suggest_the_nearest():
    assert "did you mean 'minilm-l6'?" in _error({"model": "minlm-l6"})
    assert "did you mean 'sst2'?" in _error({"task": {"name": "sst-2"}})
    assert _error({"method": "head-gates"}) == "method: unknown method 'head-gates'; did you mean 'head_gates'?"
    assert _error({"method": "xyzzy"}) == f"method: unknown method 'xyzzy' (methods: {', '.join(METHODS)})"
    assert list(METHODS)[:2] == ["head_gates", "finetune"]
    assert _error({"head_gates": {"pipeline": "spp"}}) == (
        "head_gates.pipeline: method 'head_gates' has no pipeline 'spp' (it has dp, sp); did you mean 'sp'?")


def test_missing_data_file_fails_at_validation(tmp_path):
    message = _error({"task": {"name": "sst2", "data_dir": str(tmp_path)}})
    assert "train.tsv" in message and str(tmp_path) in message
    parse_config({"task": {"name": "sst2", "data_dir": str(tmp_path)}}, check_files=False)


def test_overrides_address_any_key_and_the_method_short_names():
    raw = apply_overrides({"train": {"lr": 1e-5}}, ["train.lr=2e-4", "lambda=0.5", "head_gates.lr=0.1",
                                                     "pipeline=sp", "task=synthetic-tag", "task.max_train=10"])
    cfg = parse_config(raw)
    assert (cfg.train.lr, cfg.section.lambda_, cfg.section.lr, cfg.section.pipeline) == (2e-4, 0.5, 0.1, "sp")
    assert (cfg.task.name, cfg.task.max_train) == ("synthetic-tag", 10)
    flat = flatten(cfg.to_dict())
    assert flat["head_gates.lambda"] == 0.5 and flat["init_from.method"] == "finetune"  # SP's default stage
    assert {k for k in flat if not k.startswith("init_from.")} <= set(keys.valid_keys("head_gates"))
    assert {"seed", "train.lr", "task.max_train", "head_gates.sp_finetune_steps"} <= set(flat)
    # short names resolve through the method the overrides leave: finetune has no lambda
    raw = apply_overrides({}, ["method=finetune", "lambda=0.5"])
    assert raw == {"method": "finetune", "lambda": 0.5}
    assert _error(raw) == "unknown key 'lambda'; 'lambda' is a key of method 'head_gates', not of 'finetune'"
    assert parse_config({"method": "finetune", "seed": 1}) == parse_config(apply_overrides({}, ["method=finetune", "seed=1"]))
    with pytest.raises(ConfigError, match="key=value"):
        apply_overrides({}, ["train.lr"])


def test_one_suggest_for_every_did_you_mean():
    assert suggest("lamda", ["lambda", "seed"]) == "; did you mean 'lambda'?"
    assert suggest("zzz", ["lambda", "seed"]) == ""


def test_config_is_frozen_pickles_and_copies_without_stale_keys():
    from pydantic import ValidationError

    cfg = parse_config({"seed": 1})
    with pytest.raises(ValidationError, match="frozen"):
        cfg.seed = 3
    assert pickle.loads(pickle.dumps(cfg)) == cfg and pickle.loads(pickle.dumps(cfg)).run_key == cfg.run_key
    assert cfg.model_copy(update={"seed": 2}).run_key == parse_config({"seed": 2}).run_key


@pytest.mark.parametrize("raw", [
    {"seed": 1, "head_gates": {"lambda": 0.05}},
    {"seed": 1, "head_gates": {"pipeline": "sp"}},  # a default stage: its fine-tune follows the seed
    {"seed": 1, "init_from": {"method": "finetune", "train": {"max_steps": 7}}},
    {"seed": 1, "init_from": {"method": "finetune", "seed": 9}},  # the stage fixes its seed
    {"seed": 1, "head_gates": {"pipeline": "sp"}, "teacher": {"method": "finetune", "init_from": {"method": "finetune"}}},
])
def test_with_seed_equals_validating_the_config_with_that_seed(raw):
    """The grid's fast path: keys, upstreams and the dict of ``with_seed`` are those of a fresh parse."""
    template = parse_config(raw, check_files=False)
    for seed in (0, 4):
        fast, slow = template.with_seed(seed), parse_config({**raw, "seed": seed}, check_files=False)
        assert fast == slow and fast.to_dict() == slow.to_dict()
        assert (fast.run_key, fast.group_key) == (slow.run_key, slow.group_key)
        assert {role: (up.run_key, up.seed) for role, up in fast.upstreams.items()} == {
            role: (up.run_key, up.seed) for role, up in slow.upstreams.items()}
    assert template.with_seed(4) is template.with_seed(4)  # an upstream shared by many cells: one copy per seed
    assert template.with_seed(4).run_key != template.run_key and template.with_seed(4).group_key == template.group_key


def test_every_method_keeps_the_contract():
    for name, module in METHODS.items():
        check_method(name, module)
        assert issubclass(config_class(name), RunConfig)
    broken = types.ModuleType("broken")
    broken.VERSION, broken.PIPELINES, broken.run = "1", ("a", "b"), lambda cfg, ctx: None
    broken.Config = type("Config", (Section,), {})
    with pytest.raises(TypeError, match="Config needs a key 'pipeline' defaulting to 'a'"):
        check_method("broken", broken)
    with pytest.raises(TypeError, match="identifier other than"):
        check_method("train", head_gates)


@pytest.mark.parametrize("reference, message", [
    ({"lamda": 0.1}, "REFERENCE names 'lamda', not a key of its Config"),
    ({"lambda": "high"}, "REFERENCE value 'high' of 'lambda' is not a valid value"),
    ({"lambda": 0.01}, "REFERENCE value of 'lambda' is its default"),
])
def test_reference_protocol_keys_are_checked(reference, message):
    """REFERENCE lists the keys whose default is not the paper's protocol, with the value restoring it."""
    module = types.ModuleType("gates_like")
    for attr in ("VERSION", "PIPELINES", "Config", "SHORT_NAMES", "run"):
        setattr(module, attr, getattr(head_gates, attr))
    module.REFERENCE = {"lambda": 0.05}
    check_method("gates_like", module)  # a real key, a valid value, not the default
    module.REFERENCE = reference
    with pytest.raises(TypeError, match=message):
        check_method("gates_like", module)


# --------------------------------------------------------------------------- run keys

PINNED = {
    "model": "tiny-bert",
    "seed": 3,
    "task": {"name": "synthetic-cls", "num_train": 64, "max_length": 24},
    "train": {"max_steps": 6, "lr": 1e-3},
    "head_gates": {"lambda": 0.5, "pipeline": "sp"},
}


def test_run_key_of_a_fixed_config_is_pinned():
    """The literal keys: adding a key with a default, or a method, must never change them."""
    cfg = parse_config(PINNED)
    # head_gates VERSION 2; SP: the key holds its default init_from fine-tune's key
    assert (cfg.run_key, cfg.group_key) == ("0f44080eb8d0e2cf", "b5f8c5b6aac05efd")
    ft = parse_config({"method": "finetune", "model": "tiny-bert", "seed": 3, "train": {"max_steps": 6}})
    assert (ft.run_key, ft.group_key) == ("79d500251385e279", "af17ab6bbf173dc2")


def test_run_key_hashes_what_the_run_reads():
    a = parse_config({"seed": 1})
    assert a.run_key == parse_config({"seed": 1}).run_key and len(a.run_key) == 16
    assert a.run_key != a.group_key  # the seed is always in the run key, never in the group key
    c = parse_config({"seed": 2})
    assert c.run_key != a.run_key and c.group_key == a.group_key
    assert parse_config({"seed": 1, "head_gates": {"lambda": 0.02}}).group_key != a.group_key
    # an explicit default is the same run as an omitted one, in a shared and in a method section
    assert parse_config({"seed": 1, "train": {"lr": 5e-5}, "head_gates": {"lambda": 0.01}}).run_key == a.run_key
    assert parse_config({"method": "finetune", "seed": 1}).run_key != a.run_key


def _with_config(monkeypatch, name, config_cls, version=None):
    module = types.ModuleType(f"patched_{name}")
    module.__dict__.update({k: v for k, v in vars(METHODS[name]).items() if not k.startswith("__")})
    module.Config = config_cls
    if version is not None:
        module.VERSION = version
    monkeypatch.setitem(METHODS, name, module)


def test_a_new_key_with_a_default_keeps_existing_keys(monkeypatch):
    before = parse_config(PINNED)
    ft_before = parse_config({"method": "finetune", "seed": 3})

    class Grown(head_gates.Config):
        temperature: float = Field(2.0, gt=0, description="A key added later.")

    _with_config(monkeypatch, "head_gates", Grown)
    after = parse_config(PINNED)
    assert after.section.temperature == 2.0 and after.run_key == before.run_key
    assert parse_config({**PINNED, "head_gates": {**PINNED["head_gates"], "temperature": 3.0}}).run_key != before.run_key
    assert parse_config({"method": "finetune", "seed": 3}).run_key == ft_before.run_key  # other methods untouched


def test_another_methods_defaults_never_enter_a_run_key(monkeypatch):
    ft = parse_config({"method": "finetune", "seed": 3}).run_key

    class Changed(head_gates.Config):
        lr: float = Field(0.5, gt=0, le=1, description="A changed default.")

    _with_config(monkeypatch, "head_gates", Changed, version="2")
    assert parse_config({"method": "finetune", "seed": 3}).run_key == ft


def test_the_method_and_task_versions_and_the_data_fingerprint_are_in_the_key(monkeypatch):
    from experiments.tasks import TASKS

    base = parse_config(PINNED).run_key
    _with_config(monkeypatch, "head_gates", head_gates.Config, version="3")
    assert parse_config(PINNED).run_key != base
    monkeypatch.undo()
    task = types.ModuleType("fingerprinted")
    task.__dict__.update({k: v for k, v in vars(TASKS["synthetic-cls"]).items() if not k.startswith("__")})
    task.fingerprint = lambda task_cfg: "0123456789abcdef"
    monkeypatch.setitem(TASKS, "synthetic-cls", task)
    assert parse_config(PINNED).run_key != base
    task.fingerprint = lambda task_cfg: None  # generated data: no files, nothing added
    assert parse_config(PINNED).run_key == base


# --------------------------------------------------------------------------- defaults need a VERSION bump


def _check_defaults(what: str, version: str, code: dict, recorded_versions: dict) -> None:
    """The recorded defaults of ``version`` must be the code's: a changed default needs a bump."""
    recorded = recorded_versions.get(version)
    assert recorded is not None, f"{what}: VERSION {version} has no defaults in {DEFAULTS_FILE.name}: record them"
    missing = object()
    changed = {k: (v, code.get(k, "<removed>")) for k, v in recorded.items() if code.get(k, missing) != v}
    assert not changed, (
        f"{what}: defaults changed under the same VERSION {version} (recorded, now): {changed}. Run keys leave "
        f"defaults out, so bump the VERSION and record the new defaults in {DEFAULTS_FILE.name}")
    added = sorted(set(code) - set(recorded))
    assert not added, (f"{what}: new keys {added}: record their defaults under VERSION {version} in "
                       f"{DEFAULTS_FILE.name} (a key added with a default keeps run keys: no bump needed)")


def _recorded() -> dict:
    return json.loads(DEFAULTS_FILE.read_text())


def test_shared_defaults_match_their_version():
    code = {k: v for k, v in keys.defaults(RunConfig).items() if k != "method"}
    _check_defaults("shared sections (CONFIG_VERSION)", CONFIG_VERSION, code, _recorded()["shared"])


@pytest.mark.parametrize("name", list(METHODS))
def test_method_defaults_match_their_version(name):
    module = METHODS[name]
    _check_defaults(name, module.VERSION, keys.defaults(module.Config), _recorded()["methods"][name])


def test_changing_a_default_without_a_version_bump_fails():
    class Changed(head_gates.Config):
        lr: float = Field(0.5, gt=0, le=1, description="A changed default.")

    recorded = _recorded()["methods"]["head_gates"]
    with pytest.raises(AssertionError, match="bump the VERSION"):
        _check_defaults("head_gates", head_gates.VERSION, keys.defaults(Changed), recorded)
    with pytest.raises(AssertionError, match="has no defaults"):  # bumped but not recorded
        _check_defaults("head_gates", "99", keys.defaults(Changed), recorded)
