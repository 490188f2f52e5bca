"""Stages (DESIGN.md decision 10): configs that start from other runs, the DAG in the registry,
the driver's waves and blocked dependants, on real SQLite and PostgreSQL registries."""

from __future__ import annotations

import pytest

from base.sections import ConfigError
from experiments.harness.config import parse_config
from orchestrator.registry import Registry, RunStatus
from orchestrator.registry.stages import describe_dag, with_upstreams

TINY = {"model": "tiny-bert", "task": {"name": "synthetic-cls", "num_train": 64, "max_length": 24},
        "train": {"max_steps": 4, "batch_size": 8}}


def _cell(seed: int, lam: float, **extra) -> dict:
    return TINY | {"seed": seed, "method": "head_gates", "head_gates": {"lambda": lam},
                   "init_from": {"method": "finetune"}} | extra


def _cells(seeds=(0, 1), lambdas=(0.01, 0.1, 1.0)):
    return [parse_config(_cell(s, lam)) for s in seeds for lam in lambdas]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def registry(request, tmp_path):
    url = f"sqlite:///{tmp_path / 'registry.db'}" if request.param == "sqlite" else request.getfixturevalue(
        "fresh_pg_database")
    with Registry(url) as opened:
        yield opened


# --------------------------------------------------------------------------- configs


def test_an_upstream_is_the_dependants_shared_sections_plus_its_own_keys():
    cfg = parse_config(_cell(1, 0.1, init_from={"method": "finetune", "train": {"max_steps": 2}}))
    up = cfg.upstreams["init_from"]
    assert (up.method, up.seed, up.model, up.task) == ("finetune", 1, "tiny-bert", cfg.task)
    assert up.train.max_steps == 2 and up.train.batch_size == 8  # its own key on top of the dependant's
    # the dependant's run key holds the upstream's: another upstream is another run
    other = parse_config(_cell(1, 0.1, init_from={"method": "finetune", "train": {"max_steps": 3}}))
    assert other.run_key != cfg.run_key and other.group_key != cfg.group_key


def test_seeds_of_a_cell_share_a_group_and_lambdas_share_an_upstream():
    cells = _cells()
    assert len({c.group_key for c in cells}) == 3  # one per lambda: seeds differ only by seed
    assert len({c.upstreams["init_from"].run_key for c in cells}) == 2  # one fine-tune per seed
    again = parse_config(cells[0].to_dict())  # what a trial re-validates
    assert again.run_key == cells[0].run_key and again.upstreams == cells[0].upstreams


