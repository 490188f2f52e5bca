"""The registry's tables in their own namespace: ``runs`` -> ``hs_runs`` and so on, with their
primary keys, foreign keys and indexes renamed to match.

MLflow also creates a table ``runs`` (and ``alembic_version``): with the prefix the registry and
MLflow can share one database. Names follow the models' naming convention (``pk_hs_runs``,
``fk_hs_run_deps_upstream_key_hs_runs``, ``ix_hs_runs_status``) so later revisions can name them
on every registry alike. PostgreSQL renames in place (``ALTER ... RENAME``: no rows copied);
SQLite renames the tables, then rebuilds each one (batch mode) to rename its constraints, which
live in the table's CREATE statement. Alembic's own version row moves from ``alembic_version`` to
``hs_alembic_version`` outside the revisions (``orchestrator/registry/db.py``): Alembic reads
the version table before any revision runs.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PREFIX = "hs_"  # written out, not imported: a migration keeps meaning what it meant

# table: (primary key columns, foreign keys (column, referred table, referred column, on delete), indexed columns)
TABLES = {
    "sweeps": (["id"], [], ["name"]),
    "runs": (["run_key"], [], ["status"]),
    "sweep_runs": (["sweep_id", "run_key"],
                   [("run_key", "runs", "run_key", None), ("sweep_id", "sweeps", "id", "CASCADE")], ["run_key"]),
    "run_maps": (["run_key", "name"], [("run_key", "runs", "run_key", "CASCADE")], []),
    "run_deps": (["run_key", "role"],
                 [("run_key", "runs", "run_key", "CASCADE"), ("upstream_key", "runs", "run_key", None)],
                 ["upstream_key"]),
    "sweep_events": (["id"], [("sweep_id", "sweeps", "id", "CASCADE")], ["sweep_id"]),
}


def _move(old: str, new: str) -> None:
    """Tables ``{old}name`` -> ``{new}name``, and their constraints' and indexes' names with them."""
    for table in TABLES:
        op.rename_table(old + table, new + table)
    if op.get_bind().dialect.name == "postgresql":
        _rename_in_place(old, new)
    else:
        _rebuild(old, new)


def _rename_in_place(old: str, new: str) -> None:
    for table, (_, foreign_keys, indexed) in TABLES.items():
        renames = [(f"pk_{old}{table}", f"pk_{new}{table}")]
        renames += [(f"fk_{old}{table}_{column}_{old}{referred}", f"fk_{new}{table}_{column}_{new}{referred}")
                    for column, referred, _, _ in foreign_keys]
        for before, after in renames:
            op.execute(f'ALTER TABLE "{new}{table}" RENAME CONSTRAINT "{before}" TO "{after}"')
        for column in indexed:
            op.execute(f'ALTER INDEX "ix_{old}{table}_{column}" RENAME TO "ix_{new}{table}_{column}"')
    op.execute(f'ALTER SEQUENCE "{old}sweep_events_id_seq" RENAME TO "{new}sweep_events_id_seq"')


def _rebuild(old: str, new: str) -> None:
    """SQLite: one rebuild per table with its constraints dropped and made again under their new
    names (``Registry`` turns foreign keys off around migrations and checks them after)."""
    for table, (primary_key, foreign_keys, indexed) in TABLES.items():
        with op.batch_alter_table(new + table, recreate="always") as batch:
            for column, referred, _, _ in foreign_keys:
                batch.drop_constraint(f"fk_{old}{table}_{column}_{old}{referred}", type_="foreignkey")
            batch.drop_constraint(f"pk_{old}{table}", type_="primary")
            batch.create_primary_key(f"pk_{new}{table}", primary_key)
            for column, referred, referred_column, ondelete in foreign_keys:
                batch.create_foreign_key(f"fk_{new}{table}_{column}_{new}{referred}", new + referred,
                                         [column], [referred_column], ondelete=ondelete)
        for column in indexed:
            op.drop_index(f"ix_{old}{table}_{column}", table_name=new + table)
            op.create_index(f"ix_{new}{table}_{column}", new + table, [column])


def upgrade() -> None:
    _move("", PREFIX)


def downgrade() -> None:
    _move(PREFIX, "")
