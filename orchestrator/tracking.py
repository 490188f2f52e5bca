"""The MLflow side of tracking: ``MlflowClient`` with explicit run ids, never fluent state.

DESIGN.md decision 3: trials log from inside the trial with explicit run ids;
the driver creates the experiment once and passes its id in. Writes are
batched (``log_batch``: 19 ms per run vs 87 ms with single calls, measured).
Every call goes through :class:`RetryingClient`: a restarting MLflow database (or server) is
waited out with the registry's policy (``orchestrator/retry.py``), and a run is created once.
"""

from __future__ import annotations

import functools
import json
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import TEMPORARILY_UNAVAILABLE, ErrorCode
from requests.exceptions import ConnectionError as RequestsConnectionError
from sqlalchemy.exc import DBAPIError

from orchestrator import retry, settings

_BATCH = 100  # MLflow's log_batch limit is 100 params / 1000 metrics per call
_PARAM_MAX = 6000


def transient_mlflow_error(err: BaseException) -> bool:
    """An MLflow error worth a retry: its database lost the connection (MLflow's SQL store wraps
    SQLAlchemy's error in an ``MlflowException``; judged as the registry judges it), or the
    tracking server is unreachable or says it is temporarily unavailable."""
    seen: BaseException | None = err
    for _ in range(8):  # the error and what caused it
        if seen is None:
            break
        if isinstance(seen, DBAPIError):
            return retry.transient_db_error(seen)
        if isinstance(seen, RequestsConnectionError):
            return True
        seen = seen.__cause__ or seen.__context__
    return isinstance(err, MlflowException) and err.error_code == ErrorCode.Name(TEMPORARILY_UNAVAILABLE)


class RetryingClient:
    """An ``MlflowClient`` whose every method is retried on a transient error (``retry.call``).

    ``create_run`` is the one call that is not safe to repeat (a lost reply after a commit would
    make a second run): use :func:`start_run`, which retries it without duplicates."""

    _ONCE = frozenset({"create_run"})

    def __init__(self, mlflow: MlflowClient) -> None:
        self.unretried = mlflow

    def __getattr__(self, name: str) -> Any:
        if name == "unretried":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        attr = getattr(self.unretried, name)
        if not callable(attr) or name in self._ONCE or name.startswith("_"):
            return attr

        @functools.wraps(attr)
        def retried(*args: Any, **kwargs: Any) -> Any:
            return retry.call(lambda: attr(*args, **kwargs), transient_mlflow_error, what=f"mlflow {name}")

        return retried


def client(uri: str | None = None) -> RetryingClient:
    return RetryingClient(MlflowClient(tracking_uri=uri or settings.tracking_uri()))


def retrying_client(mlflow: MlflowClient | RetryingClient) -> RetryingClient:
    return mlflow if isinstance(mlflow, RetryingClient) else RetryingClient(mlflow)


EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}
"""The experiment tag MLflow 3's UI reads to choose its view: model training (runs, charts,
artifacts), not the GenAI overview (traces, latency, an assistant) it infers for an experiment
without it."""


def ensure_experiment(mlflow: MlflowClient, name: str) -> str:
    """The id of experiment ``name``, created with artifacts where ``settings.artifact_root`` says if missing,
    tagged so the MLflow UI opens it on its training runs (``EXPERIMENT_KIND``)."""
    found = mlflow.get_experiment_by_name(name)
    if found is not None:
        if found.tags.get("mlflow.experimentKind") is None:  # made before the tag, or by someone else
            mlflow.set_experiment_tag(found.experiment_id, *next(iter(EXPERIMENT_KIND.items())))
        return found.experiment_id
    try:
        root = settings.artifact_root()
        location = f"{root.rstrip('/')}/{name}" if root else None  # None: the tracking server's store
        return mlflow.create_experiment(name, artifact_location=location, tags=EXPERIMENT_KIND)
    except MlflowException:  # created meanwhile by another process
        return mlflow.get_experiment_by_name(name).experiment_id


def ui_url(experiment_id: str, run_id: str | None = None, port: int = 5000) -> str:
    """Where ``headsweep ui`` (on its default port) shows an experiment's training runs, or one run.

    ``workflowType=machine_learning`` opens MLflow 3's model-training view (runs, charts,
    artifacts) whatever the browser last chose; without it the UI may open the GenAI overview."""
    page = f"experiments/{experiment_id}" + (f"/runs/{run_id}" if run_id else "")
    return f"http://127.0.0.1:{port}/#/{page}?workflowType=machine_learning"


