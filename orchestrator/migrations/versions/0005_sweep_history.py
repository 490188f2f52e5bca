"""A sweep's history and its automatic resumes: ``sweep_events`` and ``sweeps.auto_resumes``.

The supervisor (``orchestrator/driving/supervisor.py``) resumes a sweep whose driver died, at most
``auto_resumes`` times, and records each lost driver, each resume (automatic or by hand) and
giving up as an event, which ``headsweep status`` shows. Sweeps registered before this
revision get ``auto_resumes = 0``: the supervisor never resumes a sweep nobody asked it to.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-27
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | Sequence[str] | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("sweeps", sa.Column("auto_resumes", sa.Integer(), server_default="0", nullable=False))
    op.create_table(
        "sweep_events",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("sweep_id", sa.String(length=64), nullable=False),
        sa.Column("at", sa.DateTime(), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["sweep_id"], ["sweeps.id"], name=op.f("fk_sweep_events_sweep_id_sweeps"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sweep_events")),
    )
    op.create_index(op.f("ix_sweep_events_sweep_id"), "sweep_events", ["sweep_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_sweep_events_sweep_id"), table_name="sweep_events")
    op.drop_table("sweep_events")
    with op.batch_alter_table("sweeps") as batch:  # SQLite drops a column by rebuilding the table
        batch.drop_column("auto_resumes")
