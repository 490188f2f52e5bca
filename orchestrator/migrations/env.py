"""Alembic environment of the registry.

``Registry`` runs ``upgrade head`` in code with its own connection
(``config.attributes["connection"]``); no alembic.ini is needed. To make a
new revision by hand::

    from alembic import command
    from orchestrator.registry import alembic_config

    config = alembic_config()
    config.set_main_option("sqlalchemy.url", "sqlite:////tmp/registry-at-head.db")
    command.upgrade(config, "head")
    command.revision(config, "what changed", autogenerate=True, rev_id="0007")

then tidy the generated file (orchestrator/migrations/versions/).
"""

from alembic import context
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from orchestrator.registry.schema import PREFIX, VERSION_TABLE, Base

config = context.config
target_metadata = Base.metadata


def _ours(name: str | None, type_: str, _parent: object) -> bool:
    """Autogenerate looks at the registry's tables only (MLflow's may share the database)."""
    return type_ != "table" or (name or "").startswith(PREFIX)


def _configure(**kwargs) -> None:
    # the version table: hs_alembic_version, or alembic_version for a registry before revision 0006
    # (orchestrator/registry/db.py moves the row)
    context.configure(target_metadata=target_metadata, compare_type=True, render_as_batch=True,
                      version_table=config.attributes.get("version_table", VERSION_TABLE),
                      include_name=_ours, **kwargs)


def run_offline() -> None:
    _configure(url=config.get_main_option("sqlalchemy.url"), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url"), poolclass=NullPool)
    with engine.begin() as connection:
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
