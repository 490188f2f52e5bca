"""Grid spec validation and expansion: pure, no database."""

from __future__ import annotations

import itertools
import re
import textwrap
import time

import pytest
import yaml

import orchestrator.driving.grid as grid
from base.sections import ConfigError
from experiments.harness.config import parse_config
from orchestrator.driving.grid import Resources, check_resources, expand, load_grid, parse_grid


def _spec(**fields):
    return parse_grid({"name": "test", **fields})


def _error(fn, *args) -> str:
    with pytest.raises(ConfigError) as info:
        fn(*args)
    message = str(info.value)
    assert "\n" not in message, "errors are one line"
    return message


# --------------------------------------------------------------------------- expansion


def test_product_count_and_order_first_axis_slowest():
    configs = expand(_spec(axes={"seed": [0, 1, 2], "task": ["synthetic-cls", "synthetic-tag"]}))
    assert [(c.seed, c.task.name) for c in configs] == [
        (0, "synthetic-cls"), (0, "synthetic-tag"), (1, "synthetic-cls"),
        (1, "synthetic-tag"), (2, "synthetic-cls"), (2, "synthetic-tag"),
    ]
    assert len({c.run_key for c in configs}) == 6
    assert len({c.group_key for c in configs}) == 2  # a group is a cell without its seed


def test_base_and_shorthands_apply():
    spec = _spec(
        base={"method": "head_gates", "train": {"max_steps": 7}, "task": {"max_train": 100}},
        axes={"task": ["synthetic-cls"], "lambda": [0.1, 0.2], "train.lr": [1e-4]},
    )
    assert list(spec.axes) == ["task.name", "lambda", "train.lr"]  # short names resolve per cell
    configs = expand(spec)
    assert [c.section.lambda_ for c in configs] == [0.1, 0.2]
    assert {(c.train.max_steps, c.train.lr, c.task.max_train, c.task.name) for c in configs} == {
        (7, 1e-4, 100, "synthetic-cls")
    }


def test_cells_equal_parse_config_of_the_same_dicts():
    """The fast path (cached names) gives exactly parse_config's configs."""
    spec = _spec(
        base={"train": {"max_steps": 5}},
        axes={"method": ["head_gates", "finetune"], "seed": [0, 1], "sparsity": [None, 0.5]},
    )
    expected = [
        parse_config({"train": {"max_steps": 5}, "method": "head_gates", "seed": s, "head_gates": {"sparsity": p}},
                     check_files=False)
        for s in (0, 1) for p in (None, 0.5)
    ] + [parse_config({"train": {"max_steps": 5}, "method": "finetune", "seed": s}, check_files=False) for s in (0, 1)]
    configs = expand(spec)
    assert configs == expected  # finetune has no sparsity: its cells differ only by seed
    assert [c.run_key for c in configs] == [c.run_key for c in expected]
    assert {c.labels().get("pipeline") for c in configs} == {"dp", None}  # head_gates' default; finetune has none


def test_cells_that_differ_by_seed_equal_parse_config_with_stages():
    """Cells that differ only by seed reuse the first one's validation (``with_seed``): same configs,
    keys and upstreams as validating each."""
    spec = _spec(base={"init_from": {"method": "finetune"}}, axes={"lambda": [0.1, 0.2], "seed": [0, 1, 2]})
    configs = expand(spec)
    expected = [parse_config({"init_from": {"method": "finetune"}, "head_gates": {"lambda": lam}, "seed": s},
                             check_files=False) for lam in (0.1, 0.2) for s in (0, 1, 2)]
    assert configs == expected
    assert [(c.run_key, c.group_key, c.upstreams["init_from"].run_key) for c in configs] == [
        (c.run_key, c.group_key, c.upstreams["init_from"].run_key) for c in expected]


def test_a_bad_seed_fails_even_after_good_cells():
    with pytest.raises(ConfigError, match=r"cell 2 \(seed=-1\): seed: .*greater than or equal to 0"):
        expand(_spec(axes={"seed": [0, 1, -1]}))


