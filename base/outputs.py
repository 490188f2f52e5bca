"""What runs report, declared once: the maps (DESIGN.md decision 9) and the metrics beside them.

A method's module lists what its runs report in ``OUTPUTS`` (an :class:`Outputs`, next to its ``Config``)
and builds its maps and metric names from these declarations; analysis, the runner and the figures read
the declarations, never a typed name (``tests/test_outputs.py`` checks both: every map and metric of a
run of each method is declared, and no declared name is typed as a string in ``analysis/``). The
declarations are torch-free, so analysis imports them without the methods.

- :class:`MapOutput`: a map ``<kind>.<what>``, what a value says, its continuous ``companion`` (a
  binarised map's scores, used where the binarised map is constant), the map it is ``derived_from``
  (compared with it, rho is near 1 by construction), and ``each``: the map comes once per task,
  relation, label or pattern, named ``<name><sep><part>`` (``heads.gate.<task>``).
- :class:`Metric`: a metric's name, meaning and whether a figure plots it as a result (``score``:
  accuracy does; a loss, a head count or the collapse flag does not). Its value on another evaluation
  set is ``<name>/<set>`` (``accuracy/ood``), on every metric.
- :class:`MetricFamily`: metrics named by a pattern (``<metric>_pruned_<pct>``): :meth:`MetricFamily.name`
  builds one, :meth:`MetricFamily.parse` reads one back.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from base import collapse
from base.result import KINDS, UnitMap, check_map_name


@dataclass(frozen=True)
class MapOutput:
    name: str
    """``<kind>.<what>``: ``heads.gate``."""
    meaning: str
    """One line: what a value says (a run may add its details: how many examples, which set)."""
    companion: str | None = None
    """A continuous map of the same run that ranks the units where this one is constant."""
    derived_from: str | None = None
    """A map of the same run this one is computed from: default comparisons leave the pair out."""
    each: str = ""
    """``".<task>"``: the map comes once per task (``heads.gate.<task>``); the first character is the separator."""

    def __post_init__(self) -> None:
        check_map_name(self.name, self.kind)
        if self.kind not in KINDS:
            raise ValueError(f"unknown map kind '{self.kind}' of map '{self.name}' (kinds: {', '.join(KINDS)})")

    @property
    def kind(self) -> str:
        return self.name.partition(".")[0]

    def __call__(self, values: Any, meaning: str | None = None, part: str | None = None) -> tuple[str, UnitMap]:
        """``(name, UnitMap)`` of this map (of ``part``: ``named(part)``), meaning ``meaning`` or the declared one."""
        return (self.name if part is None else self.named(part)), UnitMap(values, self.kind, meaning or self.meaning)

    def named(self, part: str) -> str:
        """The name of this map for one task / relation / label / pattern: ``heads.gate.sst2``."""
        if not self.each:
            raise ValueError(f"map '{self.name}' comes once per run, not once per {part!r}")
        return f"{self.name}{self.each[0]}{part}"

    def matches(self, name: str) -> bool:
        """Whether ``name`` is this map or one of its per-part maps."""
        return name == self.name or bool(self.each) and name.startswith(f"{self.name}{self.each[0]}")

    def part(self, name: str) -> str | None:
        """``heads.gate.sst2`` -> ``"sst2"``; this map's own name -> ``""``; another map -> None."""
        if name == self.name:
            return ""
        return name[len(self.name) + 1:] if self.matches(name) else None


@dataclass(frozen=True)
class Metric:
    name: str
    meaning: str
    score: bool = True
    """A result a figure plots on y (accuracy), not a loss, a count or a flag."""

    def matches(self, name: str) -> bool:
        return name.partition("/")[0] == self.name


@dataclass(frozen=True)
class MetricFamily:
    pattern: str
    """How a user reads it: ``<metric>_pruned_<pct>``."""
    template: str
    """``str.format`` template of a name: ``{metric}_pruned_{pct}``."""
    regex: str
    """A full match of a name, with a group per field (and ``where``: an evaluation set's ``/<set>``)."""
    meaning: str

    def name(self, **fields: Any) -> str:
        return self.template.format(**fields)

    def parse(self, name: str) -> dict[str, str] | None:
        """The fields of ``name`` (None when it is not of this family)."""
        found = re.fullmatch(self.regex, name)
        return None if found is None else {k: v or "" for k, v in found.groupdict().items()}

    def matches(self, name: str) -> bool:
        return self.parse(name) is not None


