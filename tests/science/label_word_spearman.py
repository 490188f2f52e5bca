"""Issue 31 item 5: why the random-label-word Spearman is 0.31-0.41 here against the paper's 0.87.

Not a test (no test lane collects it): a rerunnable measurement on the real MiniLM and SST-2.

    nice -n 19 env PYTHONPATH=$PWD .venv/bin/python tests/science/label_word_spearman.py train \\
        --readout product --word-seeds 0 1 2 --out-dir tests/science/results/label_words
    nice -n 19 env PYTHONPATH=$PWD .venv/bin/python tests/science/label_word_spearman.py train \\
        --readout reference --word-seeds 0 1 2 --max-epochs 2 --out-dir tests/science/results/label_words
    PYTHONPATH=$PWD .venv/bin/python tests/science/label_word_spearman.py table \\
        --out-dir tests/science/results/label_words

``train``: for each word seed, the product's skill_neurons run of examples/grid_skill_neurons.yaml's
include (MiniLM, SST-2, 1,000 training phrases, batch 32, seed 0, ``verbalizer: random_words``,
``skill_neurons.word_seed``) built by the product (``prompting.build``) and trained by the product's
step (frozen backbone in eval mode, Adam on the prompt at lr 1e-2), one epoch at a time. After epoch 2
(the grid's 64 steps) and at the loss plateau the neuron predictivity is computed with the product's
maths (``capture_ffn``, ``subtask_sums``, ``correct_counts``, ``neuron_predictivity``): baseline = the
mean over the 1,000 training phrases, correct counts on ALL 6,735 dev phrases, kept in six buckets
(rank in the product's dev draw < 300 / < 872 / the rest, x even / odd rank), so that one pass gives the
map on the product's 300 (``max_eval: 300`` draws exactly these), on 872 (the size of GLUE's dev), on
all 6,735, and on two disjoint halves of each (the split-half reliability of the map). The untrained
prompt's map (step 0, identical for every word seed: the prompt starts from the run seed's words, and
the verbalizer does not enter the activations) is computed once.

- ``--readout product``: the product's read-out (the prompt positions' mean final state, standardised
  per dimension, dot the unit-norm input embeddings of the words).
- ``--readout reference``: what the reference reads where MiniLM allows it (src/modelzoo.py
  ``RobertaPrompt.processoutput``: ``logits[:, 0, words]`` of the MLM head at its first input vector,
  a trainable <mask> embedding): the final state of the FIRST trainable vector (our position 1; [CLS]
  keeps position 0), not standardised, dot the RAW input embeddings of the words (the tied decoder's
  rows). MiniLM ships no MLM head, so its transform (dense, gelu, LayerNorm) and bias are absent.

Plateau: the epoch-mean training loss (32 steps, 1,000 phrases) has not improved on the best epoch by
1 % for 2 epochs in a row; cap ``--max-epochs`` (20 = 640 steps).

``table``: Spearman rho between the word seeds' maps (6 x 1,536 neurons, flattened, as ``headsweep
agreement``), with a 95 % bootstrap interval over neurons (1,000 resamples of the 9,216 neurons, the
same resample for every pair; the mean over pairs is bootstrapped with it), the permutation null
(each map's neurons relabelled within each layer, 1,000 times: mean and 97.5th percentile), and the
split-half reliability (rho between the two halves' maps of one prompt, Spearman-Brown to the full
size). Writes ``table.md`` and ``table.jsonl`` beside the maps.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from analysis.statistics.spearman import rank_rows, spearman_between
from experiments import RunContext, parse_config
from experiments.components.prompting import PromptedEncoder, build
from experiments.interventions.neurons import capture_ffn
from experiments.maths.losses import task_loss
from experiments.maths.predictivity import (
    combined_score,
    correct_counts,
    neuron_predictivity,
    subtask_labels,
    subtask_sums,
)
from experiments.models import load_tokenizer
from experiments.tasks.parts import split_seed
from experiments.training.loop import (
    batch_indices,
    batches,
    evaluate,
    forward_logits,
    num_steps,
    take,
    update,
)

GRID_EPOCHS = 2  # examples/grid_skill_neurons.yaml: 2 epochs of 32 over 1,000 phrases = 64 steps
BUCKETS = ("a0", "a1", "b0", "b1", "c0", "c1")  # rank < 300 / < 872 / rest, x rank parity
DEV_SETS = {  # name -> buckets
    "300": ("a0", "a1"), "300_h0": ("a0",), "300_h1": ("a1",),
    "872": ("a0", "a1", "b0", "b1"), "872_h0": ("a0", "b0"), "872_h1": ("a1", "b1"),
    "all": BUCKETS, "all_h0": ("a0", "b0", "c0"), "all_h1": ("a1", "b1", "c1"),
}


# ------------------------------------------------------------------------------ the runs


def config(word_seed: int, max_train: int, seed: int, model: str = "minilm-l6", max_eval: int | None = None):
    return parse_config({
        "model": model, "method": "skill_neurons", "seed": seed,
        "task": {"name": "sst2", "max_train": max_train, "max_eval": max_eval, "max_length": 64},
        "train": {"epochs": GRID_EPOCHS, "batch_size": 32, "eval_every": 16},
        "skill_neurons": {"verbalizer": "random_words", "word_seed": word_seed, "prune_fraction": None},
    })


class ReferenceReadout(torch.nn.Module):
    """The reference's read-out without the MLM head MiniLM lacks: the first trainable vector's final
    state (our position 1) dot the raw input embeddings of the words; nothing standardised, nothing trained."""

    def __init__(self, words: torch.Tensor):
        super().__init__()
        self.register_buffer("words", words.detach().clone())  # (C, E)

    def forward(self, hidden: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return hidden[:, 1] @ self.words.T


def member(word_seed: int, seed: int) -> str:
    """A run's name in its group's files: its word seed, and its run seed when not 0."""
    return f"w{word_seed}" if seed == 0 else f"w{word_seed}s{seed}"


def rows_of(split, index: torch.Tensor):
    """The examples ``index`` of a Split."""
    return replace(split, input_ids=split.input_ids[index], attention_mask=split.attention_mask[index],
                   labels=split.labels[index])


def raw_word_rows(state, model_name: str, words: list[str]) -> torch.Tensor:
    """The words' input embeddings as the product picks them (a word of several pieces: their mean), not normalised."""
    tokenizer = load_tokenizer(model_name)
    table = state.encoder.get_input_embeddings().weight.detach()
    return torch.stack([table[tokenizer(w, add_special_tokens=False)["input_ids"]].mean(dim=0) for w in words])