def test_a_methods_keys_apply_to_its_own_cells_only():
    """The documented behaviour: lambda varies the head_gates cells; finetune's equal cells are one run."""
    spec = _spec(
        base={"head_gates": {"lr": 0.05}, "train": {"max_steps": 3}},
        axes={"method": ["head_gates", "finetune"], "lambda": [0.01, 0.1], "seed": [0, 1]},
        exclude=[{"lambda": 0.1, "seed": 1}],  # a short name in an exclude: only head_gates cells have it
    )
    configs = expand(spec)
    assert [(c.method, c.labels().get("lambda"), c.seed) for c in configs] == [
        ("head_gates", 0.01, 0), ("head_gates", 0.01, 1), ("head_gates", 0.1, 0),
        ("finetune", None, 0), ("finetune", None, 1),
    ]
    assert {c.section.lr for c in configs if c.method == "head_gates"} == {0.05}
    assert all(set(c.to_dict()) == {"seed", "model", "method", "task", "train", "finetune"}
               for c in configs if c.method == "finetune")


def test_any_key_of_any_section_is_an_axis():
    spec = _spec(axes={"head_gates.lr": [0.1, 0.2], "train.lr": [1e-4], "task.max_train": [10], "pipeline": ["sp"]})
    configs = expand(spec)
    assert [(c.section.lr, c.train.lr, c.task.max_train, c.section.pipeline) for c in configs] == [
        (0.1, 1e-4, 10, "sp"), (0.2, 1e-4, 10, "sp")]


def test_exclude_drops_matching_cells_before_validation():
    spec = _spec(
        axes={"pipeline": ["dp", "sp", "none"], "seed": [0, 1], "train.lr": [1e-4, 2.0]},
        exclude=[{"pipeline": "none"}, {"train.lr": 2.0}],  # invalid cells: never validated
    )
    configs = expand(spec)
    assert sorted({(c.section.pipeline, c.train.lr) for c in configs}) == [("dp", 1e-4), ("sp", 1e-4)]
    assert len(configs) == 4


def test_exclude_on_a_non_axis_key_compares_the_base_or_default():
    axes = {"seed": [0, 1], "task": ["synthetic-cls", "synthetic-tag"]}
    matching = _spec(base={"train": {"lr": 1e-4}}, axes=axes,
                     exclude=[{"train.lr": 1e-4, "task": "synthetic-tag"}])
    assert {c.task.name for c in expand(matching)} == {"synthetic-cls"}
    default = _spec(axes=axes, exclude=[{"train": {"batch_size": 32}, "seed": 1}])  # 32 is the default
    assert {c.seed for c in expand(default)} == {0}
    other = _spec(base={"train": {"lr": 2e-4}}, axes=axes, exclude=[{"train.lr": 1e-4}])
    assert len(expand(other)) == 4


def test_include_adds_cells_merged_onto_base_dotted_or_nested():
    spec = _spec(
        base={"train": {"max_steps": 3}},
        axes={"seed": [0, 1]},
        exclude=[{"seed": 1}],
        include=[
            {"seed": 1, "task": "synthetic-tag"},  # excludes do not apply to includes
            {"seed": 5, "train": {"lr": 1e-4}},
            {"seed": 6, "head_gates.lambda": 0.5},
        ],
    )
    configs = expand(spec)
    assert [(c.seed, c.task.name, c.train.lr, c.section.lambda_, c.train.max_steps) for c in configs] == [
        (0, "synthetic-cls", 5e-5, 0.01, 3),
        (1, "synthetic-tag", 5e-5, 0.01, 3),
        (5, "synthetic-cls", 1e-4, 0.01, 3),
        (6, "synthetic-cls", 5e-5, 0.5, 3),
    ]


def test_duplicate_cells_are_kept_once():
    spec = _spec(axes={"seed": [0, 1, 0]}, include=[{"seed": 1}, {"seed": 2}])
    assert [c.seed for c in expand(spec)] == [0, 1, 2]
    assert [c.seed for c in expand(_spec(axes={"train.lr": [1e-4, 0.0001]}))] == [0]
    # defaults written out (and the default pipeline) make the same run: one cell
    same = _spec(axes={"seed": [0]}, include=[{"seed": 0, "train.lr": 5e-5, "pipeline": "dp"}])
    assert len(expand(same)) == 1


def test_no_axes_is_one_cell_of_the_base():
    assert [c.seed for c in expand(_spec(base={"seed": 3}))] == [3]


