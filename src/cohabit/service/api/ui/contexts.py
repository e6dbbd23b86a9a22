"""The deploy form's context length: a config is what sizes a deployment, so a context length
the user types becomes the model's config with that `max_model_len` — found among its
configs, or copied from the chosen one. Called by `pages.context_config`."""

from __future__ import annotations

from cohabit.service.errors import InvalidInput, found
from cohabit.store import catalog
from cohabit.store.database import Database
from cohabit.store.records import ModelConfigRecord, NewConfig


def config_for_context(
    db: Database, *, model_id: str, config_id: str | None, max_model_len: int
) -> ModelConfigRecord:
    """The config of `model_id` equal to `config_id`'s (default: the model's default) but for
    `max_model_len`; made (not default) when none exists. Raises NotFound / InvalidInput."""
    configs = catalog.list_configs(db, model_id=model_id)
    if config_id is None:
        base = next((c for c in configs if c.default), configs[0] if configs else None)
        if base is None:
            raise InvalidInput(f"model {model_id} has no configs; create one first")
    else:
        base = found(lambda: catalog.get_config(db, config_id))
        if base.model_id != model_id:
            raise InvalidInput(f"model config {base.id} belongs to another model")
    if base.config.get("max_model_len") == max_model_len:
        return base
    wanted = dict(base.config) | {"max_model_len": max_model_len}
    for config in configs:
        if dict(config.config) == wanted and config.file_id == base.file_id:
            return config
    # A variant of a variant is named after the original config, not a chain of lengths.
    stem = (base.name or "default").split(" · ")[0]
    return catalog.add_config(
        db,
        NewConfig(
            model_id=model_id,
            file_id=base.file_id,
            name=catalog.suffixed_name(stem, f" · {max_model_len} tokens"),
            default=False,
            description=f"{stem} with a context of {max_model_len} tokens",
            config=wanted,
            system_config=dict(base.system_config),
        ),
    )
