"""Stages: a run_deps table (run -> the upstream run it starts from, by role).

DESIGN.md decision 10: a run may name upstream runs (``init_from``, ``teacher``,
``bias_model``); grid expansion records each edge here so the driver runs an
upstream before its dependants and blocks the dependants of a failed one.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "run_deps",
        sa.Column("run_key", sa.String(length=64), nullable=False),
        sa.Column("role", sa.String(length=32), nullable=False),
        sa.Column("upstream_key", sa.String(length=64), nullable=False),
        sa.ForeignKeyConstraint(["run_key"], ["runs.run_key"], name=op.f("fk_run_deps_run_key_runs"),
                                ondelete="CASCADE"),
        sa.ForeignKeyConstraint(["upstream_key"], ["runs.run_key"], name=op.f("fk_run_deps_upstream_key_runs")),
        sa.PrimaryKeyConstraint("run_key", "role", name=op.f("pk_run_deps")),
    )
    op.create_index(op.f("ix_run_deps_upstream_key"), "run_deps", ["upstream_key"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_run_deps_upstream_key"), table_name="run_deps")
    op.drop_table("run_deps")
