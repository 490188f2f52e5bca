"""Every label of a run in one place: ``hs_runs.labels`` (JSON), in place of seven label columns.

Before, four shared labels and three of the methods' (pipeline, sparsity, lambda) were columns, while
every other label a method declares (``SHORT_NAMES``: verbalizer, prompt_length, source_task, ...) was
read from the stored config: two ways to read a label. Now the registry stores ``RunConfig.labels()``
whole, unset labels left out, and analysis reads every label from it. The columns carried no index and
no query filtered on them (migration 0004). A run registered before keeps the labels its columns held;
its other labels stay readable as config keys.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-29
"""

from collections.abc import Iterator, Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUNS = "hs_runs"  # written out, not imported: a migration keeps meaning what it meant
COLUMNS = (  # (column, type, nullable) in table order
    ("task", sa.String(length=200), False),
    ("model", sa.String(length=200), False),
    ("method", sa.String(length=64), False),
    ("pipeline", sa.String(length=64), True),
    ("seed", sa.Integer(), False),
    ("sparsity", sa.Double(), True),
    ("lambda", sa.Double(), True),
)
_CHUNK = 2_000


def _runs(*names: str) -> sa.TableClause:
    types = {name: kind for name, kind, _ in COLUMNS} | {"run_key": sa.String(64), "labels": sa.JSON()}
    return sa.table(RUNS, *(sa.column(name, types[name]) for name in names))


def _chunks(rows: Iterator[dict]) -> Iterator[list[dict]]:
    chunk: list[dict] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == _CHUNK:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def upgrade() -> None:
    with op.batch_alter_table(RUNS) as batch:
        batch.add_column(sa.Column("labels", sa.JSON(), nullable=True))
    bind = op.get_bind()
    names = [name for name, _, _ in COLUMNS]
    old = _runs("run_key", *names)
    new = _runs("run_key", "labels")
    rows = bind.execute(sa.select(old)).all()
    labels = ({"key": row[0], "v_labels": {n: v for n, v in zip(names, row[1:], strict=True) if v is not None}}
              for row in rows)
    for chunk in _chunks(labels):
        bind.execute(new.update().where(new.c.run_key == sa.bindparam("key")).values(labels=sa.bindparam("v_labels")),
                     chunk)
    with op.batch_alter_table(RUNS) as batch:
        batch.alter_column("labels", existing_type=sa.JSON(), nullable=False)
        for name in names:
            batch.drop_column(name)


def downgrade() -> None:
    """Back to the label columns (a run's other labels stay in its config); fails for a run without
    one of the shared labels."""
    with op.batch_alter_table(RUNS) as batch:
        for name, kind, _ in COLUMNS:
            batch.add_column(sa.Column(name, kind, nullable=True))
    bind = op.get_bind()
    names = [name for name, _, _ in COLUMNS]
    source = _runs("run_key", "labels")
    target = _runs("run_key", *names)
    rows = ({"key": key, **{f"v_{n}": (labels or {}).get(n) for n in names}}
            for key, labels in bind.execute(sa.select(source)).all())
    for chunk in _chunks(rows):
        bind.execute(target.update().where(target.c.run_key == sa.bindparam("key"))
                     .values({n: sa.bindparam(f"v_{n}") for n in names}), chunk)
    with op.batch_alter_table(RUNS) as batch:
        for name, kind, nullable in COLUMNS:
            if not nullable:
                batch.alter_column(name, existing_type=kind, nullable=False)
        batch.drop_column("labels")
