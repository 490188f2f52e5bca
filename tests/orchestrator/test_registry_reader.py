"""The registry's read side (``orchestrator.registry.reader``): what analysis opens. It never
migrates and has no write methods; the writable Registry builds on it (one implementation of each read)."""

import inspect
import sqlite3

import pytest

from orchestrator.registry import Registry
from orchestrator.registry.db import SchemaBehind, head_revision, make_engine, upgrade
from orchestrator.registry.reader import RegistryReader

READS = {"close", "events", "eta_seconds", "failures", "get_sweep", "list_sweeps", "resolve_sweep", "sweep_counts",
         "sweep_dag", "sweep_map", "sweep_map_names", "sweep_runs", "sweep_version"}
"""What analysis, and ``status``/``ls``/``wait`` on a host that only reads (a login node over a network
filesystem: ``writer.for_looking``), may call."""


def _tables(path) -> set[str]:
    with sqlite3.connect(path) as connection:
        return {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def test_opening_the_reader_on_a_missing_registry_creates_nothing(tmp_path):
    path = tmp_path / "registry.db"
    with pytest.raises(SchemaBehind, match="no sweeps yet: submit one with `headsweep submit GRID`.*headsweep ls"):
        RegistryReader(f"sqlite:///{path}")
    assert not path.exists()


def test_opening_the_reader_on_an_unmigrated_database_neither_creates_nor_migrates_tables(tmp_path):
    path = tmp_path / "registry.db"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE other (a INTEGER)")  # e.g. MLflow's tables in a shared database
    with pytest.raises(SchemaBehind, match="has no headsweep tables"):
        RegistryReader(f"sqlite:///{path}")
    assert _tables(path) == {"other"}


def test_the_reader_refuses_a_registry_behind_this_code_and_leaves_its_revision(tmp_path):
    url = f"sqlite:///{tmp_path / 'registry.db'}"
    upgrade(make_engine(url), "0005")  # an older checkout's registry: its revision in alembic_version
    tables = _tables(tmp_path / "registry.db")
    with pytest.raises(SchemaBehind, match=r"schema revision 0005, older than this code's .*headsweep ls"):
        RegistryReader(url)
    assert _tables(tmp_path / "registry.db") == tables
    with sqlite3.connect(tmp_path / "registry.db") as connection:
        assert connection.execute("SELECT version_num FROM alembic_version").fetchall() == [("0005",)]
    Registry(url).close()  # the writable registry migrates it; then the reader opens
    assert RegistryReader(url).list_sweeps() == []
    with sqlite3.connect(tmp_path / "registry.db") as connection:
        assert connection.execute("SELECT version_num FROM hs_alembic_version").fetchall() == [(head_revision(),)]


def test_the_reader_has_the_reads_only_and_the_registry_shares_them():
    public = {name for name, _ in inspect.getmembers(RegistryReader, callable) if not name.startswith("_")}
    assert public == READS
    assert not hasattr(RegistryReader, "_write") and not hasattr(RegistryReader, "_writer")
    writes = {name for name, _ in inspect.getmembers(Registry, callable) if not name.startswith("_")} - READS
    assert {"lose_driver", "finish", "set_sweep", "create_sweep", "add_event"} <= writes
    assert issubclass(Registry, RegistryReader)
    for name in READS:  # one implementation of each read
        assert getattr(Registry, name) is getattr(RegistryReader, name)