@pytest.mark.parametrize(("stage", "message"), [
    ({"train": {"lr": 0.1}}, "init_from.method: name the upstream run's method"),
    ({"method": "finetun"}, "init_from.method: unknown method 'finetun'; did you mean 'finetune'"),
    ({"method": "finetune", "train": {"lrr": 1}}, "init_from.unknown key 'train.lrr'; did you mean 'train.lr'"),
])
def test_a_bad_stage_fails_at_parse_naming_the_role(stage, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        parse_config(_cell(0, 0.1, init_from=stage))


# --------------------------------------------------------------------------- the DAG


def test_with_upstreams_adds_each_upstream_once_before_its_dependants():
    cells = _cells()
    keyed, edges = with_upstreams(cells)
    order = list(keyed)
    assert len(keyed) == 8 and len(edges) == 6
    for run, role, up in edges:
        assert role == "init_from" and order.index(up) < order.index(run)
    assert describe_dag({"upstream": 2, "dependants": 6, "upstream_methods": {"finetune": 2}}) == (
        "2 upstream runs (2 finetune) that 6 runs start from")


def test_a_sweep_registers_its_upstreams_and_runs_them_in_waves(registry):
    cells = _cells()
    plan = registry.plan(cells)
    assert plan["total"] == 8 and plan["dag"] == {"upstream": 2, "dependants": 6, "upstream_methods": {"finetune": 2}}
    sweep_id, counts = registry.create_sweep("stages", "", cells, {"cpus": 1}, None, 1)
    assert counts["total"] == 8 and counts["new"] == 8
    assert registry.sweep_dag(sweep_id) == {"upstream": 2, "dependants": 6}
    ups = {c.upstreams["init_from"].run_key for c in cells}
    first = registry.next_wave(sweep_id, set())
    assert set(first) == ups  # the dependants wait
    for key in first:  # a claim says what the run's context needs: its upstreams, whether to keep its weights
        claimed = registry.claim(key, "w")
        assert claimed["upstreams"] == {} and claimed["has_dependants"]
        assert registry.finish(key, {"accuracy": 1.0}, worker="w")
    second = registry.next_wave(sweep_id, set(first))
    assert second == [c.run_key for c in cells]  # in cell order
    claimed = registry.claim(cells[0].run_key, "w")
    assert claimed["upstreams"] == {"init_from": cells[0].upstreams["init_from"].run_key}
    assert not claimed["has_dependants"]
    assert registry.next_wave(sweep_id, set(first) | set(second)) == []


def test_a_failed_upstream_blocks_its_dependants_with_the_reason_not_failed(registry):
    cells = _cells()
    sweep_id, _ = registry.create_sweep("stages", "", cells, {"cpus": 1}, None, 1)
    first = registry.next_wave(sweep_id, set())
    bad = cells[0].upstreams["init_from"].run_key
    good = next(k for k in first if k != bad)
    assert registry.claim(bad, "w") and registry.fail(bad, "Traceback ...\nValueError: boom", "w")
    assert registry.claim(good, "w") and registry.finish(good, {"accuracy": 1.0}, worker="w")
    ready_after_good = [c.run_key for c in cells if c.upstreams["init_from"].run_key == good]
    # the failed upstream is retried once per driver: its dependants are not blocked before that
    assert registry.next_wave(sweep_id, {good}) == [bad, *ready_after_good]
    assert registry.sweep_counts(sweep_id).get("blocked", 0) == 0
    wave = registry.next_wave(sweep_id, set(first))
    assert wave == ready_after_good
    blocked = [registry.get_run(c.run_key) for c in cells if c.upstreams["init_from"].run_key == bad]
    assert [r["status"] for r in blocked] == [RunStatus.BLOCKED] * 3
    assert blocked[0]["error"] == f"blocked: its init_from run {bad} failed"
    counts = registry.sweep_counts(sweep_id)
    assert counts == {"finished": 1, "failed": 1, "blocked": 3, "pending": 3}
    # a new driver (resume) unblocks them: they wait for the upstream's retry again
    assert registry.unblock(sweep_id) == 3
    assert registry.next_wave(sweep_id, set()) == [bad, *wave]


def test_a_chain_blocks_end_to_end(registry):
    deep = parse_config(_cell(0, 0.1, init_from={"method": "head_gates", "init_from": {"method": "finetune"}}))
    keyed, edges = with_upstreams([deep])
    assert len(keyed) == 3 and len(edges) == 2
    sweep_id, _ = registry.create_sweep("chain", "", [deep], {"cpus": 1}, None, 1)
    (root,) = registry.next_wave(sweep_id, set())
    assert registry.claim(root, "w") and registry.fail(root, "boom", "w")
    assert registry.next_wave(sweep_id, {root}) == []
    assert registry.sweep_counts(sweep_id) == {"failed": 1, "blocked": 2}


def test_resubmitting_reuses_a_finished_upstream_and_reruns_one_without_weights(registry):
    cells = _cells(seeds=(0,))
    sweep_id, _ = registry.create_sweep("a", "", cells, {"cpus": 1}, None, 1)
    (up,) = registry.next_wave(sweep_id, set())
    assert registry.claim(up, "w") and registry.finish(up, {"accuracy": 1.0}, worker="w")
    more = cells + [parse_config(_cell(0, 3.0))]  # a new lambda starting from the same fine-tune
    second, counts = registry.create_sweep("b", "", more, {"cpus": 1}, None, 1)
    assert counts == {"total": 5, "new": 1, "finished": 1, "requeued": 0, "other": 3}
    assert registry.next_wave(second, set()) == [c.run_key for c in more]  # no fine-tune again
    third, counts = registry.create_sweep("c", "", more, {"cpus": 1}, None, 1, rerun=[up])
    assert counts["requeued"] == 1 and registry.get_run(up)["status"] == RunStatus.PENDING
    assert registry.next_wave(third, set()) == [up]
