"""Re-measure PARITY.md's MiniLM rows through the product (issue 31: "none stale").

    HF_HUB_OFFLINE=1 .venv/bin/python tests/science/parity_rows.py [ROW ...]    # alone on the machine

Each row is a small grid submitted with ``headsweep.submit(grid, wait=True)`` (the local Ray head,
SQLite, MLflow, as a user's sweep) in a home of its own, at the sizes PARITY.md's row states, now over
3 seeds where the row trains (the pretrained probes have no seed). For each row it writes, to
``tests/science/results/parity_rows/<date>.jsonl``: one line per run (its labels and every metric) and
one summary line (the numbers the row quotes, the seeds, the commit, the wall time and the 1-minute
load sampled every 30 s while it ran). Not in any test lane: a row takes minutes to half an hour.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[2]
SEEDS = [0, 1, 2]
SST2 = {"name": "sst2", "max_train": 2000, "max_eval": 500, "max_length": 64}
FINETUNE_150 = {"max_steps": 150, "batch_size": 16, "eval_every": 75}
RUN = {"resources": {"cpus": 1}, "max_concurrent": 2, "max_failures": 2}

GRIDS: dict[str, dict] = {
    # He & Choi's stem cell statistic: `make demo`'s grid (3 seeds x lambda 0.05/0.2 x DP/SP + 3 fine-tunes)
    "stem_cell_demo": yaml.safe_load((ROOT / "examples" / "grid_demo.yaml").read_text()),
    # He & Choi's probes of the pretrained model: DEP with the defaults, POS with the reference's centroids
    "probes_pretrained": {
        "base": {"model": "minilm-l6", "method": "probes", "seed": 0, "probes": {"score_sentences": 500, "top_labels": 20}},
        "axes": {"probes.centroids_from": ["fit", "scored"]}},
    # ... and after a 150-step ud-pos fine-tune (default: centroids fitted on dev, scored on test)
    "probes_finetuned": {
        "base": {"model": "minilm-l6", "method": "probes", "task": {"name": "ud-pos", "max_length": 64},
                 "train": FINETUNE_150, "init_from": {"method": "finetune"}, "probes": {"score_sentences": 500, "top_labels": 20}},
        "axes": {"seed": SEEDS}},
    # Michel et al.: importance on 256 examples of a 150-step SST-2 fine-tune, the pruning curve
    "michel": {
        "base": {"model": "minilm-l6", "method": "head_importance", "task": SST2, "train": FINETUNE_150,
                 "head_importance": {"examples": 256}},
        "axes": {"seed": SEEDS}},
    # Kovaleva et al.: attention change (cropped, and padded to 200 as the notebook), one-head ablation
    "kovaleva": {
        "base": {"model": "minilm-l6", "task": SST2, "train": FINETUNE_150, "init_from": {"method": "finetune"},
                 "attention_analysis": {"eval_examples": 200, "sentences": 200}, "head_ablation": {"examples": 500}},
        "axes": {"seed": SEEDS, "method": ["attention_analysis", "head_ablation"]},
        "include": [{"method": "attention_analysis", "attention_analysis.attention_change_length": 200,
                     "seed": SEEDS}]},
    # Wang et al.: noise (std 0.1) on each layer's top skill neurons vs as many random ones
    "skill_perturbation": {
        "base": {"model": "minilm-l6", "method": "skill_neurons",
                 "task": {"name": "sst2", "max_train": 1000, "max_eval": 300, "max_length": 64},
                 "train": {"epochs": 2, "batch_size": 32, "eval_every": 16}},
        "axes": {"seed": SEEDS}},
    # Wang et al.: the top-20 % overlap of two tasks' prompts against transfer (grid_skill_transfer's
    # setting, two of its tasks)
    "transfer": {
        "base": {"method": "prompt_transfer", "prompt_transfer": {"skill_neurons": {"verbalizer": "label_words"}},
                 "task": {"max_train": 1000, "max_eval": 300, "num_train": 1000, "num_eval": 300, "max_length": 64},
                 "train": {"epochs": 2, "batch_size": 32, "eval_every": 16}},
        "axes": {"seed": SEEDS, "task": ["sst2", "synthetic-cls"], "source_task": ["sst2", "synthetic-cls"]}},
    # Liu et al. IMP, pipeline b: 20 % in rounds of 8 steps, rewound, a 75-step retrain
    "imp": {
        "base": {"model": "minilm-l6", "method": "imp", "task": SST2,
                 "train": {"max_steps": 75, "batch_size": 16, "eval_every": 75},
                 "imp": {"pipeline": "prune_then_ft", "sparsity": 0.2}},
        "axes": {"seed": SEEDS}},
    # Liu et al. mask training: examples/grid_sst2_masks.yaml's ft_then_prune cells and the fine-tunes they
    # start from (its prune_only cells are tests/science/mask_row.py's, run in process)
    "masks_ft_then_prune": (yaml.safe_load((ROOT / "examples" / "grid_sst2_masks.yaml").read_text())
                            | {"axes": {"seed": SEEDS, "pipeline": ["ft_then_prune"], "sparsity": [0.5, 0.7]}}),
}


DEP = [f"dep_probe/{r}" for r in ("nsubj", "det", "amod", "obj", "root")]
POS = [f"pos_centroid/{t}" for t in ("NOUN", "ADP", "DET", "ADJ")]
"""The probe scores PARITY.md's rows quote."""


