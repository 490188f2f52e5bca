"""``headsweep transfer`` on a real SQLite registry of prompt_transfer runs whose tables we know.

3 tasks, every ordered pair (the diagonal too), 2 seeds, plus each task's skill_neurons run (their
stages). Per pair (i, j) of different tasks, with d = (i - j) % 3 in {1, 2} and seed s:

    overlap_top20 = 0.2 + 0.1 * PAIR_RANK[(i, j)] + 0.01 * s    (rank order of the pairs)
    transfer_relative = 0.5 + 0.05 * PAIR_RANK[(i, j)]           (the same order: rho = 1)
    overlap_active = 0.9 - 0.02 * PAIR_RANK[(i, j)]              (the reverse order: rho = -1)

the diagonal has transfer 1 and overlaps 1; accuracy 0.8, noise on the source's top neurons costs
0.1 * (i + 1) of it at f = 0.1 and half that at f = 0.05, random neurons 0.01.
"""

from __future__ import annotations

import argparse
import csv
import io
import json

import numpy as np
import pytest

from analysis.data.loading import load_sweep
from analysis.data.select import QueryError
from analysis.questions import transfer
from headsweep.cli import common, questions
from orchestrator.registry import Registry

TASKS = ("sst2", "synthetic-cls", "synthetic-shortcut")
SEEDS = (0, 1)
PAIRS = [(i, j) for i in range(3) for j in range(3) if i != j]
PAIR_RANK = {pair: rank for rank, pair in enumerate(PAIRS)}  # 0..5


def _config(target: str, source: str, seed: int, **section):
    from experiments.harness.config import parse_config

    return parse_config({"method": "prompt_transfer", "model": "minilm-l6", "seed": seed, "task": {"name": target},
                         "prompt_transfer": {"source_task": source, **section}}, check_files=False)