CREATE_ID_TAG = "headsweep.create_id"
"""A run's creation token (``start_run``): how a retry finds the run an earlier try created."""


def start_run(
    mlflow: MlflowClient, experiment_id: str, name: str, tags: Mapping[str, str] | None = None,
    parent_run_id: str | None = None,
) -> str:
    """Create a run (a child of ``parent_run_id`` if given) and return its id.

    Retried on a lost connection, once: a try whose reply was lost may have created the run, so
    each retry first looks for the ``headsweep.create_id`` tag the tries share."""
    raw = retrying_client(mlflow).unretried
    token = uuid.uuid4().hex
    all_tags = dict(tags or {}) | {CREATE_ID_TAG: token}
    if parent_run_id:
        all_tags["mlflow.parentRunId"] = parent_run_id
    tried = False

    def create() -> str:
        nonlocal tried
        if tried:
            found = raw.search_runs([experiment_id], f"tags.`{CREATE_ID_TAG}` = '{token}'", max_results=1)
            if found:
                return found[0].info.run_id
        tried = True
        return raw.create_run(experiment_id, run_name=name, tags=all_tags).info.run_id

    return retry.call(create, transient_mlflow_error, what="mlflow create_run")


def running_run_ids(mlflow: MlflowClient, experiment_id: str) -> set[str]:
    """The ids of the experiment's runs MLflow has RUNNING (every page)."""
    found: set[str] = set()
    token = None
    while True:
        page = mlflow.search_runs([experiment_id], "attributes.status = 'RUNNING'", max_results=1000,
                                  page_token=token)
        found.update(run.info.run_id for run in page)
        token = page.token
        if not token:
            return found


_BY_LABEL = {"task.name": "task", "task.id": "task", "model": "model"}
"""Config keys a child run's name shows by the run's label (its task, its model) when they vary."""
_NEVER_IN_THE_NAME = {"seed", "method"}
"""Keys every child run's name shows anyway (the method, the seed at its end)."""


def name_keys(configs: Sequence[Mapping[str, Any]]) -> list[str]:
    """The dotted config keys that vary across a sweep's runs (``head_gates.lambda``,
    ``finetune.loss``, ``task.name``), less the seed, the method, the pipelines and the stages'
    own keys: what a child run's name shows so that no two runs of the sweep share a name."""
    from base.sections import STAGE_ROLES, flatten

    values: dict[str, set[str]] = {}
    for config in configs:
        for key, value in flatten(dict(config)).items():
            values.setdefault(key, set()).add(json.dumps(value, sort_keys=True, default=str))
    varying = [key for key, seen in values.items() if len(seen) > 1]
    return sorted(key for key in varying if key not in _NEVER_IN_THE_NAME and not key.endswith(".pipeline")
                  and key.split(".", 1)[0] not in STAGE_ROLES)


def run_name(cfg, keys: Sequence[str], seed: bool = True) -> str:
    """``head_gates-dp-lambda=0.05-seed0``: what tells a sweep's runs apart, and nothing the whole
    sweep shares, so that MLflow's narrow run-name column shows the difference: the task and the
    model when they vary, the method and its pipeline, each of ``keys`` the run has (a method
    section's key by its short name, ``lambda``; ``train.lr`` whole), then the seed. Without the
    seed (``seed=False``) it names the run's cell, which its seeds share (the ``cell`` tag)."""
    from base.sections import flatten
    from experiments.harness.config_keys import short_name

    labels, flat = cfg.labels(), flatten(cfg.to_dict())
    shown = [labels[label] for label in ("task", "model") if label in {_BY_LABEL.get(key) for key in keys}]
    settings = [f"{short_name(key, cfg.method)}={flat[key]}" for key in keys
                if key not in _BY_LABEL and key in flat and key.split(".", 1)[0] in (cfg.method, "task", "train", "model")]
    parts = [*shown, labels["method"], labels.get("pipeline"), *settings, f"seed{labels['seed']}" if seed else None]
    return "-".join(str(part) for part in parts if part is not None)


def search_link(experiment_id: str, search: str) -> str:
    """The MLflow UI's runs table of an experiment filtered by ``search`` (MLflow's search syntax,
    run on the server over every run, not only the 100 a page of the table loads), as a link
    relative to the UI's root (``#/experiments/...``): what a run's description can link to."""
    from urllib.parse import urlencode

    return f"#/experiments/{experiment_id}/runs?" + urlencode({"searchFilter": search, "workflowType": "machine_learning"})


NOTE_TAG = "mlflow.note.content"
"""The tag MLflow's UI shows (as Markdown) as a run's description."""
_MAX_LINKED_VALUES = 12  # an axis with more values gets one example link, not one per value