def _sample_load(samples: list[float], stop: threading.Event) -> None:
    """The 1-minute load into ``samples`` every 30 s until ``stop`` is set (in a daemon thread)."""
    def sample() -> None:
        while not stop.is_set():
            samples.append(round(os.getloadavg()[0], 2))
            stop.wait(30)

    threading.Thread(target=sample, daemon=True).start()


def _column(runs, name: str, where=None) -> list[float]:
    rows = runs if where is None else runs[where(runs)]
    column = f"metrics.{name}"
    return [round(float(v), 4) for v in rows[column]] if column in rows else []


def _label(table, name: str) -> str | None:
    """The column of a label or param that ends with ``name`` (labels are columns; params ``params.*``)."""
    return next((c for c in table.columns if str(c).split(".")[-1] == name), None)


def summarise(row: str, sweep, runs) -> dict:
    """The numbers PARITY.md's row quotes, from the sweep's run table (and maps)."""
    ok = runs[runs["status"] == "finished"]
    if row == "stem_cell_demo":
        answer = sweep.agreement(across="seed")
        return {"seed_r": round(answer.value, 3), "table": answer.table().round(3).to_dict("records"),
                "accuracy": sweep.results(group_by=["pipeline", "lambda"]).round(3).to_dict("records"),
                "open_heads": sweep.results(group_by=["pipeline", "lambda"], metric="open_heads").round(2)
                .to_dict("records")}
    if row == "probes_pretrained":
        fit = _label(ok, "centroids_from")
        return {c: {k: _column(ok, k, lambda r, c=c: r[fit] == c) for k in DEP + POS} for c in ("fit", "scored")}
    if row == "probes_finetuned":
        return {k: _column(ok, k) for k in POS + DEP}
    if row == "michel":
        curve = {pct: _column(ok, f"accuracy_pruned_{pct}") for pct in (0, 30, 50, 70, 90)}
        agreement = sweep.agreement(across="seed", map="heads.importance")
        return {"accuracy_pruned": curve, "accuracy": _column(ok, "accuracy"),
                "seed_r_importance": round(agreement.value, 3),
                "seed_r_table": agreement.table().round(3).to_dict("records")}
    if row == "kovaleva":
        changes = sweep.map("heads.attention_change")  # its runs carry the labels; the length is a param
        length = runs.set_index("run_key")[_label(runs, "attention_change_length")]
        padded = (pd.to_numeric(changes.runs["run_key"].map(length), errors="coerce") == 200).to_numpy()
        ablation = sweep.map("heads.ablation_delta")
        deltas = ablation.values.reshape(len(ablation.values), -1)
        return {"attention_change_per_layer_cropped": changes.values[~padded].mean(axis=2).round(3).tolist(),
                "attention_change_per_layer_padded_200": changes.values[padded].mean(axis=2).round(3).tolist(),
                "ablation": [{"raise": int((d > 0).sum()), "raise_by_0.01": int((d >= 0.01 - 1e-9).sum()),
                              "best": round(float(d.max()), 3), "worst": round(float(d.min()), 3)} for d in deltas],
                "finetune_accuracy": _column(ok, "accuracy", lambda r: r["method"] == "head_ablation")}
    if row == "skill_perturbation":
        names = ["accuracy"] + [f"accuracy_noise_{w}_{f:g}" for f in (0.01, 0.02, 0.1) for w in ("top", "random")]
        return {k: _column(ok, k) for k in names}
    if row == "transfer":
        answer = sweep.transfer()  # the overlap is of the top 20 %; the perturbation the largest fraction
        return {"answer": json.loads(json.dumps(answer, default=str))}
    if row == "imp":
        return {k: _column(ok, k) for k in ("accuracy", "sparsity")}
    if row == "masks_ft_then_prune":
        return {"accuracy": sweep.results(group_by=["method", "pipeline", "sparsity"]).round(4).to_dict("records"),
                "by_run": [{k: run.get(k) for k in ("method", "pipeline", "sparsity", "seed", "metrics.accuracy")}
                           for run in ok.to_dict("records")]}
    raise KeyError(row)