def test_data_is_checked_once_per_task_and_data_dir(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(grid, "check_data", lambda cfg: calls.append((cfg.task.name, cfg.task.data_dir)))
    for folder, name in itertools.product("ab", ("sst2/train.tsv", "sst2/dev.tsv", "ud_ewt/en_ewt-ud-dev.conllu",
                                                 "ud_ewt/en_ewt-ud-test.conllu")):
        (tmp_path / folder / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / name).write_text(f"{folder} {name}\n")  # hashed for the run key, never read here
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    expand(_spec(axes={"seed": list(range(50)), "task": ["sst2", "ud-pos"], "task.data_dir": [a, b]}))
    assert sorted(calls) == [("sst2", a), ("sst2", b), ("ud-pos", a), ("ud-pos", b)]
    # the synthetic tasks read no data_dir: a grid that sets it for them only is refused (issue 43)
    with pytest.raises(ConfigError, match=r"^axes: 'task.data_dir' applies to no cell: the synthetic-cls task does "
                                          r"not read task.data_dir; the tasks sst2, ud-pos, ud-dep, classification, "):
        expand(_spec(axes={"task": ["synthetic-cls", "synthetic-tag"], "task.data_dir": [a, b]}))


def test_ten_thousand_cells():
    spec = _spec(
        base={"train": {"max_steps": 100}},
        axes={
            "seed": list(range(25)),
            "task": ["synthetic-cls", "synthetic-tag"],
            "lambda": [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0],
            "train.lr": [1e-5, 2e-5, 5e-5, 1e-4],
            "sparsity": [0.1, 0.3, 0.5, 0.7, 0.9],
        },
    )
    assert spec.cell_count() == 10_000
    start = time.process_time()  # this process's CPU time: other work on the machine does not count
    configs = expand(spec)
    seconds = time.process_time() - start
    assert len(configs) == 10_000
    assert len({c.run_key for c in configs}) == 10_000
    assert seconds < 5, f"expand took {seconds:.2f} s of CPU (benchmark target < 1 s; this bound is lenient)"


# --------------------------------------------------------------------------- loading


def test_module_docstring_example_loads_and_expands(tmp_path, shared_data):
    example = textwrap.dedent(grid.__doc__.split("A grid file::")[1].split("\n\nKeys ")[0])
    path = tmp_path / "grid.yaml"
    path.write_text(example)
    spec = load_grid(path)
    assert spec.name == "stem-cells" and spec.resources == Resources(cpus=1, gpus=0.25)
    assert spec.max_concurrent == 8 and spec.max_failures == 1
    configs = expand(spec)
    assert len(configs) == 2 * 2 * 3 - 3 + 1
    assert configs[-1].task.name == "ud-pos" and configs[-1].train.lr == 1e-4


def test_yaml_exponent_without_dot_is_a_float(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text("name: lr\naxes:\n  train.lr: [1e-4, 3E-5, 2.0e-5]\nexclude:\n  - {train.lr: 3e-5}\n")
    spec = load_grid(path)
    assert spec.axes["train.lr"] == [1e-4, 3e-5, 2e-5]
    assert [c.train.lr for c in expand(spec)] == [1e-4, 2e-5]


def test_defaults():
    spec = _spec()
    assert spec.resources == Resources(cpus=1.0, gpus=0.0)
    assert spec.max_concurrent is None and spec.max_failures == 1
    assert spec.axes == {} and spec.include == [] and spec.exclude == []


# --------------------------------------------------------------------------- bad input


def test_malformed_yaml_names_file_and_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\naxes:\n  seed: [0, 1\n  task: [sst2]\n")
    message = _error(load_grid, path)
    assert message.startswith(f"{path}:") and re.search(r"line \d+", message)


def test_missing_file_and_non_mapping(tmp_path):
    assert "no such file" in _error(load_grid, tmp_path / "nope.yaml")
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    assert "mapping" in _error(load_grid, path)


def test_errors_from_a_file_name_the_file(tmp_path):
    path = tmp_path / "grid.yaml"
    path.write_text("name: x\naxis:\n  seed: [0]\n")
    assert _error(load_grid, path) == f"{path}: unknown key 'axis'; did you mean 'axes'?"


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"axis": {"seed": [0]}}, "unknown key 'axis'; did you mean 'axes'?"),
        ({"axes": {"lamda": [0.1]}}, "axes: unknown key 'lamda'; did you mean 'lambda'?"),
        ({"axes": {"train.lrr": [0.1]}}, "axes: unknown key 'train.lrr'; did you mean 'train.lr'?"),
        ({"axes": {"max_train": [10]}}, "axes: unknown key 'max_train'; did you mean 'task.max_train'?"),
        ({"axes": {"head_gates.lamda": [0.1]}}, "axes: unknown key 'head_gates.lamda'; did you mean 'head_gates.lambda'?"),
        ({"axes": {"gates.lambda": [0.1]}}, "axes: unknown key 'gates.lambda'; did you mean 'head_gates.lambda'?"),
        ({"base": {"finetune": {"lr": 0.1}}}, "base: unknown key 'finetune.lr'; did you mean 'train.lr'?"),
        ({"axes": {"sed": [0]}}, "axes: unknown key 'sed'; did you mean 'seed'?"),
        ({"axes": {"seed": []}}, "axes.seed: empty list (an axis needs at least one value)"),
        ({"axes": {"task": ["sst2"], "task.name": ["ud-pos"]}}, "axes: 'task' and 'task.name' are the same key 'task.name'"),
        ({"base": {"train": {"lrr": 0.1}}}, "base: unknown key 'train.lrr'; did you mean 'train.lr'?"),
        ({"include": [{"seed": 0}, {"sede": 1}]}, "include[1]: unknown key 'sede'; did you mean 'seed'?"),
        ({"exclude": [{"tsk": "sst2"}]}, "exclude[0]: unknown key 'tsk'; did you mean 'task'?"),
        ({"resources": {"cpu": 2}}, "resources: unknown key 'cpu'; did you mean 'cpus'?"),
        ({"resources": {"cpus": 0}}, "resources.cpus: Input should be greater than 0 (got 0)"),
        ({"resources": {"gpus": -1}}, "resources.gpus: Input should be greater than or equal to 0 (got -1)"),
        ({"max_failures": -1}, "max_failures: Input should be greater than or equal to 0 (got -1)"),
        ({"max_concurrent": 0}, "max_concurrent: Input should be greater than 0 (got 0)"),
        ({"axes": {"seed": 3}}, "axes.seed: Input should be a valid list (got 3)"),
    ],
)
def test_bad_spec(fields, expected):
    assert _error(parse_grid, {"name": "test", **fields}) == expected


