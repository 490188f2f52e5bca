"""`headsweep run` and `headsweep ui` as a user types them (real subprocesses, real MLflow store)."""

import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest
import yaml
from mlflow import MlflowClient

from orchestrator.tracking import ui_url

HEADSWEEP = [sys.executable, "-m", "headsweep.cli"]
TINY = {
    "model": "tiny-bert",
    "task": {"name": "synthetic-tag", "num_train": 48, "num_eval": 16, "max_length": 24},
    "train": {"max_steps": 4, "batch_size": 8, "eval_every": 2},
    "head_gates": {"lambda": 0.1, "lr": 0.1},
}


def _headsweep(args, home, **kw):
    env = os.environ | {"HEADSWEEP_HOME": str(home), "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.run(HEADSWEEP + args, capture_output=True, text=True, env=env, timeout=300, **kw)


def _write(path, data):
    path.write_text(yaml.safe_dump(data) if isinstance(data, dict) else data)
    return str(path)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({**TINY, "trian": {}}, "unknown key 'trian'; did you mean 'train'?"),
        ({**TINY, "model": "tiny-bret"}, "did you mean 'tiny-bert'?"),
        ({**TINY, "task": {"name": "ud-pos", "data_dir": "/nonexistent"}}, "en_ewt-ud-dev.conllu"),
        ({**TINY, "head_gates": {"lambda": -1}}, "head_gates.lambda: Input should be greater than or equal to 0"),
        ({**TINY, "head_gates": {"lamda": 1}}, "unknown key 'head_gates.lamda'; did you mean 'head_gates.lambda'?"),
        ({**TINY, "method": "finetune"},
         "section 'head_gates' belongs to method 'head_gates', this run's method is 'finetune'"),
        ({**TINY, "method": "prune"}, "unknown method 'prune'"),
        ("model: [unclosed\n", "not valid YAML"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, config, message):
    """In this process (a fresh interpreter costs ~6 CPU-seconds of imports); the next test goes
    through a real one, its exit status and its stderr."""
    from headsweep.cli import main

    home = tmp_path / "home"
    monkeypatch.setenv("HEADSWEEP_HOME", str(home))
    for name in ("HEADSWEEP_DB", "HEADSWEEP_TRACKING_URI", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    assert main(["run", _write(tmp_path / "c.yaml", config)]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0], err
    assert not (home / "mlflow.db").exists()


def test_set_with_a_key_the_method_lacks_exits_2(tmp_path):
    """A real process, as a user types it."""
    home = tmp_path / "home"
    config = {k: v for k, v in TINY.items() if k != "head_gates"}
    result = _headsweep(["run", _write(tmp_path / "c.yaml", config), "--set", "method=finetune",
                         "--set", "sparsity=0.5"], home)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip() == (
        "headsweep: error: unknown key 'sparsity'; 'sparsity' is a key of method 'head_gates', not of 'finetune'")


def test_methods_lists_every_method_its_keys_defaults_and_short_names(capsys):
    from headsweep.cli import main

    assert main(["methods", "--shared"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert "head_gates VERSION 2 pipelines: dp, sp" in shown and "finetune VERSION 1 pipelines: none" in shown
    assert "│ head_gates.lambda │ lambda │ 0.01 │ Weight of the L0 penalty" in shown
    assert "│ head_gates.lr │ │ 0.001 │" in shown and "│ train.lr │ 5e-05 │" in shown
    assert main(["methods", "head-gates"]) == 2
    assert "unknown method 'head-gates'; did you mean 'head_gates'?" in capsys.readouterr().err


def test_methods_says_which_defaults_are_the_papers_protocol_and_the_set_that_restores_it(capsys):
    from base.sections import section_value
    from experiments.harness.config import apply_overrides, parse_config
    from experiments.methods import METHODS
    from headsweep.cli import main

    kept = {name: module.REFERENCE for name, module in METHODS.items() if getattr(module, "REFERENCE", None)}
    assert {"attention_analysis", "probes", "skill_neurons"} <= set(kept)  # both branches are exercised
    for name in METHODS:
        assert main(["methods", name]) == 0
        shown = " ".join(capsys.readouterr().out.split())
        if name not in kept:
            assert "every default follows the paper's reference code" in shown
            continue
        sets = re.findall(r"--set (\S+)", shown.split("the reference protocol: ", 1)[1].split("A run config")[0])
        assert len(sets) == len(kept[name])
        # the printed --set, read back as a user's would be, gives the REFERENCE values
        raw = {"model": "tiny-bert", "method": name, "task": {"name": "synthetic-cls"}}
        cfg = parse_config(apply_overrides(raw, sets), check_files=False)
        assert {key: section_value(cfg.section, key) for key in kept[name]} == kept[name]


def _browser_dom(url: str) -> str:
    """The DOM of ``url`` after its scripts ran, from Debian's headless chromium (.ci/run installs it)."""
    browser = shutil.which("chromium")
    assert browser, "this test looks at the MLflow UI in Debian's chromium: apt-get install chromium"
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=20000",
                           "--dump-dom", url], capture_output=True, text=True, timeout=120)
    return done.stdout


@pytest.mark.slow  # in CI (make test-slow), not in the default run: see Makefile
def test_run_then_ui_shows_it(tmp_path):
    home = tmp_path / "home"
    result = _headsweep(["run", _write(tmp_path / "c.yaml", TINY), "--set", "seed=2", "--set", "lambda=0.2",
                         "--threads", "1"], home)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "open_heads" in result.stdout and "headsweep ui" in result.stdout

    client = MlflowClient(f"sqlite:///{home / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("headsweep-runs").experiment_id])
    assert run.info.status == "FINISHED"
    assert run.data.tags["task"] == "synthetic-tag" and run.data.params["seed"] == "2"
    assert run.data.params["head_gates.lambda"] == "0.2" and run.data.tags["lambda"] == "0.2"
    assert run.info.run_name == "synthetic-tag-head_gates-dp-seed2"
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == {"maps.npz", "heads.gate.png"}

    with socket.socket() as probe:  # a free port: a fixed one may be held by another test's server
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = os.environ | {"HEADSWEEP_HOME": str(home)}
    log = tmp_path / "ui.log"
    with log.open("w") as sink:
        server = subprocess.Popen(HEADSWEEP + ["ui", "--port", str(port)], env=env, stdout=sink, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}/get-artifact?path=heads.gate.png&run_uuid={run.info.run_id}"
        # MLflow's server starts in ~10 s here; on 2 loaded cores it has taken over a minute
        deadline, body, tried = time.time() + 180, None, []
        while time.time() < deadline and body is None:
            try:
                body = urllib.request.urlopen(url, timeout=10).read()
            except OSError as err:
                tried.append(repr(err)[:120])
                time.sleep(1)
        why = f"{len(tried)} tries, last {tried[-3:]}; server exit {server.poll()}; its log: {log.read_text()[-2000:]}"
        assert body is not None and body[:4] == b"\x89PNG", why
        # the page `run` points at, rendered by a real browser: the training-runs view with this run
        link = next(line for line in result.stdout.splitlines() if "workflowType" in line).split("then ")[-1]
        assert link == ui_url(run.info.experiment_id, run.info.run_id)
        runs_page = f"http://127.0.0.1:{port}/" + ui_url(run.info.experiment_id).split("/", 3)[3]
        dom = _browser_dom(runs_page)
        assert run.info.run_name in dom and "Model training" in dom, dom[-3000:]
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=30)


def test_run_of_a_method_whose_progress_reports_no_loss(tmp_path, monkeypatch, capsys):
    """head_importance's pruning steps report open heads and no loss: the progress bar shows '-'
    for it (it raised KeyError 'loss'), and the method's own progress value (its ``PROGRESS``:
    open heads), the fine-tune stage run first none. In this process."""
    from headsweep.cli import main

    monkeypatch.setenv("HEADSWEEP_HOME", str(tmp_path / "home"))
    for name in ("HEADSWEEP_DB", "HEADSWEEP_TRACKING_URI", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(name, raising=False)
    config = {k: v for k, v in TINY.items() if k != "head_gates"} | {
        "method": "head_importance", "head_importance": {"examples": 16}}
    assert main(["run", _write(tmp_path / "c.yaml", config), "--no-track"]) == 0
    bars = [line for line in capsys.readouterr().err.splitlines() if "loss" in line]
    assert any("finetune" in bar and "open heads" not in bar for bar in bars), bars
    assert any("head_importance" in bar and "open heads" in bar for bar in bars), bars
