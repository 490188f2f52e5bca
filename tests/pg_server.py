"""A PostgreSQL server of a test's own: initdb + pg_ctl in a temp folder, a free loopback port, trust auth.

The default run's postgres tests use one per session (tests/conftest.py's ``pg_url``) unless
``HEADSWEEP_TEST_PG_URL`` names a server to use instead; the restart test
(tests/orchestrator/test_db_faults.py) starts and stops one of its own; the multi-host tests run the
same binaries on a host of their own (tests/hosts.py's ``start_postgres``). The machine's own
PostgreSQL, if any, is never touched.

As root, the server runs as the ``postgres`` user (it refuses to run as root): its folder is made
outside pytest's root-only temp tree and given to that user.
"""

from __future__ import annotations

import glob
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import uuid

OWNER = "postgres"
# a test server: nothing it holds must survive a crash, so no waiting on the disk
FAST = "-c fsync=off -c synchronous_commit=off -c full_page_writes=off"
PORT_TRIES = 3  # starts of a new server, each on another free port, while its port was taken meanwhile


def bin_dir() -> str:
    """The server binaries' folder: Debian's newest /usr/lib/postgresql/N/bin, else pg_ctl's on PATH."""
    debian = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"),
                    key=lambda path: [int(n) for n in re.findall(r"\d+", path)])
    found = debian[-1] if debian else shutil.which("pg_ctl")
    if not found:
        raise RuntimeError("no PostgreSQL server binaries (initdb, pg_ctl): install Debian's postgresql (.ci/run does), "
                           "or set HEADSWEEP_TEST_PG_URL to a server the tests may create databases on")
    return os.path.dirname(os.path.realpath(found))


def command(tool: str, *args: str) -> list[str]:
    """``tool`` (initdb, pg_ctl) of the server binaries with ``args``, as the ``postgres`` user when root."""
    argv = [os.path.join(bin_dir(), tool), *args]
    return ["runuser", "-u", OWNER, "--", *argv] if os.geteuid() == 0 else argv


def initdb(data: str) -> list[str]:
    """initdb of a new data folder ``data``: superuser ``postgres``, trust auth, UTF-8."""
    return command("initdb", "-D", data, "-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8")


def database_url(server_url: str, name: str | None = None) -> str:
    """The SQLAlchemy URL (psycopg) of database ``name`` (default: ``server_url``'s own) on the server of
    ``server_url`` (libpq or SQLAlchemy form)."""
    import sqlalchemy as sa

    url = sa.make_url(server_url)
    return url.set(drivername="postgresql+psycopg", database=name or url.database).render_as_string(hide_password=False)


def libpq_url(url: str) -> str:
    """``url`` as psycopg.connect takes it (no ``+psycopg``)."""
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


def create_database(server_url: str) -> str:
    """A new, empty database on the server of ``server_url`` (its admin database); its SQLAlchemy URL."""
    import psycopg

    name = f"hs_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(libpq_url(server_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return database_url(server_url, name)


def drop_database(server_url: str, url: str) -> None:
    """Drop the database of ``url`` (made by :func:`create_database`), its sessions ended."""
    import psycopg
    import sqlalchemy as sa

    with psycopg.connect(libpq_url(server_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{sa.make_url(url).database}" WITH (FORCE)')


class PrivatePostgres:
    """``with PrivatePostgres() as server``: a new server started (``server.url``: its admin database),
    stopped and its folder removed after, pass or fail. ``stop``/``start`` restart it in between."""

    def __init__(self) -> None:
        self.folder = tempfile.mkdtemp(prefix="headsweep-pg-")
        self.data = os.path.join(self.folder, "data")
        self._take_port()
        try:
            if os.geteuid() == 0:
                shutil.chown(self.folder, OWNER, pwd.getpwnam(OWNER).pw_gid)
            self._run(initdb(self.data))
        except BaseException:
            shutil.rmtree(self.folder, ignore_errors=True)
            raise

    def _take_port(self) -> None:
        """A loopback port free a moment ago: the server binds its own (it cannot be handed a socket),
        so one taken meanwhile fails its first start, and :meth:`__enter__` takes another."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    @staticmethod
    def _run(argv: list[str]) -> None:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        tool = next(os.path.basename(arg) for arg in argv if arg.startswith(bin_dir()))
        if done.returncode:
            raise RuntimeError(f"{tool}: {done.stdout[-2000:]}{done.stderr[-2000:]}")

    def start(self) -> None:
        log = os.path.join(self.folder, "server.log")
        try:
            self._run(command("pg_ctl", "-D", self.data, "-l", log, "-w", "-t", "60",
                              "-o", f"-h 127.0.0.1 -p {self.port} -k {self.folder} {FAST}", "start"))
        except RuntimeError as err:
            said = open(log, errors="replace").read()[-2000:] if os.path.exists(log) else ""
            raise RuntimeError(f"{err}\n{said}") from None

    def stop(self, mode: str = "fast") -> None:
        """``fast``: every session is terminated at once (what a restart does to the clients)."""
        self._run(command("pg_ctl", "-D", self.data, "-m", mode, "-w", "-t", "60", "stop"))

    def create_database(self) -> str:
        """A new database; its SQLAlchemy URL."""
        return create_database(self.url)

    def remove(self) -> None:
        """Stop the server (at once) if it runs, and remove its folder."""
        try:
            if os.path.exists(os.path.join(self.data, "postmaster.pid")):
                self.stop("immediate")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> PrivatePostgres:
        try:
            for attempt in range(1, PORT_TRIES + 1):
                try:
                    self.start()
                    break
                except RuntimeError as err:  # its log says why: a port taken meanwhile is tried again
                    if "Address already in use" not in str(err) or attempt == PORT_TRIES:
                        raise
                    self._take_port()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.remove()
