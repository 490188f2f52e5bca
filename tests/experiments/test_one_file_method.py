"""Adding a method needs one file: tests/plugins/tiny_method.py, put in METHODS and nothing else.

Config validation, ``--set``, grid validation and expansion, ``headsweep methods`` and
``experiments.run`` all read the method's module (its Config, SHORT_NAMES, PIPELINES).
"""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from base.sections import ConfigError
from experiments import RunContext, run
from experiments.harness.config import apply_overrides, parse_config
from experiments.methods import METHODS
from experiments.training.tracking import MemoryTracker
from orchestrator.driving.grid import expand, parse_grid

PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "tiny_method.py"


@pytest.fixture
def tiny(monkeypatch):
    """The one-file method, registered as ``tiny`` for this test only."""
    spec = importlib.util.spec_from_file_location("tiny_method", PLUGIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    monkeypatch.setitem(METHODS, "tiny", module)
    return module


def test_its_section_validates_with_the_same_messages(tiny):
    cfg = parse_config({"method": "tiny", "tiny": {"strength": 0.9, "pipeline": "twice"}})
    assert isinstance(cfg.section, tiny.Config) and (cfg.section.strength, cfg.section.pipeline) == (0.9, "twice")
    assert cfg.labels() == {"task": "synthetic-cls", "data": "synthetic-cls(data_seed=0)", "model": "minilm-l6",
                            "method": "tiny", "seed": 0,
                            "pipeline": "twice", "strength": 0.9}  # its pipeline and short names are its labels
    with pytest.raises(ConfigError, match=r"^unknown key 'tiny.strenght'; did you mean 'tiny.strength'\?$"):
        parse_config({"method": "tiny", "tiny": {"strenght": 0.9}})
    with pytest.raises(ConfigError, match=r"^tiny.strength: Input should be less than or equal to 1 \(got 2\)$"):
        parse_config({"method": "tiny", "tiny": {"strength": 2}})
    with pytest.raises(ConfigError, match="^section 'tiny' belongs to method 'tiny', this run's method is 'head_gates'$"):
        parse_config({"tiny": {"strength": 0.9}})
    with pytest.raises(ConfigError, match="has no pipeline 'thrice' .it has once, twice.; did you mean 'twice'"):
        parse_config({"method": "tiny", "tiny": {"pipeline": "thrice"}})
    assert parse_config(apply_overrides({"method": "tiny"}, ["strength=0.2"])).section.strength == 0.2


def test_grids_resolve_its_short_names_through_each_cell(tiny):
    spec = parse_grid({
        "name": "plug",
        "axes": {"method": ["head_gates", "tiny"], "strength": [0.1, 0.2], "lambda": [0.01], "seed": [0, 1]},
        "include": [{"method": "tiny", "tiny.layers": 3, "seed": 7}],
    })
    configs = expand(spec)
    tiny_cells = [(c.seed, c.section.strength, c.section.layers) for c in configs if c.method == "tiny"]
    assert tiny_cells == [(0, 0.1, 2), (1, 0.1, 2), (0, 0.2, 2), (1, 0.2, 2), (7, 0.5, 3)]
    assert len([c for c in configs if c.method == "head_gates"]) == 2  # strength is not head_gates': one per seed
    with pytest.raises(ConfigError, match="axes: unknown key 'strenght'; did you mean 'strength'"):
        parse_grid({"name": "plug", "axes": {"strenght": [0.1]}})


def test_headsweep_methods_lists_it(tiny, capsys):
    from headsweep.cli import main

    assert main(["methods", "tiny"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "tiny VERSION 1 pipelines: once, twice" in shown
    assert "│ tiny.strength │ strength │ 0.5 │ Value every head's map starts from. │" in shown
    assert "A whole method in one file" in shown


def test_it_runs_and_reports_its_map(tiny):
    cfg = parse_config({"method": "tiny", "model": "tiny-bert", "seed": 3, "tiny": {"strength": 0.25}})
    tracker = MemoryTracker()
    result = run(cfg, RunContext(tracker=tracker))
    values = result.maps["heads.tiny"].values
    assert values.shape == (2, 4) and np.all((values >= 0.25) & (values < 0.26))
    assert result.run_key == cfg.run_key and result.metrics["accuracy"] == pytest.approx(values.mean())
    assert tracker.tags["method"] == "tiny" and tracker.tags["pipeline"] == "once"
    assert tracker.params["tiny.strength"] == 0.25 and "heads.tiny.png" in tracker.artifacts


@pytest.mark.parametrize("old, new", [("experiments.common.sections", "base.sections"),
                                      ("experiments.core.seeding", "experiments.training.seeding")])
def test_a_plugin_written_before_the_move_imports_its_old_paths(old, new, monkeypatch):
    """What a plug-in method imported before issue 46 (docs/changelog.md) is the module at its new home,
    the very objects (its Config is a Section, its ConfigError is caught as one), with a warning."""
    for name in (old.rpartition(".")[0], old):  # imported again, as a plug-in's first import would be
        monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.warns(DeprecationWarning, match=f"moved to {new.rpartition('.')[0]}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new) and module.__spec__.name == new  # its own spec kept
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old.rpartition(".")[0] + ".nothing_of_the_kind")
