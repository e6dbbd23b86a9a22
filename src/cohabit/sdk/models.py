"""`client.models`: the catalog — register a model from a path or a Hugging Face repo id, list
(every page), find and delete models, read, create, replace and delete their configs, list
model files. `AsyncModelsService` is the same, awaited.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any
from uuid import UUID

from cohabit.sdk import calls
from cohabit.sdk.calls import Id
from cohabit.sdk.errors import DownloadFailedError, NotFoundError
from cohabit.sdk.http import AsyncHttpSession, HttpSession
from cohabit.sdk.paging import PAGE_SIZE, every, every_async
from cohabit.sdk.schemas import (
    CreateModel,
    CreateModelConfig,
    DownloadStarted,
    DownloadStatus,
    Model,
    ModelConfig,
    ModelFile,
    VariantList,
)


def registration(source: str | Path, *, name: str | None = None) -> CreateModel:
    """A path that exists here (or looks like one) is a local model; anything else is a
    Hugging Face repo id such as `Qwen/Qwen3-8B`."""
    text = str(source)
    path = Path(text).expanduser()
    if path.exists() or text.startswith(("/", "./", "../", "~")):
        return CreateModel(name=name, path=str(path.resolve()))
    return CreateModel(name=name, repo_modelId=text)


def model_by_repo_id(models: Iterable[Model], repo_id: str) -> Model:
    for model in models:
        if model.repo_modelId == repo_id:
            return model
    raise ValueError(f"no model with repo id {repo_id!r} in the catalog")


def as_id(ref: str) -> UUID | None:
    """`ref` as an id, when it reads as one."""
    try:
        return UUID(ref)
    except ValueError:
        return None


def find_model(models: Sequence[Model], ref: str) -> Model:
    """A model by id, repo id, name, or the path it was registered from."""
    wanted_id = as_id(ref)
    resolved = str(Path(ref).expanduser().resolve()) if ref else ref
    for test in (
        lambda m: m.id == wanted_id,
        lambda m: m.repo_modelId == ref,
        lambda m: m.name == ref,
        lambda m: m.model_path in (ref, resolved),
    ):
        matches = [model for model in models if test(model)]
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            ids = ", ".join(str(m.id) for m in matches)
            raise ValueError(f"{ref!r} names {len(matches)} models ({ids}): give the model id")
    raise ValueError(f"no model {ref!r} in the catalog (add it with `cohabit models add`)")


def default_config(model_id: Id, configs: Sequence[ModelConfig]) -> ModelConfig:
    """The config flagged default, else the first (as the kamiwaza SDK picks)."""
    if not configs:
        raise ValueError(f"model {model_id} has no configs; create one first")
    return next((config for config in configs if config.default), configs[0])


def find_config(configs: Sequence[ModelConfig], ref: str) -> ModelConfig:
    for config in configs:
        if str(config.id) == ref or config.name == ref:
            return config
    names = ", ".join(c.name or str(c.id) for c in configs) or "none"
    raise ValueError(f"no config {ref!r} for this model (it has: {names})")


def matching_config(
    configs: Sequence[ModelConfig], base: ModelConfig, settings: Mapping[str, Any]
) -> tuple[ModelConfig | None, CreateModelConfig]:
    """A config equal to `base` with `settings` laid over it: the existing one if a config
    already says exactly that, and the body that would create it."""
    wanted = dict(base.config) | dict(settings)
    for config in configs:
        if config.config == wanted and config.m_file_id == base.m_file_id:
            return config, CreateModelConfig(m_id=base.m_id, config=wanted)
    label = " ".join(f"{key}={value}" for key, value in sorted(settings.items()))
    body = CreateModelConfig(
        m_id=base.m_id,
        m_file_id=base.m_file_id,
        name=f"{base.name or 'config'} {label}",
        default=False,
        description=f"{base.name or 'the default config'} with {label}",
        config=wanted,
        system_config=dict(base.system_config),
    )
    return None, body


class ModelsService:
    def __init__(self, http: HttpSession) -> None:
        self._http = http

    def list_models(self) -> list[Model]:
        """Every model of the catalog, oldest first (every page)."""
        return list(self.iter_models())

    def iter_models(self, *, page_size: int = PAGE_SIZE) -> Iterator[Model]:
        """The catalog's models, oldest first, read `page_size` at a time as they are used."""
        return every(self._http, calls.models, page_size=page_size)

    def get_model(self, model_id: Id) -> Model:
        return self._http.run(calls.model(model_id))

    def get_model_by_repo_id(self, repo_id: str) -> Model:
        return model_by_repo_id(self.iter_models(), repo_id)

    def find_model(self, ref: str) -> Model:
        """By id (asked of the server by itself), else by repo id, name or registered path
        among every model; ValueError when none or several match."""
        if (model_id := as_id(ref)) is not None:
            try:
                return self.get_model(model_id)
            except NotFoundError:
                pass  # a name may read as an id
        return find_model(self.list_models(), ref)

    def create_model(self, model: CreateModel) -> Model:
        return self._http.run(calls.create_model(model))

    def add_model(self, source: str | Path, *, name: str | None = None) -> Model:
        """Register a local .gguf file or checkpoint directory, or a Hugging Face repo id."""
        return self.create_model(registration(source, name=name))

    def get_model_configs(self, model_id: Id) -> list[ModelConfig]:
        """Every config of the model, oldest first (every page)."""
        return list(every(self._http, partial(calls.model_configs, model_id)))

    def get_model_config(self, config_id: Id) -> ModelConfig:
        return self._http.run(calls.model_config(config_id))

    def create_model_config(self, config: CreateModelConfig) -> ModelConfig:
        return self._http.run(calls.create_model_config(config))

    def update_model_config(self, config_id: Id, config: CreateModelConfig) -> ModelConfig:
        """Replace a config's fields (admin); running deployments keep their size."""
        return self._http.run(calls.update_model_config(config_id, config))

    def delete_model_config(self, config_id: Id) -> ModelConfig:
        """Delete a config (admin); ConflictError while an active deployment uses it."""
        return self._http.run(calls.delete_model_config(config_id))

    def delete_model(self, model_id: Id, *, delete_files: bool = False) -> dict[str, Any]:
        """Delete a model with its configs (admin); ConflictError while it is deployed. Its
        files stay unless `delete_files` (and then only those under the server's data dir)."""
        return self._http.run(calls.delete_model(model_id, delete_files=delete_files))

    def get_model_memory_usage(self, model_id: Id) -> int:
        """Bytes per device a deployment of its default config would reserve."""
        return self._http.run(calls.memory_usage(model_id))

    def list_model_files(self) -> list[ModelFile]:
        return self._http.run(calls.model_files())

    def config_with(
        self, model_id: Id, settings: Mapping[str, Any], *, base: ModelConfig | None = None
    ) -> ModelConfig:
        """The model's config `base` (default: its default) with `settings` (e.g.
        `{"max_model_len": 2048}`) laid over it — found if it exists, else created."""
        configs = self.get_model_configs(model_id)
        base = base or default_config(model_id, configs)
        existing, body = matching_config(configs, base, settings)
        return existing or self.create_model_config(body)

    def variants(self, repo_id: str, *, revision: str | None = None) -> VariantList:
        """A GGUF repo's variants with sizes and estimates, and the one this fleet would get."""
        return self._http.run(calls.variants(repo_id, revision))

    def download(
        self,
        repo_id: str,
        *,
        variant: str | None = None,
        files: list[str] | None = None,
        revision: str | None = None,
        hf_cache: bool = False,
    ) -> DownloadStarted:
        """Queue a download on the server (admin); `variant` None: the fleet's choice."""
        call = calls.download(
            repo_id, variant=variant, files=files, revision=revision, hf_cache=hf_cache
        )
        return self._http.run(call)

    def download_status(self, model_id: Id) -> list[DownloadStatus]:
        return self._http.run(calls.download_status(model_id))

    def wait_for_download(
        self,
        started: DownloadStarted,
        *,
        on_update: Callable[[list[DownloadStatus]], None] | None = None,
        poll_interval_s: float = 1.0,
        timeout_s: float | None = None,
    ) -> list[DownloadStatus]:
        """Poll until none of the files `started` queued is still coming. Raises
        DownloadFailedError naming each failed file, TimeoutError past `timeout_s`."""
        wanted = set(started.files)
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            mine = [s for s in self.download_status(started.model_id) if s.name in wanted]
            if on_update is not None:
                on_update(mine)
            if not any(s.is_downloading for s in mine):
                failed = {s.name: s.error or f"{s.name}: failed" for s in mine if s.error}
                if failed:
                    raise DownloadFailedError(str(started.model_id), failed)
                return mine
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"downloads still running after {timeout_s} s")
            time.sleep(poll_interval_s)