@dataclass(frozen=True)
class Outputs:
    """What one method's runs report: ``maps`` and ``metrics`` (metrics and families)."""

    maps: tuple[MapOutput, ...] = ()
    metrics: tuple[Metric | MetricFamily, ...] = ()

    def __add__(self, other: Outputs) -> Outputs:
        return Outputs(self.maps + other.maps, self.metrics + other.metrics)

    def undeclared(self, maps: Any, metrics: Any) -> list[str]:
        """The names among ``maps`` and ``metrics`` that none of these declarations covers."""
        return ([name for name in maps if not any(m.matches(name) for m in self.maps)]
                + [name for name in metrics if not any(m.matches(name) for m in self.metrics)])


# --------------------------------------------------------------------------- maps

GATE = MapOutput("heads.gate", "test-time gate of each head, 0 = removed, 1 = fully open",
                 companion="heads.log_alpha", each=".<task>")
LOG_ALPHA = MapOutput("heads.log_alpha", "Hard Concrete log_alpha: larger = more likely open", each=".<task>")
KEPT = MapOutput("heads.kept", "1 = among the top heads by log_alpha (head_gates.sparsity)")
IMPORTANCE = MapOutput("heads.importance", "Michel importance E|dL/dxi| (larger = more important)")
PRUNED_AT = MapOutput("heads.pruned_at", "fraction of heads pruned when it was removed (larger = kept longer)",
                      derived_from="heads.importance")
HEAD_ABLATION = MapOutput("heads.ablation_delta", "dev metric with the head disabled minus full (negative = needed)")
LAYER_ABLATION = MapOutput("layers.ablation_delta", "dev metric with the layer disabled minus full (negative = needed)")
PREDICTIVITY = MapOutput("neurons.predictivity", "skill-neuron predictivity of each FFN neuron (max over subtasks)")
HEAD_DENSITY = MapOutput("heads.mask_density", "fraction of the head's Q, K, V rows and output columns kept")
NEURON_DENSITY = MapOutput("neurons.mask_density", "fraction of the FFN neuron's input row and output column kept")
WEIGHT_DENSITY = MapOutput("weights.mask_density", "fraction of each layer's matrix kept")
ATTENTION_CHANGE = MapOutput("heads.attention_change", "cosine similarity of attention maps, pretrained vs "
                                                       "fine-tuned (1 = unchanged)")
CLS_SEP_SHARE = MapOutput("heads.cls_sep_share", "share of attention on [CLS]/[SEP]")
PATTERN = MapOutput("heads.pattern", "share of examples with an attention map of the pattern (rule)", each="_<pattern>")
CONFIDENCE = MapOutput("heads.confidence", "mean of the largest attention weight per token (Voita confidence)")
POSITIONAL = MapOutput("heads.positional", "share of tokens whose argmax is the previous or the next token")
SYNTACTIC = MapOutput("heads.syntactic", "share of the relation's arcs where the dependent attends most to its head "
                                         "(<relation>.reverse: the head to its dependent)", each=".<relation>")
RARE_WORD = MapOutput("heads.rare_word", "share of sentences whose most-attended word is its rarest")
DEP_PROBE = MapOutput("heads.dep_probe", "share of arcs where argmax word attention links head and dependent",
                      each=".<relation>")
POS_CENTROID = MapOutput("heads.pos_centroid", "share of words whose head output is closest to its UPOS centroid",
                         each=".<upos>")

MASK_DENSITIES = (HEAD_DENSITY, NEURON_DENSITY, WEIGHT_DENSITY)
"""The maps of every weight-masked run (mask_train, imp)."""
DEFAULT_MAP = GATE
"""The map agreement compares when none is named: the heads a gate method keeps."""

# --------------------------------------------------------------------------- metrics

ACCURACY = Metric("accuracy", "share of dev predictions that are right (every task's METRIC)")
LOSS = Metric("loss", "dev loss", score=False)
TRAIN_LOSS = Metric("train_loss", "training loss at the end", score=False)
TOP_CLASS_SHARE = Metric(collapse.TOP_CLASS_SHARE, "share of dev predictions in the most predicted class", score=False)
LOSS_VS_UNIFORM = Metric(collapse.LOSS_VS_UNIFORM, "dev loss over ln K, the uniform guess's", score=False)
COLLAPSED = Metric(collapse.COLLAPSED, "1 = the run predicts one class or no better than uniform", score=False)
EVALUATION = (ACCURACY, LOSS, TRAIN_LOSS, TOP_CLASS_SHARE, LOSS_VS_UNIFORM, COLLAPSED)
"""What every run that trains and evaluates a classifier reports (``experiments.training.loop.evaluate``, the runner)."""
OPEN_HEADS = Metric("open_heads", "heads left open (gates > 0 at test time, or not pruned)", score=False)
EXPECTED_OPEN_HEADS = Metric("expected_open_heads", "expected open heads under the Hard Concrete gates", score=False)
L0_PENALTY = Metric("l0_penalty", "the L0 penalty of the gates", score=False)
SPARSITY = Metric("sparsity", "the realised fraction of the masked weights removed", score=False)
PRUNED_KEPT_FRACTION = Metric("pruned_kept_fraction", "fraction of the pruned layers' FFN neurons kept", score=False)

