"""A sweep on a SLURM allocation, from the login node: ``headsweep slurm GRID`` writes an sbatch
script and submits it.

The script (:func:`script`; ``examples/slurm/headsweep.sbatch`` is one, commented) lives in a
folder of its own under ``$HEADSWEEP_HOME/slurm/``, one per grid (by its content), beside the
job's log and a file ``sweep`` with the sweep's id. It asks for the nodes, CPUs, GPUs and time
given, exports where the registry, MLflow, artifacts and checkpoints are (as this process resolves
them), and runs ``python -m orchestrator.slurm.allocation job FOLDER`` on the allocation's first
node: Ray on every node, the sweep submitted (its first allocation) or resumed (every later one),
waited for, Ray stopped (``orchestrator/slurm/allocation.py``).

Around it, SLURM's side of the story:

- ``--signal=B:USR1@90``: SIGUSR1 90 s before the time limit, recorded in the sweep's history;
  with ``--requeue`` the job then requeues itself (so does SLURM on preemption);
- ``--dependency=singleton`` (by the job's name, one per folder): two allocations of one sweep
  never run at once, however often the script is submitted;
- ``--open-mode=append``: a requeued job's log goes on; ``--chdir``: relative paths in the grid
  resolve as they did where ``headsweep slurm`` ran.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from base.sections import ConfigError
from orchestrator import settings
from orchestrator.driving.writer import refuse_if_written_elsewhere

WARN_S = 90
"""Seconds before the time limit that SLURM warns the job (SIGUSR1): time to record and stop."""
_TIME = re.compile(r"^(\d+-\d{1,2}(:\d{2}){0,2}|\d+(:\d{2}){0,2})$")
_PASSED = ("HEADSWEEP_DATA", "HEADSWEEP_METHODS", "HEADSWEEP_AUTO_RESUMES")
"""Set where ``headsweep slurm`` runs: written into the script as they are."""


# --------------------------------------------------------------------------- the script


@dataclass(frozen=True)
class Job:
    """What the sbatch script says: where, how big, how long, and the environment it exports."""

    name: str  # the job's name (singleton dependency: one allocation of the sweep at a time)
    grid: str  # absolute path of the grid file
    folder: str  # the job's folder: this script, its logs, the sweep id
    workdir: str  # where `headsweep slurm` ran: relative paths in the grid resolve from here
    python: str  # the interpreter that has headsweep installed (on a file system every node sees)
    nodes: int
    cpus_per_node: int
    gpus_per_node: int
    time: str
    partition: str | None = None
    account: str | None = None
    requeue: bool = False
    env: dict[str, str] = field(default_factory=dict)


def script(job: Job) -> str:
    """The sbatch script of ``job`` (pure: the same job, the same text)."""
    sbatch = [
        (f"--job-name={job.name}", ""),
        ("--dependency=singleton", "one allocation of this sweep at a time (same name, same user)"),
        (f"--nodes={job.nodes}", "a Ray head on the first, a Ray worker on each other"),
        ("--ntasks-per-node=1", ""),
        *([("--no-kill", "a worker node lost: the sweep goes on, Ray reruns its runs on the others")]
          if job.nodes > 1 else []),
        (f"--cpus-per-task={job.cpus_per_node}", "Ray's CPUs on each node"),
        *([(f"--gpus-per-node={job.gpus_per_node}", "Ray's GPUs on each node")] if job.gpus_per_node else []),
        (f"--time={job.time}", ""),
        *([(f"--partition={job.partition}", "")] if job.partition else []),
        *([(f"--account={job.account}", "")] if job.account else []),
        ("--requeue", "preempted or near its time limit: back in the queue") if job.requeue
        else ("--no-requeue", "to resume the sweep, submit this file again"),
        (f"--signal=B:USR1@{WARN_S}", f"{WARN_S} s before the time limit: recorded (and requeued)"),
        (f"--chdir={job.workdir}", "relative paths in the grid, as from `headsweep slurm`"),
        (f"--output={job.folder}/slurm-%j.out", ""),
        ("--open-mode=append", ""),
    ]
    exports = [f"export {name}={shlex.quote(value)}" for name, value in job.env.items()]
    command = [job.python, "-m", "orchestrator.slurm.allocation", "job", job.folder, *(["--requeue"] if job.requeue else [])]
    return "\n".join([
        "#!/bin/bash",
        "# headsweep on a SLURM allocation, written by `headsweep slurm` (docs/clusters.md, \"On a SLURM cluster\").",
        f"# The grid: {job.grid}",
        "# The last line starts a Ray head on this (the first) node and a Ray worker on each other node",
        "# (this job's own ports and token, Ray's temp dir /tmp/hs-$SLURM_JOB_ID), submits the grid (from",
        "# the second allocation on: resumes its sweep), waits for the sweep and stops Ray. Submit this file",
        "# again (sbatch) to resume the sweep: a finished run never runs again.",
        *(f"#SBATCH {option:<28} # {comment}" if comment else f"#SBATCH {option}"
          for option, comment in sbatch),
        "",
        "# The registry, MLflow and the checkpoints, where every node reaches them (a shared file system",
        "# or a shared PostgreSQL, its password in ~/.pgpass or PGPASSWORD, never in the URL):",
        *exports,
        "export PYTHONUNBUFFERED=1  # the log shows the sweep as it goes",
        "# Your site's set-up (module load ...), if any, goes here.",
        "",
        "# exec: Python becomes the batch shell, so SLURM's signals reach it",
        "exec " + " ".join(shlex.quote(part) for part in command),
        "",
    ])


def job_folder(grid_text: str, name: str) -> Path:
    """The folder of a grid's job: one per grid content, so submitting the same grid again
    (``headsweep slurm`` again, or the script) finds its sweep."""
    digest = hashlib.sha256(grid_text.encode()).hexdigest()[:10]
    return settings.home() / "slurm" / f"{name}-{digest}"


def default_cpus(cpus: float, gpus: float, max_concurrent: int | None, nodes: int, gpus_per_node: int) -> int:
    """CPUs per node when ``--cpus-per-node`` is not given: the grid's CPUs per run times the runs that
    fit on the node's GPUs (a GPU grid) or the node's share of ``max_concurrent`` (4 when unset)."""
    runs = int(gpus_per_node // gpus) if gpus else math.ceil((max_concurrent or 4 * nodes) / nodes)
    return max(1, math.ceil(runs * cpus))


def exported_env() -> dict[str, str]:
    """Where the registry, MLflow, artifacts and checkpoints are, as this process resolves them;
    an URL with a password in it is refused (the script is a file, and SLURM keeps a copy)."""
    env = {
        "HEADSWEEP_HOME": str(settings.home()), "HEADSWEEP_DB": settings.registry_url(),
        "HEADSWEEP_TRACKING_URI": settings.tracking_uri(), "HEADSWEEP_ARTIFACT_ROOT": settings.artifact_root(),
        "HEADSWEEP_CHECKPOINTS": settings.checkpoint_root(),
    } | {name: os.environ[name] for name in _PASSED if os.environ.get(name)}
    env = {name: value for name, value in env.items() if value is not None}  # no artifact root: the server's
    for name, value in env.items():
        if urlsplit(value).password:
            raise ConfigError(f"{name} has a password in it: put it in ~/.pgpass or PGPASSWORD instead "
                              "(the sbatch script is a file, and SLURM keeps a copy)")
    return env


def plan_job(grid_path: str, nodes: int, gpus_per_node: int, time_limit: str, cpus_per_node: int | None = None,
             partition: str | None = None, account: str | None = None, requeue: bool = False) -> Job:
    """Validate the grid (every cell, as submit does) and the allocation against its resources; the job."""
    from orchestrator.driving.grid import check_resources, expand, load_grid

    if nodes < 1 or gpus_per_node < 0:
        raise ConfigError(f"--nodes must be >= 1 and --gpus-per-node >= 0 (got {nodes} and {gpus_per_node})")
    if not _TIME.match(time_limit):
        raise ConfigError(f"--time: expected a SLURM time (minutes, HH:MM:SS or D-HH:MM:SS), got '{time_limit}'")
    spec = load_grid(grid_path)
    expand(spec)
    refuse_if_written_elsewhere(settings.registry_url(), "slurm")  # the allocation would write it from its node
    res = spec.resources
    cpus = cpus_per_node or default_cpus(res.cpus, res.gpus, spec.max_concurrent, nodes, gpus_per_node)
    check_resources(res, {"CPU": cpus, "GPU": gpus_per_node})
    grid = Path(grid_path).resolve()
    folder = job_folder(grid.read_text(), spec.name)
    return Job(name=f"hs-{folder.name}", grid=str(grid), folder=str(folder), workdir=os.getcwd(),
               python=sys.executable, nodes=nodes, cpus_per_node=cpus, gpus_per_node=gpus_per_node,
               time=time_limit, partition=partition, account=account, requeue=requeue, env=exported_env())


def submit_job(job: Job) -> str:
    """Write the job's folder (script, the grid's path) and ``sbatch`` it; the SLURM job id."""
    folder = Path(job.folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "headsweep.sbatch"
    path.write_text(script(job))
    path.chmod(0o700)
    (folder / "grid").write_text(job.grid + "\n")
    try:
        done = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise ConfigError("sbatch not found: run `headsweep slurm` where SLURM's commands are (a login node)") from None
    if done.returncode != 0:
        raise ConfigError(f"sbatch {path} failed: {(done.stderr or done.stdout).strip()[-500:]}")
    return done.stdout.strip().split(";", 1)[0]


def known_sweep(folder: Path) -> str | None:
    """The sweep of the job's folder, when it has one this registry knows."""
    from orchestrator.registry import NotFound, Registry

    path = folder / "sweep"
    if not path.exists():
        return None
    sweep_id = path.read_text().strip()
    try:
        Registry(settings.registry_url()).get_sweep(sweep_id)
    except NotFound:
        return None
    return sweep_id