def measure(row: str, out: Path) -> dict:
    import headsweep

    grid = RUN | GRIDS[row] | {"name": f"parity-{row.replace('_', '-')}"}
    samples: list[float] = []
    stop = threading.Event()
    _sample_load(samples, stop)
    start = time.monotonic()
    sweep = headsweep.submit(grid, wait=True)
    wall = time.monotonic() - start
    stop.set()
    return record(row, sweep, out, wall_s=round(wall, 1), load_1min=[min(samples, default=0), max(samples, default=0)])


def record(row: str, sweep, out: Path, **measured) -> dict:
    """The sweep's runs and the row's summary, appended to ``out``; the summary."""
    runs = sweep.runs()
    try:
        numbers = summarise(row, sweep, runs)
    except Exception as err:  # the runs are still written: the summary can be redone (--sweep)
        numbers = {"error": f"{type(err).__name__}: {err}"}
    summary = {"row": row, "summary": numbers, "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
               "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                        text=True).stdout.strip(),
               "statuses": runs["status"].value_counts().to_dict(), "sweep": sweep.id, **measured}
    with out.open("a") as f:
        f.writelines(json.dumps({"row": row, "run": run}, default=str) + "\n" for run in runs.to_dict("records"))
        f.write(json.dumps(summary, default=str) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("rows", nargs="*", help=f"rows to measure (default: all): {', '.join(GRIDS)}")
    parser.add_argument("--sweep", help="summarise this finished sweep of $HEADSWEEP_HOME as the one row named")
    args = parser.parse_args(argv)
    if unknown := set(args.rows) - set(GRIDS):
        parser.error(f"unknown rows {sorted(unknown)}: one of {', '.join(GRIDS)}")
    out = ROOT / "tests" / "science" / "results" / "parity_rows" / f"{datetime.now(UTC):%Y-%m-%d}.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.sweep:
        if len(args.rows) != 1:
            parser.error("--sweep summarises one row: name it")
        import headsweep

        print(json.dumps(record(args.rows[0], headsweep.sweep(args.sweep), out), default=str))
        return 0
    os.environ.setdefault("HEADSWEEP_HOME", tempfile.mkdtemp(prefix="parity-rows-"))
    for row in args.rows or list(GRIDS):
        summary = measure(row, out)
        print(json.dumps(summary, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