def test_bad_name():
    assert _error(parse_grid, {"name": "My Sweep"}).startswith("name: String should match pattern")
    assert _error(parse_grid, {"axes": {"seed": [0]}}) == "name: Field required (got {'axes': {'seed': [0]}})"


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"axes": {"seed": [0, "a"]}},
            "cell 1 (seed=a): seed: Input should be a valid integer, unable to parse string as an integer (got 'a')",
        ),
        (
            {"axes": {"seed": [0, 1], "task": ["synthetic-cls", "synthetic-tag"], "train.lr": [1e-4, 2]}},
            "cell 1 (seed=0, task.name=synthetic-cls, train.lr=2): "
            "train.lr: Input should be less than or equal to 1 (got 2)",
        ),
        (
            {"axes": {"task": ["synthetic-cls", "sst3"]}},
            "cell 1 (task.name=sst3): task.name: unknown task 'sst3'; did you mean 'sst2'?",
        ),
        (
            {"axes": {"method": ["head_gate"]}},
            "cell 0 (method=head_gate): method: unknown method 'head_gate'; did you mean 'head_gates'?",
        ),
        (
            {"axes": {"pipeline": ["dp", "ft"]}},
            "cell 1 (pipeline=ft): head_gates.pipeline: method 'head_gates' has no pipeline 'ft' (it has dp, sp)",
        ),
        (
            {"axes": {"head_gates.lambda": [0.1, -1]}},
            "cell 1 (head_gates.lambda=-1): head_gates.lambda: Input should be greater than or equal to 0 (got -1)",
        ),
        (
            {"axes": {"method": ["head_gates", "finetune"]}, "include": [{"method": "finetune", "lambda": 0.1}]},
            "cell 2 (include[0]: method=finetune, lambda=0.1): 'lambda' is not a key of method 'finetune' "
            "(it is a key of head_gates, multitask)",
        ),
        (
            {"axes": {"lambda": [0.1], "head_gates.lambda": [0.2]}},
            "cell 0 (lambda=0.1, head_gates.lambda=0.2): 'lambda' and 'head_gates.lambda' are the same key "
            "'head_gates.lambda'",
        ),
        (
            {"axes": {"method": ["finetune"], "pipeline": ["dp"]}},
            "axes: 'pipeline' applies to no cell: it is a key of head_gates, mask_train, imp, multitask, and this grid's cells run finetune",
        ),
        (
            {"axes": {"method": ["finetune"], "lambda": [0.1]}},
            "axes: 'lambda' applies to no cell: it is a key of head_gates, multitask, and this grid's cells run finetune",
        ),
        (
            {"base": {"method": "finetune", "head_gates": {"lr": 0.1}}, "axes": {"seed": [0, 1]}},
            "base: 'head_gates.lr' applies to no cell: it is a key of head_gates, and this grid's cells run finetune",
        ),
        (
            {"axes": {"seed": [0]}, "include": [{"seed": 2, "train.batch_size": 0}]},
            "cell 1 (include[0]: seed=2, train.batch_size=0): "
            "train.batch_size: Input should be greater than 0 (got 0)",
        ),
    ],
)
def test_bad_cell_names_index_axis_values_and_key(fields, expected):
    assert _error(expand, _spec(**fields)) == expected