def dev_buckets(n_dev: int, data_seed: int) -> dict[str, torch.Tensor]:
    """Bool masks over dev (file order) of each bucket; rank = position in the product's dev draw
    (``subset_indices``: the first ``max_eval`` of this permutation are what ``max_eval`` keeps)."""
    perm = torch.randperm(n_dev, generator=torch.Generator().manual_seed(split_seed(data_seed, "dev")))
    rank = torch.empty(n_dev, dtype=torch.long)
    rank[perm] = torch.arange(n_dev)
    part = torch.where(rank < 300, 0, torch.where(rank < 872, 1, 2))
    return {f"{'abc'[p]}{parity}": (part == p) & (rank % 2 == parity) for p in range(3) for parity in range(2)}


@torch.no_grad()
def predictivity_maps(model: PromptedEncoder, state, buckets: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """``{dev set: (L, I) predictivity}``: the product's find_skill_neurons with the dev counts kept per bucket."""
    n = model.prompt.weight.shape[0]
    positions = torch.arange(1, 1 + n)
    train, dev, bs = state.data.train, state.data.dev, state.cfg.train.batch_size
    sub_train = subtask_labels(train.labels, 2)
    sub_dev = subtask_labels(dev.labels, 2)  # (1, N)
    model.eval()
    with capture_ffn(model.backbone, positions) as capture:
        sums = None
        for (ids, mask, _), labels in zip(batches(train, bs, "cpu"), sub_train.split(bs, dim=1), strict=True):
            model(ids, mask)
            part = subtask_sums(capture.take().to(torch.float64), labels)
            sums = part if sums is None else sums + part
        baselines = sums / (sub_train >= 0).sum(dim=1).to(torch.float64).view(-1, 1, 1, 1)
        correct = {b: 0 for b in BUCKETS}
        for start, (ids, mask, _) in zip(range(0, len(dev), bs), batches(dev, bs, "cpu"), strict=True):
            model(ids, mask)
            acts = capture.take()
            labels = sub_dev[:, start : start + bs]
            for b in BUCKETS:
                masked = torch.where(buckets[b][start : start + bs], labels, -1)
                correct[b] = correct[b] + correct_counts(acts, baselines, masked)
    out = {}
    for name, parts in DEV_SETS.items():
        count = sum(correct[b] for b in parts)
        size = sum(int(((sub_dev[0] >= 0) & buckets[b]).sum()) for b in parts)
        out[name] = combined_score(neuron_predictivity(count, torch.tensor([size]))[0]).numpy().astype(np.float32)
    return out


def train_one(word_seed: int, readout_kind: str, args, buckets_cache: dict) -> list[dict]:
    cfg = config(word_seed, args.max_train, args.seed, args.model)
    state, model, optimizer = build(cfg, RunContext())
    if readout_kind == "reference":
        state.decoders["task"] = ReferenceReadout(raw_word_rows(state, cfg.model, state.values["label_words"]))
    readout = state.decoder
    heldout = None
    if args.heldout:  # the reference's protocol: a plateau of a held-out loss, the best prompt kept
        full = state.data.train
        pick = torch.randperm(len(full), generator=torch.Generator().manual_seed(12345))
        heldout = rows_of(full, pick[: args.heldout].sort().values)
        state.data = replace(state.data, train=rows_of(full, pick[args.heldout :].sort().values))
    dev = state.data.dev
    if "buckets" not in buckets_cache:
        buckets_cache["buckets"] = dev_buckets(len(dev), cfg.task.data_seed)
    buckets = buckets_cache["buckets"]
    dev300 = rows_of(dev, (buckets["a0"] | buckets["a1"]).nonzero().flatten())
    per_epoch = math.ceil(len(state.data.train) / cfg.train.batch_size)
    grid_steps = num_steps(len(state.data.train), cfg.train.batch_size, GRID_EPOCHS, None)
    tag = f"{readout_kind}{args.tag}_{member(word_seed, args.seed)}"
    out_dir = Path(args.out_dir)
    rows, started = [], time.time()

    def emit(row: dict) -> None:
        row = {"readout": readout_kind + args.tag, "word_seed": word_seed, "seed": args.seed,
               "words": state.values["label_words"],
               "wall_s": round(time.time() - started, 1)} | row
        rows.append(row)
        with open(out_dir / "runs.jsonl", "a") as f:
            f.write(json.dumps(row) + "\n")

    def snapshot(name: str) -> None:
        t0 = time.time()
        maps = predictivity_maps(model, state, buckets)
        np.savez_compressed(out_dir / f"{tag}_{name}.npz", **maps)
        emit({"snapshot": name, "step": step, "predict_s": round(time.time() - t0, 1),
              "top1_all": float(maps["all"].max()), "mean_all": float(maps["all"].mean())})

    step = 0
    if args.step0 and not (out_dir / "untrained.npz").exists():
        maps = predictivity_maps(model, state, buckets)
        np.savez_compressed(out_dir / "untrained.npz", **maps)
        emit({"snapshot": "untrained", "step": 0})
    best, stale, epoch = math.inf, 0, 0
    window = args.eval_every or per_epoch
    while step < args.max_epochs * per_epoch:
        losses = []
        state.train()
        for _ in range(window):
            batch = take(state.data.train, batch_indices(step, len(state.data.train), cfg.train.batch_size,
                                                         cfg.seed), "cpu")
            ids, mask, labels = batch
            state.encoder.eval()  # the product's step: frozen backbone, no dropout
            logits = forward_logits(model, readout, ids, mask, state.precision)
            losses.append(update(task_loss(logits, labels), optimizer, scaler=state.scaler))
            step += 1
        epoch = step / per_epoch
        mean_loss = float(np.mean(losses))
        metrics = evaluate(model, readout, dev300, state.task, 32, "cpu")
        row = {"epoch": round(epoch, 2), "step": step, "train_loss": round(mean_loss, 4),
               "dev300_accuracy": round(float(metrics["accuracy"]), 4), "dev300_loss": round(float(metrics["loss"]), 4)}
        monitored = mean_loss
        if heldout is not None:
            monitored = float(evaluate(model, readout, heldout, state.task, 32, "cpu")["loss"])
            row["heldout_loss"] = round(monitored, 4)
        emit(row)
        if step == grid_steps and heldout is None:
            snapshot("grid")
        if monitored < best * (1 - args.rel_tol):
            best, stale, best_step = monitored, 0, step
            kept = [{k: v.clone() for k, v in module.state_dict().items()} for module in (model.prompt, readout)]
        else:
            stale += 1
        if stale >= args.patience or (args.max_epochs <= GRID_EPOCHS and step >= grid_steps):
            break
    if heldout is not None:  # the best held-out loss's prompt (and read-out statistics), as the reference keeps its best
        model.prompt.load_state_dict(kept[0])
        readout.load_state_dict(kept[1])
        step = best_step
        metrics = evaluate(model, readout, dev300, state.task, 32, "cpu")
        emit({"best": {"step": best_step, "heldout_loss": round(best, 4),
                       "dev300_accuracy": round(float(metrics["accuracy"]), 4)}})
        snapshot("heldout")
        emit({"plateau": {"epochs": round(epoch, 2), "steps": round(epoch * per_epoch), "stale": stale,
                          "capped": stale < args.patience}})
    elif step != grid_steps:
        snapshot("plateau")
        emit({"plateau": {"epochs": round(epoch, 2), "steps": step, "stale": stale, "capped": stale < args.patience}})
    return rows


# ------------------------------------------------------------------------------ the table


def spearman_ci(maps: list[np.ndarray], pairs: list[tuple[int, int]], n_boot: int, rng) -> tuple[list, list]:
    """Each pair's rho and 95 % bootstrap interval over neurons (one resample for all pairs), and the
    mean over pairs with its interval."""
    x = np.stack([m.ravel() for m in maps]).astype(np.float64)
    rho = spearman_between(x, x)
    observed = [float(rho[i, j]) for i, j in pairs]
    boots = np.empty((n_boot, len(pairs)))
    for b in range(n_boot):
        idx = rng.integers(0, x.shape[1], x.shape[1])
        r = np.corrcoef(rank_rows(x[:, idx]))
        boots[b] = [r[i, j] for i, j in pairs]
    per_pair = [(o, *np.percentile(boots[:, k], [2.5, 97.5])) for k, o in enumerate(observed)]
    mean = (float(np.mean(observed)), *np.percentile(boots.mean(axis=1), [2.5, 97.5]))
    return per_pair, mean


def permutation_null(maps: list[np.ndarray], pairs: list[tuple[int, int]], n_perm: int, rng,
                     within_layers: bool) -> tuple[float, float]:
    """rho of each pair with the second map's neurons relabelled within each layer (the layer profile kept)
    or across all neurons (the product's two nulls, analysis/statistics/nulls.py): mean and 97.5th percentile."""
    ranks = [rank_rows(m.reshape(1, -1).astype(np.float64))[0].reshape(m.shape) for m in maps]
    values = []
    for _ in range(n_perm):
        for i, j in pairs:
            if within_layers:
                shuffled = np.stack([row[rng.permutation(row.size)] for row in ranks[j]]).ravel()
            else:
                shuffled = rng.permutation(ranks[j].ravel())
            values.append(np.corrcoef(ranks[i].ravel(), shuffled)[0, 1])
    return float(np.mean(values)), float(np.percentile(values, 97.5))


def within_layer_rho(maps: list[np.ndarray], pairs: list[tuple[int, int]]) -> list[float]:
    """Each pair's mean over layers of the layer's own Spearman rho (no layer profile in it)."""
    return [float(np.mean([spearman_between(maps[i][layer][None].astype(np.float64),
                                            maps[j][layer][None].astype(np.float64))[0, 0]
                           for layer in range(maps[i].shape[0])])) for i, j in pairs]


def reliability(m: dict, size: str) -> tuple[float, float]:
    """Split-half rho of one prompt's map at ``size`` and its Spearman-Brown step-up to the full size."""
    r = float(spearman_between(m[f"{size}_h0"].reshape(1, -1).astype(np.float64),
                               m[f"{size}_h1"].reshape(1, -1).astype(np.float64))[0, 0])
    return r, 2 * r / (1 + r)


def table(args) -> None:
    """Per group (read-out and training set) and snapshot: the pairs that differ in the word seed only
    (the paper's number) and, where run, those that differ in the run seed only (prompt start and data
    order; the same words)."""
    out_dir = Path(args.out_dir)
    runs = [r | {"seed": r.get("seed", 0)} for r in map(json.loads, open(out_dir / "runs.jsonl"))]
    rng = np.random.default_rng(0)
    rows = []
    conditions = list(dict.fromkeys((r["readout"], r["snapshot"]) for r in runs
                                    if r.get("snapshot") not in (None, "untrained")))
    untrained = np.load(out_dir / "untrained.npz") if (out_dir / "untrained.npz").exists() else None
    for group, snap in conditions:
        done = [r for r in runs if r["readout"] == group and r.get("snapshot") == snap]
        members = sorted({(r["word_seed"], r["seed"]) for r in done}, key=lambda m: (m[1], m[0]))
        loaded = {m: np.load(out_dir / f"{group}_{member(*m)}_{snap}.npz") for m in members}
        info = {}
        for m in members:
            mine = [r for r in runs if r["readout"] == group and (r["word_seed"], r["seed"]) == m]
            at = next(r["step"] for r in mine if r.get("snapshot") == snap)
            best = [r["best"]["dev300_accuracy"] for r in mine if "best" in r]
            info[m] = {"step": at, "dev300_accuracy": best[0] if best else
                       next(r["dev300_accuracy"] for r in mine if r.get("step") == at and "epoch" in r)}
        for across, same in (("word_seed", 1), ("seed", 0)):
            pairs = [(i, j) for i in range(len(members)) for j in range(i + 1, len(members))
                     if members[i][same] == members[j][same]]
            if not pairs:
                continue
            used = sorted({k for p in pairs for k in p})
            for dev_set in ("300", "872", "all"):
                maps = [loaded[m][dev_set] for m in members]
                per_pair, mean = spearman_ci(maps, pairs, args.n_boot, rng)
                row = {"group": group, "snapshot": snap, "across": across, "dev": dev_set,
                       "runs": [member(*members[k]) for k in used],
                       "steps": [info[members[k]]["step"] for k in used],
                       "dev300_accuracy": [info[members[k]]["dev300_accuracy"] for k in used],
                       "pairs": [[member(*members[i]), member(*members[j])] for i, j in pairs],
                       "rho": [[round(v, 3) for v in p] for p in per_pair], "mean": [round(v, 3) for v in mean],
                       "null_within_layers": [round(v, 4) for v in
                                              permutation_null(maps, pairs, args.n_perm, rng, within_layers=True)],
                       "null_all_units": [round(v, 4) for v in
                                          permutation_null(maps, pairs, args.n_perm, rng, within_layers=False)],
                       "within_layer_rho": [round(v, 3) for v in within_layer_rho(maps, pairs)],
                       "reliability": [round(reliability(loaded[members[k]], dev_set)[1], 3) for k in used]}
                if untrained is not None and across == "word_seed":
                    x = np.stack([untrained[dev_set].ravel()] + [maps[k].ravel() for k in used]).astype(np.float64)
                    row["untrained_vs_trained"] = [round(float(v), 3) for v in spearman_between(x[:1], x[1:])[0]]
                rows.append(row)
                print(json.dumps(row), flush=True)
    with open(out_dir / "table.jsonl", "w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    with open(out_dir / "table.md", "w") as f:
        f.write("| read-out, training | snapshot (steps) | across | dev | dev300 accuracy | rho per pair [95 % CI] | "
                "mean [95 % CI] | null within layers / all units (mean, 97.5 %) | within-layer rho | reliability |\n")
        f.write("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
        for r in rows:
            pairs = "; ".join(f"{v[0]:.3f} [{v[1]:.3f}, {v[2]:.3f}]" for v in r["rho"])
            f.write(f"| {r['group']} | {r['snapshot']} ({'/'.join(map(str, r['steps']))}) | {r['across']} | {r['dev']} | "
                    f"{' / '.join(f'{a:.2f}' for a in r['dev300_accuracy'])} | {pairs} | "
                    f"{r['mean'][0]:.3f} [{r['mean'][1]:.3f}, {r['mean'][2]:.3f}] | "
                    f"{r['null_within_layers'][0]:.3f} ({r['null_within_layers'][1]:.3f}) / "
                    f"{r['null_all_units'][0]:.3f} ({r['null_all_units'][1]:.3f}) | "
                    f"{' / '.join(f'{v:.2f}' for v in r['within_layer_rho'])} | "
                    f"{' / '.join(f'{v:.2f}' for v in r['reliability'])} |\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    tr = sub.add_parser("train")
    tr.add_argument("--readout", choices=["product", "reference"], default="product")
    tr.add_argument("--word-seeds", type=int, nargs="+", default=[0, 1, 2])
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--max-train", type=int, default=1000)
    tr.add_argument("--max-epochs", type=int, default=20)
    tr.add_argument("--patience", type=int, default=2)
    tr.add_argument("--eval-every", type=int, default=0, help="steps between plateau checks; 0 = one epoch")
    tr.add_argument("--rel-tol", type=float, default=0.01)
    tr.add_argument("--heldout", type=int, default=0, help="hold out this many training phrases: the plateau "
                    "of their loss, the best prompt kept (with --max-train the total drawn)")
    tr.add_argument("--tag", default="", help="suffix of the run's files (another training set)")
    tr.add_argument("--step0", action="store_true", help="also the untrained prompt's map (once)")
    tr.add_argument("--threads", type=int, default=2)
    tr.add_argument("--model", default="minilm-l6", help="tiny-bert: a smoke test of the script")
    tr.add_argument("--out-dir", required=True)
    tb = sub.add_parser("table")
    tb.add_argument("--out-dir", required=True)
    tb.add_argument("--n-boot", type=int, default=1000)
    tb.add_argument("--n-perm", type=int, default=200)
    args = parser.parse_args()
    if args.command == "table":
        table(args)
        return
    torch.set_num_threads(args.threads)
    Path(args.out_dir).mkdir(parents=True, exist_ok=True)
    cache: dict = {}
    for w in args.word_seeds:
        train_one(w, args.readout, args, cache)


if __name__ == "__main__":
    main()