class AsyncModelsService:
    def __init__(self, http: AsyncHttpSession) -> None:
        self._http = http

    async def list_models(self) -> list[Model]:
        return [model async for model in self.iter_models()]

    def iter_models(self, *, page_size: int = PAGE_SIZE) -> AsyncIterator[Model]:
        return every_async(self._http, calls.models, page_size=page_size)

    async def get_model(self, model_id: Id) -> Model:
        return await self._http.run(calls.model(model_id))

    async def get_model_by_repo_id(self, repo_id: str) -> Model:
        return model_by_repo_id(await self.list_models(), repo_id)

    async def find_model(self, ref: str) -> Model:
        if (model_id := as_id(ref)) is not None:
            try:
                return await self.get_model(model_id)
            except NotFoundError:
                pass
        return find_model(await self.list_models(), ref)

    async def create_model(self, model: CreateModel) -> Model:
        return await self._http.run(calls.create_model(model))

    async def add_model(self, source: str | Path, *, name: str | None = None) -> Model:
        return await self.create_model(registration(source, name=name))

    async def get_model_configs(self, model_id: Id) -> list[ModelConfig]:
        configs = every_async(self._http, partial(calls.model_configs, model_id))
        return [config async for config in configs]

    async def get_model_config(self, config_id: Id) -> ModelConfig:
        return await self._http.run(calls.model_config(config_id))

    async def create_model_config(self, config: CreateModelConfig) -> ModelConfig:
        return await self._http.run(calls.create_model_config(config))

    async def update_model_config(self, config_id: Id, config: CreateModelConfig) -> ModelConfig:
        return await self._http.run(calls.update_model_config(config_id, config))

    async def delete_model_config(self, config_id: Id) -> ModelConfig:
        return await self._http.run(calls.delete_model_config(config_id))

    async def delete_model(self, model_id: Id, *, delete_files: bool = False) -> dict[str, Any]:
        return await self._http.run(calls.delete_model(model_id, delete_files=delete_files))

    async def get_model_memory_usage(self, model_id: Id) -> int:
        return await self._http.run(calls.memory_usage(model_id))

    async def list_model_files(self) -> list[ModelFile]:
        return await self._http.run(calls.model_files())

    async def config_with(
        self, model_id: Id, settings: Mapping[str, Any], *, base: ModelConfig | None = None
    ) -> ModelConfig:
        configs = await self.get_model_configs(model_id)
        base = base or default_config(model_id, configs)
        existing, body = matching_config(configs, base, settings)
        return existing or await self.create_model_config(body)

    async def variants(self, repo_id: str, *, revision: str | None = None) -> VariantList:
        return await self._http.run(calls.variants(repo_id, revision))

    async def download(
        self,
        repo_id: str,
        *,
        variant: str | None = None,
        files: list[str] | None = None,
        revision: str | None = None,
        hf_cache: bool = False,
    ) -> DownloadStarted:
        call = calls.download(
            repo_id, variant=variant, files=files, revision=revision, hf_cache=hf_cache
        )
        return await self._http.run(call)

    async def download_status(self, model_id: Id) -> list[DownloadStatus]:
        return await self._http.run(calls.download_status(model_id))