def test_unknown_model_names_the_model():
    message = _error(expand, _spec(axes={"model": ["minilm-l7"]}))
    assert message.startswith("cell 0 (model=minilm-l7): model: unknown model 'minilm-l7': did you mean")


def test_missing_data_names_the_cell_and_file(tmp_path):
    message = _error(expand, _spec(axes={"seed": [0], "task": ["sst2"]}, base={"task": {"data_dir": str(tmp_path)}}))
    assert message.startswith("cell 0 (seed=0, task.name=sst2): task 'sst2':")
    assert "train.tsv not found" in message and str(tmp_path) in message


def test_an_error_in_an_excluded_cell_is_not_raised():
    spec = _spec(axes={"seed": [0, "a"]}, exclude=[{"seed": "a"}])
    assert [c.seed for c in expand(spec)] == [0]


def test_yaml_booleans_do_not_match_integers_in_exclude():
    spec = _spec(axes={"seed": [0, 1]}, exclude=[{"seed": True}])
    assert [c.seed for c in expand(spec)] == [0, 1]


# --------------------------------------------------------------------------- resources


def test_resources_fit_a_node():
    check_resources(Resources(cpus=2, gpus=0.5), {"CPU": 16.0, "GPU": 1.0})
    check_resources({"cpus": 1}, [{"CPU": 1.0}])  # no GPU asked: a CPU-only node fits
    check_resources(Resources(cpus=4, gpus=1), [{"CPU": 2, "GPU": 1}, {"CPU": 8, "GPU": 2}])


@pytest.mark.parametrize(
    ("resources", "cluster"),
    [
        (Resources(cpus=1, gpus=1), {"CPU": 16.0}),
        (Resources(cpus=32), {"CPU": 16.0, "GPU": 1.0}),
        (Resources(cpus=4, gpus=1), [{"CPU": 8}, {"CPU": 2, "GPU": 1}]),  # the total would fit, no node does
        (Resources(), []),
    ],
)
def test_resources_no_node_fits(resources, cluster):
    message = _error(check_resources, resources, cluster)
    assert message.startswith(f"resources: a trial needs {resources.cpus:g} CPU and {resources.gpus:g} GPU")


def test_resources_validate_plain_dicts():
    with pytest.raises(Exception, match="cpus"):
        check_resources({"cpus": 0}, {"CPU": 1})


def test_spec_round_trips_through_yaml():
    spec = _spec(axes={"task": ["sst2"], "seed": [0, 1]}, include=[{"lambda": 0.5}])
    again = parse_grid(yaml.safe_load(yaml.safe_dump(spec.model_dump())))
    assert again == spec


@pytest.mark.parametrize("name", ["grid_demo.yaml", "grid_stem_cell.yaml", "grid_shortcut.yaml", "grid_sparse_robust.yaml", "grid_sst2_masks.yaml",
                                  "grid_skill_neurons.yaml", "grid_multitask.yaml", "grid_skill_transfer.yaml"])
