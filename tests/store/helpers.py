"""Rows the store tests need: a model with its default config, and deployments of a size; and
a database brought to a given schema revision, as an older cohabit left it."""

from __future__ import annotations

import uuid

from alembic import command
from alembic.config import Config

from cohabit.store import catalog, deployments
from cohabit.store.catalog import NewFile
from cohabit.store.database import MIGRATIONS, Database
from cohabit.store.records import DeploymentRecord, NewDeployment, Scaling


def add_model(db: Database, name: str | None = None) -> tuple[str, str]:
    """A registered model and its default config: (model id, config id). Names are unique:
    without one it is `tiny-` and 8 random hex digits."""
    name = name or f"tiny-{uuid.uuid4().hex[:8]}"
    model = catalog.add_model(
        db,
        name=name,
        repo_id=None,
        hub=None,
        source=f"/models/{name}.gguf",
        model_path=f"/models/{name}.gguf",
        format="gguf",
        description=None,
        files=[
            NewFile(name=f"{name}.gguf", size_bytes=1, storage_type="file", storage_location=None)
        ],
        default_config={"engine": "llamacpp"},
    )
    config = catalog.list_configs(db, model_id=model.id)[0]
    return model.id, config.id


def new_deployment(
    model: tuple[str, str],
    requested_bytes: int,
    *,
    tensor_parallel: int = 1,
    scaling: Scaling | None = None,
    engine: str = "llamacpp",
) -> NewDeployment:
    return NewDeployment(
        id=str(uuid.uuid4()),
        model_id=model[0],
        config_id=model[1],
        file_id=None,
        model_name="tiny",
        engine=engine,
        request={},
        model_path="/models/tiny.gguf" if engine == "llamacpp" else "/models/tiny",
        requested_bytes=requested_bytes,
        tensor_parallel=tensor_parallel,
        max_model_len=None,
        estimate=None,
        scaling=scaling or Scaling(),
    )


def add_deployment(
    db: Database,
    model: tuple[str, str],
    requested_bytes: int,
    *,
    tensor_parallel: int = 1,
    scaling: Scaling | None = None,
) -> DeploymentRecord:
    return deployments.create(
        db, new_deployment(model, requested_bytes, tensor_parallel=tensor_parallel, scaling=scaling)
    )


def upgrade_to(db: Database, revision: str) -> None:
    """Migrate `db` to `revision` (an Alembic revision id), not to the newest."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    with db.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
