"""Drop the indexes of the runs' label columns (group_key, task, model, method, pipeline, seed,
sparsity, lambda).

No query filters on them: the registry reads runs by key, by sweep membership or by status, and
analysis selects in memory from a sweep's runs. Each index cost every insert: without them,
registering a 10,000-run grid with stages on PostgreSQL is ~0.3 s faster (bench_registry.py).

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-25
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0004"
down_revision: str | Sequence[str] | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LABELS = ("group_key", "task", "model", "method", "pipeline", "seed", "sparsity", "lambda")


def upgrade() -> None:
    for column in LABELS:
        op.drop_index(op.f(f"ix_runs_{column}"), table_name="runs")


def downgrade() -> None:
    for column in LABELS:
        op.create_index(op.f(f"ix_runs_{column}"), "runs", [column])
