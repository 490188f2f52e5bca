"""``headsweep slurm GRID``: a sweep on a SLURM allocation (``orchestrator.slurm.sbatch`` writes
the sbatch script and submits it; ``orchestrator.slurm.allocation`` runs inside it)."""

from __future__ import annotations

import argparse
from pathlib import Path

from orchestrator.slurm.sbatch import known_sweep, plan_job, script, submit_job


def cmd_slurm(args: argparse.Namespace) -> int:
    job = plan_job(args.grid, args.nodes, args.gpus_per_node, args.time, args.cpus_per_node,
                   args.partition, args.account, args.requeue)
    if args.dry_run:
        print(script(job), end="")
        return 0
    sweep_id = known_sweep(Path(job.folder))
    job_id = submit_job(job)
    print(f"SLURM job {job_id}: " + (f"resumes sweep {sweep_id}" if sweep_id else f"the sweep of {args.grid}")
          + f"; log {job.folder}/slurm-{job_id}.out")
    print(f"follow it with: headsweep status $(cat {job.folder}/sweep)   (the file exists once the job runs)")
    return 0


def register(sub) -> None:
    """``headsweep slurm``: its subcommand (``headsweep.cli.build_parser`` registers it)."""
    p = sub.add_parser("slurm", help="run a sweep on a SLURM allocation: write an sbatch script and submit it")
    p.add_argument("grid", help="grid YAML (see examples/grid_*.yaml)")
    p.add_argument("--nodes", type=int, default=1, help="nodes (default 1): a Ray head on the first, workers on the rest")
    p.add_argument("--gpus-per-node", type=int, default=0, help="GPUs per node (default 0)")
    p.add_argument("--cpus-per-node", type=int,
                   help="CPUs per node (default: the grid's CPUs per run times the runs that fit on a node)")
    p.add_argument("--time", required=True, help="time limit of one allocation, as sbatch takes it (e.g. 04:00:00)")
    p.add_argument("--partition", help="SLURM partition")
    p.add_argument("--account", help="SLURM account")
    p.add_argument("--requeue", action="store_true",
                   help="preempted or at its time limit, the job goes back to the queue and the sweep resumes "
                        "(default: submit the script again to resume it)")
    p.add_argument("--dry-run", action="store_true", help="print the sbatch script; write and submit nothing")
    p.set_defaults(func=cmd_slurm)
