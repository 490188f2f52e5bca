"""Initial schema: sweeps, runs, sweep_runs.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUN_INDEXES = ("group_key", "task", "model", "method", "pipeline", "seed", "sparsity", "lambda", "status")


def upgrade() -> None:
    op.create_table(
        "sweeps",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("grid", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("resources", sa.JSON(), nullable=False),
        sa.Column("max_concurrent", sa.Integer(), nullable=True),
        sa.Column("max_failures", sa.Integer(), nullable=False),
        sa.Column("mlflow_experiment_id", sa.String(length=64), nullable=True),
        sa.Column("mlflow_parent_run_id", sa.String(length=64), nullable=True),
        sa.Column("driver", sa.String(length=200), nullable=True),
        sa.Column("cancel_requested", sa.Boolean(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sweeps")),
    )
    op.create_index(op.f("ix_sweeps_name"), "sweeps", ["name"])

    op.create_table(
        "runs",
        sa.Column("run_key", sa.String(length=64), nullable=False),
        sa.Column("group_key", sa.String(length=64), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("task", sa.String(length=200), nullable=False),
        sa.Column("model", sa.String(length=200), nullable=False),
        sa.Column("method", sa.String(length=64), nullable=False),
        sa.Column("pipeline", sa.String(length=64), nullable=True),
        sa.Column("seed", sa.Integer(), nullable=False),
        sa.Column("sparsity", sa.Double(), nullable=True),
        sa.Column("lambda", sa.Double(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(), nullable=True),
        sa.Column("worker", sa.String(length=200), nullable=True),
        sa.Column("mlflow_run_id", sa.String(length=64), nullable=True),
        sa.Column("metrics", sa.JSON(), nullable=True),
        sa.Column("gates", sa.LargeBinary(), nullable=True),
        sa.Column("gates_shape", sa.JSON(), nullable=True),
        sa.Column("scores", sa.LargeBinary(), nullable=True),
        sa.PrimaryKeyConstraint("run_key", name=op.f("pk_runs")),
    )
    for column in RUN_INDEXES:
        op.create_index(op.f(f"ix_runs_{column}"), "runs", [column])

    op.create_table(
        "sweep_runs",
        sa.Column("sweep_id", sa.String(length=64), nullable=False),
        sa.Column("run_key", sa.String(length=64), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["run_key"], ["runs.run_key"], name=op.f("fk_sweep_runs_run_key_runs")),
        sa.ForeignKeyConstraint(
            ["sweep_id"], ["sweeps.id"], name=op.f("fk_sweep_runs_sweep_id_sweeps"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("sweep_id", "run_key", name=op.f("pk_sweep_runs")),
    )
    op.create_index(op.f("ix_sweep_runs_run_key"), "sweep_runs", ["run_key"])


def downgrade() -> None:
    op.drop_table("sweep_runs")
    op.drop_table("runs")
    op.drop_table("sweeps")