TRANSFER_RELATIVE = Metric("transfer_relative", "zero-shot transfer: source prompt on the target task / target "
                                                "prompt's own accuracy")
TRANSFER_ACCURACY = Metric("transfer_accuracy", "zero-shot transfer: dev accuracy of the source prompt on the target task")
OVERLAP_TOP20 = Metric("overlap_top20", "shared fraction of the two prompts' top 20 % skill neurons")
OVERLAP_ACTIVE = Metric("overlap_active", "overlap (cosine) of the neurons the two prompts activate")

PRUNED = MetricFamily("pruned_<metric>", "pruned_{metric}", r"pruned_(?P<metric>[a-z_]+)(?P<where>/.+)?",
                      "an evaluation metric of the copy with the FFN neurons pruned (skill_neurons.prune_fraction)")
PRUNING_CURVE = MetricFamily("<metric>_pruned_<pct>", "{metric}_pruned_{pct}",
                             r"(?P<metric>.+)_pruned_(?P<pct>\d+)(?P<where>/.+)?",
                             "the metric with pct percent of the heads pruned (head_importance's curve)")
NOISE = MetricFamily("<metric>_noise_<top|random>_<fraction>", "{metric}_noise_{which}_{fraction:g}",
                     r"(?P<metric>.+)_noise_(?P<which>top|random)_(?P<fraction>[0-9.e-]+)",
                     "the metric with noise on the top / random fraction of the skill neurons")
SOURCE_NOISE = MetricFamily("<metric>_noise_source_<top|random>_<fraction>", "{metric}_noise_source_{which}_{fraction:g}",
                            r"(?P<metric>.+)_noise_source_(?P<which>top|random)_(?P<fraction>[0-9.e-]+)",
                            "the target prompt's metric with noise on the SOURCE prompt's top / random neurons")
COST = MetricFamily("cost.<part>_s", "cost.{part}_s", r"cost\.(?P<part>\w+)_s",
                    "wall seconds of one part of the run (base.costs); part total: the whole run")
COST_TOTAL = COST.name(part="total")
FIRST_IN_WORKER = Metric("cost.first_in_worker", "1 = the first run of its worker process (paid the imports)",
                         score=False)

MAPS = (GATE, LOG_ALPHA, KEPT, IMPORTANCE, PRUNED_AT, HEAD_ABLATION, LAYER_ABLATION, PREDICTIVITY, *MASK_DENSITIES,
        ATTENTION_CHANGE, CLS_SEP_SHARE, PATTERN, CONFIDENCE, POSITIONAL, SYNTACTIC, RARE_WORD, DEP_PROBE, POS_CENTROID)
"""Every map a built-in method declares."""
METRICS = (*EVALUATION, OPEN_HEADS, EXPECTED_OPEN_HEADS, L0_PENALTY, SPARSITY, PRUNED_KEPT_FRACTION,
           TRANSFER_RELATIVE, TRANSFER_ACCURACY, OVERLAP_TOP20, OVERLAP_ACTIVE, FIRST_IN_WORKER)
"""The metrics analysis reads by name (methods declare their others in their own ``OUTPUTS``)."""
FAMILIES = (PRUNED, PRUNING_CURVE, NOISE, SOURCE_NOISE, COST)
RUNNER = Outputs(metrics=(COST, FIRST_IN_WORKER))
"""What the runner adds to every run's metrics (``experiments.harness.runner``)."""

DERIVED = {m.name: m.derived_from for m in MAPS if m.derived_from}
"""Map -> the map of the same run it is computed from (``heads.pruned_at`` -> ``heads.importance``)."""
NOT_SCORES = tuple(m.name for m in METRICS if not m.score)
"""Metrics no figure plots as a result on y (on any evaluation set)."""


def companion(name: str) -> str | None:
    """The companion of map ``name`` or of its per-part map: ``heads.gate.sst2`` -> ``heads.log_alpha.sst2``."""
    for declared in MAPS:
        part = declared.part(name)
        if part is not None and declared.companion:
            return declared.companion + (f"{declared.each[0]}{part}" if part else "")
    return None

