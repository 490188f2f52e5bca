"""The benchmarks' PostgreSQL (bench_registry.py, bench_analysis.py, scale_sweep.py): a server of
their own, the tests' private one (tests/pg_server.py: initdb + pg_ctl in a temp folder, a free
loopback port), unless ``--pg URL`` names one; never the machine's own server unless it is named.
A benchmark works in a fresh schema (:func:`pg_schema`) or a fresh database of that server."""

from __future__ import annotations

import contextlib
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: pg_server, as tests/conftest.py imports it
import pg_server  # noqa: E402


@contextlib.contextmanager
def pg_server_url(url: str | None) -> Iterator[str]:
    """``url`` when given (a server whose admin database the benchmark may create schemas and
    databases in), else the admin URL of a private server started here, stopped and removed after."""
    if url:
        yield url
        return
    with pg_server.PrivatePostgres() as server:
        yield server.url


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
