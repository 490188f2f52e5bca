"""Unit maps: a run_maps table (one row per run and map name); gates/scores move into it.

Results became metrics plus named unit maps (DESIGN.md decision 9). The ``runs``
columns ``gates`` / ``scores`` (raw float32 bytes, shape in ``gates_shape``) become
the maps ``heads.gate`` / ``heads.log_alpha`` (zlib-compressed float32), then are
dropped; ``finetune`` runs get no ``heads.gate`` (their all-ones gates were not learned).
Stored configs move to the shape of methods owning their sections. ``lambda`` becomes nullable like ``sparsity`` and ``pipeline`` (methods
without such a setting). SQLite rebuilds ``runs`` (batch mode); ``Registry`` turns
its foreign keys off around the migration for that.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23
"""

import zlib
from collections.abc import Iterator, Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_BATCH = 1000
_LEGACY = (("gates", "heads.gate"), ("scores", "heads.log_alpha"))

# The tables as this revision knows them (never the models of today's code).
_runs = sa.table(
    "runs", sa.column("run_key", sa.String), sa.column("gates", sa.LargeBinary),
    sa.column("gates_shape", sa.JSON), sa.column("scores", sa.LargeBinary),
    sa.column("method", sa.String), sa.column("config", sa.JSON),
)
_run_maps = sa.table(
    "run_maps", sa.column("run_key", sa.String), sa.column("name", sa.String), sa.column("kind", sa.String),
    sa.column("rows", sa.Integer), sa.column("cols", sa.Integer), sa.column("data", sa.LargeBinary),
)


def _chunks(rows: Iterator, size: int = _BATCH) -> Iterator[list]:
    chunk = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _legacy_maps(bind: sa.Connection) -> Iterator[dict]:
    """run_maps rows of every run that has gates or scores (both (L, H) float32, C order)."""
    query = sa.select(_runs.c.run_key, _runs.c.gates, _runs.c.gates_shape, _runs.c.scores, _runs.c.method).where(
        sa.or_(_runs.c.gates.is_not(None), _runs.c.scores.is_not(None)))
    for run_key, gates, shape, scores, method in bind.execute(query):
        rows, cols = shape if shape else (1, len(gates or scores) // 4)
        if method == "finetune":  # its all-ones "gates" were invented, not learned: no map
            gates = None
        for blob, name in ((gates, "heads.gate"), (scores, "heads.log_alpha")):
            if blob is not None:
                yield {"run_key": run_key, "name": name, "kind": "heads", "rows": rows, "cols": cols,
                       "data": zlib.compress(bytes(blob), 1)}


def _config_today(raw: dict) -> dict:
    """A stored 0001 config (a ``gates`` section, top-level ``pipeline``/``sparsity``) in the
    shape of methods that own their sections (``head_gates: {lambda, lr, pipeline, ...}``);
    methods without those keys (finetune) drop them. Written out here, not imported: a
    migration must keep meaning what it meant when it was written."""
    out = {k: v for k, v in raw.items() if k not in ("gates", "pipeline", "sparsity")}
    if out.get("method", "head_gates") == "head_gates":
        moved = dict(raw.get("gates") or {})
        moved |= {k: raw[k] for k in ("pipeline", "sparsity") if raw.get(k) is not None}
        out["head_gates"] = moved | dict(raw.get("head_gates") or {})
    return out


def _upgrade_configs(bind: sa.Connection) -> None:
    """Stored configs in today's shape, so a pending run of an old sweep still resumes (its run
    key stays the one it was registered under)."""
    rows = bind.execute(sa.select(_runs.c.run_key, _runs.c.config)).all()
    updates = [{"key": key, "config": _config_today(config)} for key, config in rows
               if isinstance(config, dict) and ("gates" in config or "pipeline" in config)]
    for chunk in _chunks(iter(updates)):
        bind.execute(_runs.update().where(_runs.c.run_key == sa.bindparam("key")).values(
            {"config": sa.bindparam("config")}), chunk)


def upgrade() -> None:
    op.create_table(
        "run_maps",
        sa.Column("run_key", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=100), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("rows", sa.Integer(), nullable=False),
        sa.Column("cols", sa.Integer(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_key"], ["runs.run_key"], name=op.f("fk_run_maps_run_key_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_key", "name", name=op.f("pk_run_maps")),
    )
    bind = op.get_bind()
    for chunk in _chunks(_legacy_maps(bind)):
        bind.execute(_run_maps.insert(), chunk)
    _upgrade_configs(bind)
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("gates")
        batch.drop_column("gates_shape")
        batch.drop_column("scores")
        batch.alter_column("lambda", existing_type=sa.Double(), nullable=True)


def downgrade() -> None:
    """Back to gates/scores columns (other maps are lost); fails if a run has no lambda."""
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("gates", sa.LargeBinary(), nullable=True))
        batch.add_column(sa.Column("gates_shape", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("scores", sa.LargeBinary(), nullable=True))
        batch.alter_column("lambda", existing_type=sa.Double(), nullable=False)
    bind = op.get_bind()
    for column, name in _LEGACY:
        query = sa.select(_run_maps.c.run_key, _run_maps.c.rows, _run_maps.c.cols, _run_maps.c.data).where(
            _run_maps.c.name == name)
        for chunk in _chunks(iter(bind.execute(query).all())):
            bind.execute(
                _runs.update().where(_runs.c.run_key == sa.bindparam("key")).values(
                    {column: sa.bindparam("blob"), "gates_shape": sa.bindparam("shape")}),
                [{"key": key, "blob": zlib.decompress(data),
                  "shape": [rows, cols]} for key, rows, cols, data in chunk],
            )
    op.drop_table("run_maps")
