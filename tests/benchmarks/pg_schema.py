"""A fresh PostgreSQL schema for a benchmark (shared by bench_registry.py and bench_analysis.py)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import sqlalchemy as sa


@contextlib.contextmanager
def pg_schema(url: str) -> Iterator[str]:
    """A URL whose search_path is a fresh schema; the schema is dropped after."""
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    engine = sa.create_engine(url)
    with engine.begin() as connection:
        connection.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    try:
        yield sa.make_url(url).update_query_dict({"options": f"-csearch_path={schema}"}).render_as_string(
            hide_password=False)
    finally:
        with engine.begin() as connection:
            connection.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        engine.dispose()