def _metrics(i: int, j: int, seed: int) -> dict[str, float]:
    rank = PAIR_RANK.get((i, j))
    metrics = {"accuracy": 0.8, "own_accuracy": 0.8, "overlap_top20_chance": 0.25, "overlap_active_chance": 0.5}
    if rank is None:
        metrics |= {"transfer_relative": 1.0, "overlap_top20": 1.0, "overlap_active": 1.0}
    else:
        metrics |= {"transfer_relative": 0.5 + 0.05 * rank, "overlap_top20": 0.2 + 0.1 * rank + 0.01 * seed,
                    "overlap_active": 0.9 - 0.02 * rank}
    metrics["transfer_accuracy"] = 0.8 * metrics["transfer_relative"]
    for f, scale in ((0.05, 0.5), (0.1, 1.0)):
        metrics[f"accuracy_noise_source_top_{f:g}"] = 0.8 - scale * 0.1 * (i + 1)
        metrics[f"accuracy_noise_source_random_{f:g}"] = 0.79
    return metrics


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """(registry URL, sweep id): 18 finished prompt_transfer runs and their 6 skill_neurons stages,
    the diagonal of seed 0 again at noise std 0.5 (evaluation only: the same stages), and one run of
    prompts trained otherwise (skill_neurons.noise_std 0.5: another setting)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('transfer') / 'registry.db'}"
    cells = {(i, j, s): _config(TASKS[j], TASKS[i], s) for i in range(3) for j in range(3) for s in SEEDS}
    other = _config(TASKS[0], TASKS[1], 0, skill_neurons={"noise_std": 0.5})
    louder = {i: _config(TASKS[i], TASKS[i], 0, noise_std=0.5) for i in range(3)}
    with Registry(url) as registry:
        sweep_id, counts = registry.create_sweep("transfer", "name: transfer\n", [*cells.values(), other, *louder.values()],
                                                 {"cpus": 1.0, "gpus": 0.0}, None, 1)
        assert counts["new"] == 18 + 1 + 3 + 6 + 2  # each task's prompt once per seed; the other setting's two
        for cfg in {up.run_key: up for c in cells.values() for up in c.upstreams.values()}.values():
            assert registry.claim(cfg.run_key, "test") is not None
            assert registry.finish(cfg.run_key, {"accuracy": 0.8})
        for (i, j, s), cfg in [*cells.items(), ((1, 0, 0), other)]:
            assert registry.claim(cfg.run_key, "test") is not None
            assert registry.finish(cfg.run_key, _metrics(i, j, s))
        for i, cfg in louder.items():
            assert registry.claim(cfg.run_key, "test") is not None
            assert registry.finish(cfg.run_key, _metrics(i, i, 0) | {"accuracy_noise_source_top_0.1": 0.4})
    return url, sweep_id


@pytest.fixture(scope="module")
def data(sweep):
    url, sweep_id = sweep
    with Registry(url) as registry:
        yield load_sweep(registry, sweep_id)


def test_spearman_by_hand():
    assert transfer.spearman(np.array([1, 2, 3, 4]), np.array([10, 20, 30, 40])) == pytest.approx(1.0)
    assert transfer.spearman(np.array([1, 2, 3, 4]), np.array([1, 3, 2, 4])) == pytest.approx(0.8)  # 1 - 6*2/(4*15)
    assert transfer.spearman(np.array([1, 2, 2, 3]), np.array([1, 2, 3, 4])) == pytest.approx(np.corrcoef(
        [1, 2.5, 2.5, 4], [1, 2, 3, 4])[0, 1])  # ties take their average rank
    assert np.isnan(transfer.spearman(np.array([1, 1, 1]), np.array([1, 2, 3])))
    assert np.isnan(transfer.spearman(np.array([1, 2]), np.array([1, 2])))
    tested = transfer.spearman_test(np.arange(6.0), np.arange(6.0), 2000, np.random.default_rng(0))
    assert tested.observed == 1.0 and tested.p_value < 0.01  # exact: 1 / 720
    assert abs(tested.null_mean) < 0.05


def test_cell_means_and_source_labels():
    table = transfer.cell_means(np.array([1.0, 3.0, 5.0]), np.array([0, 0, 1]), np.array([1, 1, 0]), 2)
    np.testing.assert_array_equal(table, [[np.nan, 2.0], [5.0, np.nan]])


def test_tables_are_seed_means_rows_source_columns_target(data):
    result = transfer.transfer_tables(data, {"prompt_transfer.skill_neurons.noise_std": ["0.1"]}, n_perm=500)
    assert result.tasks == list(TASKS) and result.runs == 18 and result.fraction == 0.1 and result.noise_std == 0.1
    assert (result.seeds == 2).all()
    for i in range(3):
        for j in range(3):
            expected = np.mean([_metrics(i, j, s)["overlap_top20"] for s in SEEDS])
            assert result.tables["overlap_top20"][i, j] == pytest.approx(expected)
            assert result.tables["transfer_relative"][i, j] == pytest.approx(_metrics(i, j, 0)["transfer_relative"])
            assert result.tables["drop_top"][i, j] == pytest.approx(0.1 * (i + 1))  # rows: the perturbed source
            assert result.tables["drop_random"][i, j] == pytest.approx(0.01)
    rho = {c.overlap: c for c in result.correlations}
    assert rho["overlap_top20"].rho == pytest.approx(1.0) and rho["overlap_top20"].n_pairs == 6
    assert rho["overlap_active"].rho == pytest.approx(-1.0)
    assert rho["overlap_top20"].tested.p_value < 0.02 and rho["overlap_active"].tested.p_value == 1.0
    assert result.pooled == "6 ordered pairs of different tasks, each the mean of 2 seeds (18 runs)"
    half = transfer.transfer_tables(data, {"prompt_transfer.skill_neurons.noise_std": ["0.1"]}, fraction=0.05, n_perm=0)
    assert half.tables["drop_top"][2, 0] == pytest.approx(0.15) and half.correlations[0].tested is None
    # the cells at another noise level (the diagonal only): tables of their own, no correlation
    loud = transfer.transfer_tables(data, {"prompt_transfer.skill_neurons.noise_std": ["0.1"]}, noise_std=0.5)
    assert loud.runs == 3 and (loud.seeds == np.eye(3)).all()
    np.testing.assert_allclose(np.diag(loud.tables["drop_top"]), [0.4, 0.4, 0.4])
    assert np.isnan(loud.tables["drop_top"][0, 1]) and np.isnan(loud.correlations[0].rho)
    assert loud.notes == ["0 ordered pairs of different tasks: a rank correlation needs 3 or more"]


def test_runs_of_another_setting_are_not_pooled(data):
    with pytest.raises(QueryError, match=r"differ in prompt_transfer.skill_neurons.noise_std, "
                                         r"init_from.skill_neurons.noise_std, source.skill_neurons.noise_std: compare "
                                         r"one setting at a time, e.g. --where prompt_transfer.skill_neurons.noise_std:0.1"):
        transfer.transfer_tables(data)
    with pytest.raises(QueryError, match="no perturbation of 0.3 of the neurons .fractions: 0.05, 0.1."):
        transfer.transfer_tables(data, {"prompt_transfer.skill_neurons.noise_std": ["0.1"]}, fraction=0.3)
    with pytest.raises(QueryError, match=r"no run with prompt_transfer.noise_std 0.3 .prompt_transfer.noise_std: 0.1, 0.5."):
        transfer.transfer_tables(data, noise_std=0.3)
    with pytest.raises(QueryError, match="no finished prompt_transfer run"):
        transfer.transfer_tables(data, {"method": ["skill_neurons"]})


def _run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="headsweep")
    questions.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(list(argv))
    return args.func(args)


def test_the_command_prints_tables_csv_json_and_the_figure(sweep, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(common.out, "_width", 200)
    url, sweep_id = sweep
    where = ("--where", "prompt_transfer.skill_neurons.noise_std:0.1", "--db", url)
    png = tmp_path / "transfer.png"
    assert _run("transfer", sweep_id, "--n-perm", "200", "--png", str(png), *where) == 0
    text = " ".join(capsys.readouterr().out.split())  # titles wrap at the tables' width
    assert "transfer_relative: zero-shot transfer" in text and "source \\ target" in text
    assert ("drop_top: target accuracy lost to noise on the source's top skill neurons (10 % of the neurons, "
            "noise std 0.1)") in text
    assert "Spearman(overlap_top20, transfer_relative) = 1.000; transfer shuffled among the pairs" in text
    assert "Spearman(overlap_active, transfer_relative) = -1.000" in text
    assert "pooled: 6 ordered pairs of different tasks, each the mean of 2 seeds (18 runs)" in text
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n") and png.stat().st_size > 20_000

    assert _run("transfer", sweep_id, "--format", "csv", "--n-perm", "0", *where) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 9 and rows[1]["source"] == "sst2" and rows[1]["target"] == "synthetic-cls"
    assert float(rows[1]["overlap_top20"]) == pytest.approx(0.205) and rows[1]["seeds"] == "2"

    assert _run("transfer", sweep_id, "--format", "json", "--n-perm", "100", *where) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tasks"] == list(TASKS) and out["correlations"][0]["rho"] == pytest.approx(1.0)
    assert out["correlations"][0]["n_perm"] == 100 and out["tables"]["transfer_relative"][0][0] == 1.0