def sweep_note(experiment_id: str, sweep_id: str, runs: int, configs: Sequence[Any], keys: Sequence[str],
               description: str = "") -> str:
    """The sweep's parent run's description: the grid's ``description`` (what the sweep asks), then
    links to its runs as MLflow searches, by axis value.

    MLflow's run page lists a parent's children 10 at a time and its runs table loads 100 runs a
    page (mlflow issues 1896, 17248): at thousands of children the parent page is no way to reach
    them. A search is: it runs on the server over every run. So the note links to every run of
    the sweep, to each value of each axis with few values, and shows how to find one cell's seeds
    (its ``cell`` tag, the run name without the seed). ``configs``: the grid's cells; ``keys``:
    the sweep's :func:`name_keys`, as its children's names use them."""
    from base.sections import flatten

    sweep = f"tags.sweep = '{sweep_id}'"
    lines = [description.strip(), ""] if description.strip() else []
    lines += [f"**{runs:,} runs** in this sweep. MLflow lists a parent run's children 10 at a time; "
             "these links search all of them (each opens the runs table: expand the sweep's row).", "",
             f"- [every run of the sweep]({search_link(experiment_id, sweep)})"]
    cell = run_name(configs[0], keys, seed=False)
    lines.append(f"- one cell's seeds: [`tags.cell = '{cell}'`]"
                 f"({search_link(experiment_id, f'{sweep} and tags.cell = {_quoted(cell)}')})")
    flat = [flatten(cfg.to_dict()) for cfg in configs]
    pipelines = sorted({key for row in flat for key in row if key.endswith(".pipeline")})  # the name shows them bare
    for key in ["seed", *pipelines, *keys]:
        # a list value (``task.text: [premise, hypothesis]``) is compared as MLflow logged it: its string
        values = sorted({_hashable(row.get(key)) for row in flat} - {None}, key=str)
        if len(values) < 2:
            continue
        field = f"params.`{key}`"
        shown = values if len(values) <= _MAX_LINKED_VALUES else values[:1]
        links = " · ".join(f"[{value}]({search_link(experiment_id, f'{sweep} and {field} = {_quoted(value)}')})"
                           for value in shown)
        more = "" if len(values) <= _MAX_LINKED_VALUES else f" (one of {len(values)} values; search ``{field} = '...'``)"
        lines.append(f"- {key}: {links}{more}")
    return "\n".join(lines)


def _hashable(value: Any) -> Any:
    return str(value) if isinstance(value, list | dict) else value


def parent_tags(sweep_id: str, grid_name: str, grid_tags: Mapping[str, str]) -> dict[str, str]:
    """The sweep's parent run's tags: the grid's ``tags``, then ``sweep`` and ``grid`` (the grid
    refuses tags of those names, ``orchestrator.driving.grid.RESERVED_TAGS``)."""
    return {**grid_tags, "sweep": sweep_id, "grid": grid_name}


def _quoted(value: Any) -> str:
    """A value as MLflow's search compares it to a param or tag: the string it was logged as."""
    return "'" + str(value).replace("'", "\\'") + "'"


class MlflowTracker:
    """experiments' Tracker, backed by one MLflow run (explicit ``run_id``)."""

    def __init__(self, mlflow: MlflowClient | RetryingClient, run_id: str) -> None:
        self.mlflow = retrying_client(mlflow)  # a restarting database is waited out, not fatal
        self.run_id = run_id

    def log_params(self, params: Mapping[str, object]) -> None:
        items = [Param(k, str(v)[:_PARAM_MAX]) for k, v in params.items()]
        for i in range(0, len(items), _BATCH):
            self.mlflow.log_batch(self.run_id, params=items[i : i + _BATCH])

    def set_tags(self, tags: Mapping[str, str]) -> None:
        items = [RunTag(k, str(v)) for k, v in tags.items()]
        for i in range(0, len(items), _BATCH):
            self.mlflow.log_batch(self.run_id, tags=items[i : i + _BATCH])

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        items = [Metric(k, float(v), now, step) for k, v in metrics.items()]
        self.mlflow.log_batch(self.run_id, metrics=items)

    def log_artifact(self, name: str, data: bytes) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / name
            path.write_bytes(data)
            self.mlflow.log_artifact(self.run_id, str(path))

    def finish(self, status: str = "FINISHED") -> None:
        """End the run: FINISHED, FAILED or KILLED."""
        self.mlflow.set_terminated(self.run_id, status=status)