def test_every_example_grid_expands(name, shared_data):
    from pathlib import Path

    from orchestrator.registry.stages import dag_summary, with_upstreams

    spec = load_grid(Path(__file__).resolve().parents[2] / "examples" / name)
    keyed, edges = with_upstreams(expand(spec))
    stageless = ("grid_demo.yaml", "grid_skill_neurons.yaml", "grid_multitask.yaml")  # grids whose runs start from no other run
    assert keyed and dag_summary(keyed, edges)["upstream"] >= (name not in stageless)


# --------------------------------------------------------------------------- --set, list-valued includes


def test_set_with_a_list_makes_an_axis_and_one_value_overrides():
    spec = _spec(base={"train": {"max_steps": 3}}, axes={"seed": [0, 1], "lambda": [0.1]})
    assert len(expand(spec)) == 2
    wider = grid.with_sets(spec, ["lambda=0.1,0.2,0.3", "seed=0,1,2"])
    assert wider.axes == {"seed": [0, 1, 2], "lambda": [0.1, 0.2, 0.3]} and len(expand(wider)) == 9
    narrowed = grid.with_sets(spec, ["seed=4", "train.lr=1e-4"])  # one value: base, its axis gone
    configs = expand(narrowed)
    assert "seed" not in narrowed.axes and len(configs) == 1
    assert (configs[0].seed, configs[0].train.lr, configs[0].train.max_steps) == (4, 1e-4, 3)
    lists = grid.with_sets(_spec(), ["task.labels=[a, b],[c, d]"])  # commas inside brackets stay in a value
    assert lists.axes == {"task.labels": [["a", "b"], ["c", "d"]]}


@pytest.mark.parametrize(("item", "expected"), [
    ("lamda=0.1,0.2", "--set: unknown key 'lamda'; did you mean 'lambda'?"),
    ("lambda", "--set expects key=value or key=v1,v2, got 'lambda'"),
])
def test_set_with_a_bad_key_fails_as_a_grid_does(item, expected):
    assert _error(grid.with_sets, _spec(), [item]) == expected


def test_include_lists_expand_as_a_product_within_the_entry(tmp_path):
    for name in ("train.csv", "dev.csv"):
        (tmp_path / name).write_text("text,label\ngood,pos\nbad,neg\n")
    files = {"task": "classification", "task.train": str(tmp_path / "train.csv"), "task.dev": str(tmp_path / "dev.csv")}
    spec = _spec(base={"train": {"max_steps": 3}}, axes={"seed": [0]},
                 include=[{"task": "synthetic-tag", "seed": [0, 1, 2]},
                          {"seed": [5, 6], "lambda": [0.2, 0.3]},
                          {"seed": 9, **files, "task.labels": ["neg", "pos"]}])  # a key that takes a list keeps it
    assert len(spec.include) == 3 + 4 + 1
    configs = expand(spec)
    assert len(configs) == 1 + 3 + 4 + 1
    assert sorted((c.seed, c.section.lambda_) for c in configs if c.seed in (5, 6)) == [
        (5, 0.2), (5, 0.3), (6, 0.2), (6, 0.3)]
    assert tuple(next(c for c in configs if c.seed == 9).task.labels) == ("neg", "pos")
    with pytest.raises(ConfigError, match=r"include\[0\]\.seed: empty list"):
        _spec(include=[{"seed": []}])


def test_grid_text_with_sets_expands_to_the_same_runs(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "base": {"train": {"max_steps": 3}}, "axes": {"seed": [0]},
                                    "description": "does lambda matter?", "tags": {"paper": "x"}}))
    assert grid.grid_text(path) == path.read_text()
    sets = ["lambda=0.1,0.2", "seed=0,1"]
    text = grid.grid_text(path, sets)
    assert text.startswith("# g.yaml with --set lambda=0.1,0.2 --set seed=0,1\n")
    again = tmp_path / "again.yaml"
    again.write_text(text)
    assert [c.run_key for c in expand(load_grid(again))] == [c.run_key for c in expand(load_grid(path, sets))]
    assert len(expand(load_grid(again))) == 4 and load_grid(again).description == "does lambda matter?"


def test_tags_headsweep_sets_itself_are_refused():
    with pytest.raises(ConfigError, match="tags.sweep: headsweep sets this tag itself"):
        _spec(tags={"sweep": "x"})
