"""The registry's database: engine, retries, migrations, and the transactions every part shares.

SQLite (a file, WAL, safe with several writing processes) by default, PostgreSQL
by URL. Opening a :class:`Database` (the writable registry) upgrades the schema to the newest Alembic
revision; opening a :class:`ReadOnlyDatabase` (the reader) only checks it (:func:`require_current`) (``orchestrator/migrations``; the revision in ``hs_alembic_version``, the tables
prefixed ``hs_``: MLflow may share the database). Every public registry method is one
transaction (``_read`` or ``_write``), retried on transient errors by
:func:`retrying` (``orchestrator/retry.py``: a lock, a deadlock, a PostgreSQL restart).
Times are naive UTC, written by the caller's clock (heartbeats and the orphan cut-off
compare clocks across nodes: keep them in sync).
"""

from __future__ import annotations

import functools
import gc
import json
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from sqlalchemy import (
    Connection,
    Engine,
    String,
    Text,
    any_,
    bindparam,
    cast,
    column,
    create_engine,
    event,
    func,
    inspect,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.pool import StaticPool

from base.sections import ConfigError
from orchestrator import retry
from orchestrator.filesystems import on_network_filesystem
from orchestrator.registry.schema import VERSION_TABLE, Base

_MIGRATIONS = Path(__file__).resolve().parents[1] / "migrations"
_PG_MIGRATION_LOCK = 0x68656164  # pg_advisory_xact_lock key: one migrator at a time

_T = TypeVar("_T")


class NotFound(LookupError):
    """No sweep or run with that id."""


def now() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


# --------------------------------------------------------------------------- engine and retries


def retrying(method: Callable[..., _T]) -> Callable[..., _T]:
    """Re-run the whole transaction on a transient error (a lost or refused connection, a lock,
    a deadlock) with jittered exponential backoff, within ``orchestrator.retry``'s bounds."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> _T:
        return retry.call(lambda: method(*args, **kwargs), retry.transient_db_error,
                          what=f"registry {method.__name__}")

    return wrapper


def make_engine(url: str, read_only: bool = False) -> Engine:
    """An engine; for SQLite: WAL (a rollback journal on a network filesystem), busy_timeout, foreign
    keys, and BEGIN emitted by us.

    pysqlite starts a transaction only at the first write, so a read-then-write
    transaction can fail with "database is locked" without waiting; we turn
    its own BEGIN off and emit ``BEGIN`` (reads) or ``BEGIN IMMEDIATE``
    (writes, see ``Database._write``) ourselves.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise ValueError(f"registry: SQLite or PostgreSQL URLs only, got '{parsed.get_backend_name()}'")
    if parsed.get_backend_name() == "postgresql":
        if parsed.drivername == "postgresql":  # the default driver would be psycopg2
            parsed = parsed.set(drivername="postgresql+psycopg")
        return create_engine(parsed, pool_pre_ping=True)
    memory = parsed.database in (None, "", ":memory:")
    # WAL's shared memory is one host's: on a network filesystem a rollback journal (one writer
    # host, DESIGN.md decision 16), and a reader opens the file read-only: a reader on another host
    # does not see the writer's locks, takes its journal for a crashed writer's and, read-write,
    # would roll it back into the file mid-transaction (measured: the registry "malformed" after a
    # sweep followed from the login host); read-only it cannot, and retries until the journal is gone
    shared = not memory and on_network_filesystem(parsed.database)
    journal = "DELETE" if shared else "WAL"
    if shared and read_only:
        url = parsed.set(database=f"file:{Path(parsed.database).resolve()}", query={"mode": "ro", "uri": "true"})
    engine = create_engine(
        url,
        connect_args={"timeout": 20, "check_same_thread": False},
        **({"poolclass": StaticPool} if memory else {}),
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA busy_timeout = 20000")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute("PRAGMA synchronous = NORMAL")
        if not memory and not (shared and read_only):  # a read-only connection keeps the writer's
            cursor.execute(f"PRAGMA journal_mode = {journal}")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        mode = connection.get_execution_options().get("sqlite_begin", "DEFERRED")
        connection.exec_driver_sql(f"BEGIN {mode}")

    return engine


# --------------------------------------------------------------------------- migrations


_LEGACY_VERSION_TABLE = "alembic_version"
_LEGACY_REVISIONS = frozenset({"0001", "0002", "0003", "0004", "0005"})
"""Revisions from before the table prefix (0006): a registry at one of them keeps its revision in
``alembic_version``, the table MLflow keeps its own in (never one of these)."""


def alembic_config(connection: Connection | None = None, version_table: str = VERSION_TABLE) -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    config.attributes["version_table"] = version_table
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@functools.cache
def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, "no migrations in orchestrator/migrations/versions"
    return head


def _stored_revision(connection: Connection, version_table: str) -> str | None:
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(connection, opts={"version_table": version_table}).get_current_revision()


def current_revision(connection: Connection) -> str | None:
    """The registry's schema revision (None: no registry here yet), wherever that revision keeps it."""
    revision = _stored_revision(connection, VERSION_TABLE)
    if revision is None and (legacy := _stored_revision(connection, _LEGACY_VERSION_TABLE)) in _LEGACY_REVISIONS:
        return legacy
    return revision


def _version_table(revision: str | None) -> str:
    return _LEGACY_VERSION_TABLE if revision in _LEGACY_REVISIONS else VERSION_TABLE


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the database to ``revision`` (one migrator at a time; a no-op when current)."""
    target = head_revision() if revision == "head" else revision
    with engine.connect() as connection:
        current = current_revision(connection)
        if current == target:
            return
    if current is not None and current not in known_revisions():
        raise SchemaTooNew.of(engine, current)
    _migrate(engine, lambda connection: _upgrade(connection, target))


def _upgrade(connection: Connection, target: str) -> None:
    """Under the migration lock: a new registry gets today's tables at once (Alembic's recipe for
    a fresh database; revision 0001 would create a ``runs`` table that clashes with MLflow's in a
    shared database), an existing one the revisions it lacks, its version row moved first if it
    was kept in ``alembic_version``."""
    from alembic import command

    current = current_revision(connection)  # again: another migrator may have done it meanwhile
    if current == target:
        return
    if current is None and target == head_revision():
        Base.metadata.create_all(connection)
        command.stamp(alembic_config(connection), target)
        return
    table = _version_table(target if current is None else current)
    if table != _version_table(target):
        _move_version(connection, table, _version_table(target))
    command.upgrade(alembic_config(connection, _version_table(target)), target)


def _move_version(connection: Connection, source: str, target: str) -> None:
    """The registry's revision from version table ``source`` (dropped) to ``target``."""
    from alembic import command

    command.stamp(alembic_config(connection, target), _stored_revision(connection, source))
    connection.exec_driver_sql(f'DROP TABLE "{source}"')


class SchemaTooNew(ConfigError):
    """The registry was migrated by newer code than this: older code must not write to it (the CLI
    prints it as one line, like any bad input)."""

    @classmethod
    def of(cls, engine: Engine, current: str) -> SchemaTooNew:
        return cls(f"the registry at {engine.url.render_as_string(hide_password=True)} is at schema revision "
                   f"{current}, newer than this code knows (up to {head_revision()}): a newer checkout of "
                   "headsweep upgraded it; run that checkout's headsweep, or update this one")


class SchemaBehind(ConfigError):
    """The registry's schema is missing or older than this code's: a reader does not migrate it (the
    CLI prints it as one line, like any bad input)."""


def require_current(engine: Engine) -> None:
    """Nothing when the database is at this code's schema revision; else :class:`SchemaBehind`
    (missing or older: a headsweep command that opens the registry for writing, ``headsweep ls``,
    creates or migrates it) or :class:`SchemaTooNew`. Never creates a SQLite file or a table."""
    where = engine.url.render_as_string(hide_password=True)
    database = (engine.url.database or "").removeprefix("file:")  # a read-only reader's URI names its file so
    if engine.url.get_backend_name() == "sqlite" and database not in (None, "", ":memory:") \
            and not Path(database).exists():
        current = None  # connecting would create the file
    else:
        with engine.connect() as connection:
            current = current_revision(connection)
    if current == head_revision():
        return
    if current is None:
        raise SchemaBehind(f"no sweeps yet: submit one with `headsweep submit GRID` (the registry at {where} "
                           "has no headsweep tables; `headsweep ls` creates them)")
    if current not in known_revisions():
        raise SchemaTooNew.of(engine, current)
    raise SchemaBehind(f"the registry at {where} is at schema revision {current}, older than this code's "
                       f"{head_revision()}: run `headsweep ls` once to migrate it (reading never migrates)")


@functools.cache
def known_revisions() -> frozenset[str]:
    from alembic.script import ScriptDirectory

    return frozenset(script.revision for script in ScriptDirectory.from_config(alembic_config()).walk_revisions())


def downgrade(engine: Engine, revision: str) -> None:
    """Take the database back to ``revision`` (by hand, e.g. to run an older checkout: before
    revision 0006 the version row goes back to ``alembic_version``, where older code reads it)."""
    from alembic import command

    def run(connection: Connection) -> None:
        table = _version_table(current_revision(connection))
        command.downgrade(alembic_config(connection, table), revision)
        if table != _version_table(revision):
            _move_version(connection, table, _version_table(revision))

    _migrate(engine, run)


def _migrate(engine: Engine, run: Callable[[Connection], None]) -> None:
    """``run(connection)`` in one transaction, one migrator at a time.

    SQLite: foreign keys are off while migrating (a revision that rebuilds ``runs``
    drops the old table, which other tables reference) and checked before commit.
    The pragma only takes effect outside a transaction, hence on the driver connection.
    """
    with engine.connect() as connection:
        is_sqlite = connection.dialect.name == "sqlite"
        if is_sqlite:
            connection.connection.driver_connection.execute("PRAGMA foreign_keys = OFF")
        try:
            with connection.execution_options(sqlite_begin="IMMEDIATE").begin():
                if not is_sqlite:
                    connection.execute(select(func.pg_advisory_xact_lock(_PG_MIGRATION_LOCK)))
                run(connection)
                if is_sqlite:
                    broken = connection.exec_driver_sql("PRAGMA foreign_key_check").all()
                    if broken:
                        raise RuntimeError(f"registry migration broke foreign keys: {broken[:5]}")
        finally:
            if is_sqlite:
                connection.connection.driver_connection.execute("PRAGMA foreign_keys = ON")


# --------------------------------------------------------------------------- statement helpers


def key_in(connection: Connection, column_: Any, keys: Sequence[str]) -> Any:
    """``column IN keys`` with the keys as ONE bound value (a PostgreSQL array, a JSON
    list for SQLite's json_each): no parameter limits, no 10,000-placeholder statements."""
    if connection.dialect.name == "postgresql":
        return column_ == any_(bindparam(None, list(keys), type_=postgresql.ARRAY(String)))
    each = func.json_each(bindparam(None, json.dumps(list(keys)), type_=String)).table_valued("value")
    return column_.in_(select(each.c.value))


def _isoformat(value: Any) -> str:
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def insert_ignore_batches(connection: Connection, batches: Iterable[tuple[Any, list[dict[str, Any]]]]) -> None:
    """Bulk INSERT ... ON CONFLICT DO NOTHING (a concurrent submit may insert the same keys) of
    each ``(table, rows)`` batch, in order, on a writer thread: the next
    batch is built (and serialised) here while the database executes the previous one.

    Registering 10,000 runs is about as much client work (rows, JSON) as server work (inserts,
    index and foreign-key checks); overlapping them saves most of the smaller. The connection
    is used by one thread at a time: this one only builds statements meanwhile.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="registry-writer") as writer:
        pending = None
        for table, rows in batches:
            if not rows:
                continue
            statement = _insert_ignore(connection, table, rows)
            if pending is not None:
                pending.result()  # raises the writer's error here, before more is built
            pending = writer.submit(connection.execute, *statement)
        if pending is not None:
            pending.result()


def _insert_ignore(connection: Connection, table: Any, rows: list[dict[str, Any]]) -> tuple[Any, ...]:
    """``connection.execute`` arguments of a bulk INSERT ... ON CONFLICT DO NOTHING.

    SQLite: executemany. PostgreSQL: ``INSERT ... SELECT FROM json_to_recordset(:rows)``,
    the rows as ONE JSON document, because psycopg parses many-row VALUES lists and
    escapes text arrays client-side (measured: several times slower for 10,000 rows).
    """
    if connection.dialect.name == "sqlite":
        return sqlite.insert(table).on_conflict_do_nothing(), rows
    table = inspect(table).local_table
    names = list(rows[0])
    payload = cast(bindparam(None, json.dumps(rows, default=_isoformat), type_=Text), postgresql.JSON)
    source = func.json_to_recordset(payload).table_valued(
        *(column(name, table.c[name].type) for name in names)
    ).render_derived(with_types=True)
    return (postgresql.insert(table).from_select(names, select(*source.c)).on_conflict_do_nothing(),)


def json_safe(value: Any) -> Any:
    """numpy scalars -> Python; NaN/inf -> None (PostgreSQL's JSON has no NaN)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, np.ndarray):
        return json_safe(value.tolist())
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


# --------------------------------------------------------------------------- the shared base


class ReadOnlyDatabase:
    """An open registry database by SQLAlchemy URL for reading: the engine and its read transaction.

    Opening it never migrates: it checks that the schema is there and current
    (:func:`require_current`) and raises :class:`SchemaBehind` (one line) otherwise. Safe to use
    from several processes at once (each opens its own); picklable by URL.
    """

    _READ_ONLY = True  # on a network filesystem a reader's SQLite connection is read-only (make_engine)

    def __init__(self, url: str):
        self.url = url
        self._engine = make_engine(url, read_only=self._READ_ONLY)
        self._open_schema()

    def _open_schema(self) -> None:
        """What opening does to the schema: a reader only checks it."""
        retrying(require_current)(self._engine)

    def __reduce__(self) -> tuple[type, tuple[str]]:
        return (type(self), (self.url,))

    def __enter__(self) -> ReadOnlyDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._engine.dispose()

    @contextmanager
    def _read(self) -> Iterator[Connection]:
        with self._engine.begin() as connection:
            yield connection


class Database(ReadOnlyDatabase):
    """An open registry database that is written to: opening it upgrades the schema to the newest
    revision (:func:`upgrade`), and it has the write transaction (``BEGIN IMMEDIATE`` on SQLite).

    Safe to use from several processes at once (each opens its own); picklable by URL,
    so a Ray trial reopens it.
    """

    _READ_ONLY = False

    def __init__(self, url: str):
        super().__init__(url)
        self._writer = self._engine.execution_options(sqlite_begin="IMMEDIATE")

    def _open_schema(self) -> None:
        retrying(upgrade)(self._engine)

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        with self._writer.begin() as connection:
            yield connection


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while building many small objects.

    Measured: expanding 10,000 cells takes about half the time without the
    collector's repeated passes over the growing set of live configs
    (nothing built here forms reference cycles).
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
