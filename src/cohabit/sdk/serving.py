"""`client.serving`: the kamiwaza SDK's serving calls (docs/sdk.md) with the same
names and behaviour — deploy and wait, status, list, stop, estimate, logs — typed, and with the
placement fields declared. `AsyncServingService` is the same, awaited.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from functools import partial
from typing import Any
from uuid import UUID

from cohabit.sdk import calls
from cohabit.sdk.calls import Id
from cohabit.sdk.errors import (
    CohabitError,
    ConflictError,
    DeploymentFailedError,
    failure_message,
)
from cohabit.sdk.fixes import NO_FIT_CODE
from cohabit.sdk.http import AsyncHttpSession, HttpSession
from cohabit.sdk.http import endpoint_url as endpoint_url  # long defined here
from cohabit.sdk.models import AsyncModelsService, ModelsService, default_config
from cohabit.sdk.paging import PAGE_SIZE, every, every_async
from cohabit.sdk.schemas import (
    ActiveDeployment,
    ContainerLogPatternResponse,
    ContainerLogResponse,
    CreateModelDeployment,
    Deployment,
    DeploymentEvent,
    DeploymentEvents,
    ModelInstance,
    VramEstimate,
)
from cohabit.sdk.waiting import EventFollow, OnUpdate, Wait, new_lines

DEFAULT_POLL_INTERVAL_S = 5.0
DEFAULT_TIMEOUT_S = 3600


def active(base_url: str, deployments: list[Deployment]) -> list[ActiveDeployment]:
    """DEPLOYED deployments with a DEPLOYED instance, each with its endpoint."""
    return [
        ActiveDeployment.model_validate(d.model_dump() | {"endpoint": endpoint_url(base_url, d)})
        for d in deployments
        if d.status.upper() == "DEPLOYED" and any(i.status == "DEPLOYED" for i in d.instances)
    ]


def refused_at_admission(err: ConflictError) -> DeploymentFailedError | None:
    """A 409 NoFit (bigger than every device of the fleet) as the same error a NoFit found
    while waiting raises; other conflicts stay what they are."""
    detail = err.detail
    if not isinstance(detail, dict) or detail.get("error") != "placement_no_fit":
        return None
    message = f"{detail.get('reason')}: {detail.get('message')}"
    return DeploymentFailedError(
        failure_message(None, "FAILED", message) + " (refused at admission, nothing recorded)",
        status="FAILED",
        last_error_code=NO_FIT_CODE,
        last_error_message=message,
        deployment_id=None,
        no_fit=detail,
    )


def _request(
    model_id: Id, config_id: Id | None, file_id: Id | None, kwargs: dict[str, Any]
) -> CreateModelDeployment:
    fields = {"m_id": model_id, "m_config_id": config_id, "m_file_id": file_id}
    return CreateModelDeployment.model_validate(fields | kwargs)


class ServingService:
    def __init__(self, http: HttpSession, models: ModelsService) -> None:
        self._http = http
        self._models = models

    def deploy_model(
        self,
        model_id: Id | None = None,
        repo_id: str | None = None,
        m_config_id: Id | None = None,
        m_file_id: Id | None = None,
        *,
        wait: bool = True,
        timeout_seconds: float = DEFAULT_TIMEOUT_S,
        poll_interval_seconds: float = DEFAULT_POLL_INTERVAL_S,
        on_update: OnUpdate | None = None,
        **kwargs: Any,
    ) -> UUID:
        """Deploy a model (by id, or by repo id through the catalog; its default config when
        `m_config_id` is omitted) and return the deployment id. With `wait`, block until
        DEPLOYED (or UNLOADED, when it starts with no copy): DeploymentFailedError on FAILED /
        ERROR / MUST_REDOWNLOAD (and on a NoFit, even one refused at admission), TimeoutError
        after `timeout_seconds`. `kwargs` go into
        the body (`engine_name`, `vram_allocation` in bytes, `force_cpu`, `min_copies`,
        `keep_alive` in seconds, `priority`, `queue`, `duration` in minutes, …)."""
        if model_id is None and repo_id is None:
            raise ValueError("Either model_id or repo_id must be provided")
        if model_id is None:
            model_id = self._models.get_model_by_repo_id(str(repo_id)).id
        if m_config_id is None:
            m_config_id = default_config(model_id, self._models.get_model_configs(model_id)).id
        try:
            deployment_id = self._http.run(
                calls.deploy(_request(model_id, m_config_id, m_file_id, kwargs))
            )
        except ConflictError as err:
            raise refused_at_admission(err) or err from None
        if wait:
            self.wait_deployment_ready(
                deployment_id,
                timeout_seconds=timeout_seconds,
                poll_interval_seconds=poll_interval_seconds,
                on_update=on_update,
            )
        return deployment_id

    def wait_deployment_ready(
        self,
        deployment_id: Id,
        timeout_seconds: float | None = DEFAULT_TIMEOUT_S,
        poll_interval_seconds: float = DEFAULT_POLL_INTERVAL_S,
        *,
        on_update: OnUpdate | None = None,
    ) -> Deployment:
        """Poll until DEPLOYED (or UNLOADED: routable, loaded by its first request) and return
        the deployment; `on_update` sees every record read.
        5xx answers and connection errors are retried (3 in a row at most), 4xx are not."""
        wait = Wait(
            deployment_id=str(deployment_id),
            timeout_s=timeout_seconds,
            poll_interval_s=poll_interval_seconds,
        )
        while True:
            try:
                record = self._http.run(
                    calls.deployment(deployment_id, timeout_s=wait.request_timeout_s())
                )
            except CohabitError as err:
                wait.failed_poll(err)
            else:
                if on_update is not None:
                    on_update(record)
                if (ready := wait.outcome(record)) is not None:
                    return ready
            time.sleep(wait.pause_s())

    def get_deployment_status(self, deployment_id: Id) -> str:
        """The status string, e.g. "DEPLOYED" (the server's bare-string answer, or the
        `status` of an object answer)."""
        return self._http.run(calls.deployment_status(deployment_id))

    def get_deployment(self, deployment_id: Id) -> Deployment:
        return self._http.run(calls.deployment(deployment_id))

    def list_deployments(self, model_id: Id | None = None) -> list[Deployment]:
        """Every deployment (of the model, with `model_id`): the active ones first, oldest
        first, then the ended ones, newest first (every page)."""
        return list(self.iter_deployments(model_id))

    def iter_deployments(
        self, model_id: Id | None = None, *, page_size: int = PAGE_SIZE
    ) -> Iterator[Deployment]:
        """`list_deployments`, read `page_size` at a time as they are used."""
        return every(self._http, partial(calls.deployments, model_id), page_size=page_size)

    def list_active_deployments(self) -> list[ActiveDeployment]:
        """DEPLOYED deployments that serve, with the `endpoint` URL an OpenAI client uses."""
        return active(self._http.base_url, self.list_deployments())

    def stop_deployment(
        self, deployment_id: Id | None = None, repo_id: str | None = None, force: bool = False
    ) -> bool:
        """Stop one deployment, or every active one of the model with `repo_id`. True when
        something was stopped, False when it had already ended."""
        if deployment_id is not None:
            return self._http.run(calls.stop(deployment_id, force=force))
        if repo_id is None:
            raise ValueError("Either deployment_id or repo_id must be provided")
        model = self._models.get_model_by_repo_id(repo_id)
        stopped = False
        for target in self.list_deployments(model_id=model.id):
            if target.is_active:
                stopped = self._http.run(calls.stop(target.id, force=force)) or stopped
        return stopped

    def estimate_model_vram(
        self,
        deployment_request: CreateModelDeployment | None = None,
        *,
        model_id: Id | None = None,
        m_config_id: Id | None = None,
        m_file_id: Id | None = None,
        **kwargs: Any,
    ) -> VramEstimate:
        """Bytes per device the deployment would reserve, and the largest device's memory.
        Give the request, or `model_id` (and optionally config, file, engine_name, …)."""
        if deployment_request is None:
            if model_id is None:
                raise ValueError("Either deployment_request or model_id must be provided")
            deployment_request = _request(model_id, m_config_id, m_file_id, kwargs)
        return self._http.run(calls.estimate(deployment_request))

    def get_deployment_logs(self, deployment_id: Id, *, copy: int = 0) -> ContainerLogResponse:
        """The engine's last lines; `copy` picks a copy's engine (0: the deployment's own)."""
        return self._http.run(calls.deployment_logs(deployment_id, copy=copy))

    def get_deployment_log_patterns(self, deployment_id: Id) -> ContainerLogPatternResponse:
        """Failure patterns (OOM, CUDA errors, …) found in the log; informational."""
        return self._http.run(calls.deployment_log_patterns(deployment_id))

    def stream_deployment_logs(
        self,
        deployment_id: Id,
        *,
        poll_interval: float = 2.0,
        max_empty_polls: int | None = 10,
        copy: int = 0,
    ) -> Iterator[str]:
        """New log lines as they come; ends when the deployment has ended (after its last
        lines), or after `max_empty_polls` polls in a row brought nothing (None: never)."""
        seen: list[str] = []
        empty = 0
        while True:
            lines = self.get_deployment_logs(deployment_id, copy=copy).logs
            fresh = new_lines(seen, lines)
            yield from fresh
            seen = lines
            empty = 0 if fresh else empty + 1
            if max_empty_polls is not None and empty >= max_empty_polls:
                return
            if not self.get_deployment(deployment_id).is_active:
                yield from new_lines(seen, self.get_deployment_logs(deployment_id, copy=copy).logs)
                return
            time.sleep(poll_interval)

    def get_deployment_events(
        self, deployment_id: Id, *, after: int = 0, limit: int | None = None
    ) -> DeploymentEvents:
        """A page of the deployment's timeline (events with an id above `after`, oldest
        first, at most `limit`, the server's page when None), its status, and the `cursor`
        to pass as the next `after`."""
        return self._http.run(calls.deployment_events(deployment_id, after=after, limit=limit))

    def stream_deployment_events(
        self, deployment_id: Id, *, after: int = 0, poll_interval: float = 1.0
    ) -> Iterator[DeploymentEvent]:
        """Every event after `after`, then new ones as they come; ends once the deployment
        has ended and its closing event (stopped, failed, no_fit) came."""
        follow = EventFollow(after=after)
        while True:
            page = self.get_deployment_events(deployment_id, after=follow.after)
            yield from follow.take(page)
            if follow.done:
                return
            if not page.events:
                time.sleep(poll_interval)

    def list_model_instances(self, deployment_id: Id | None = None) -> list[ModelInstance]:
        return self._http.run(calls.model_instances(deployment_id))

    def get_health(self) -> list[dict[str, str]]:
        return self._http.run(calls.health())

    def get_status(self) -> dict[str, str]:
        return self._http.run(calls.serving_status())


class AsyncServingService:
    def __init__(self, http: AsyncHttpSession, models: AsyncModelsService) -> None:
        self._http = http
        self._models = models

    async def deploy_model(
        self,
        model_id: Id | None = None,
        repo_id: str | None = None,
        m_config_id: Id | None = None,
        m_file_id: Id | None = None,
        *,
        wait: bool = True,
        timeout_seconds: float = DEFAULT_TIMEOUT_S,
        poll_interval_seconds: float = DEFAULT_POLL_INTERVAL_S,
        on_update: OnUpdate | None = None,
        **kwargs: Any,
    ) -> UUID:
        """As `ServingService.deploy_model`."""
        if model_id is None and repo_id is None:
            raise ValueError("Either model_id or repo_id must be provided")
        if model_id is None:
            model_id = (await self._models.get_model_by_repo_id(str(repo_id))).id
        if m_config_id is None:
            configs = await self._models.get_model_configs(model_id)
            m_config_id = default_config(model_id, configs).id
        try:
            deployment_id = await self._http.run(
                calls.deploy(_request(model_id, m_config_id, m_file_id, kwargs))
            )
        except ConflictError as err:
            raise refused_at_admission(err) or err from None
        if wait:
            await self.wait_deployment_ready(
                deployment_id,
                timeout_seconds=timeout_seconds,
                poll_interval_seconds=poll_interval_seconds,
                on_update=on_update,
            )
        return deployment_id

    async def wait_deployment_ready(
        self,
        deployment_id: Id,
        timeout_seconds: float | None = DEFAULT_TIMEOUT_S,
        poll_interval_seconds: float = DEFAULT_POLL_INTERVAL_S,
        *,
        on_update: OnUpdate | None = None,
    ) -> Deployment:
        wait = Wait(
            deployment_id=str(deployment_id),
            timeout_s=timeout_seconds,
            poll_interval_s=poll_interval_seconds,
        )
        while True:
            try:
                record = await self._http.run(
                    calls.deployment(deployment_id, timeout_s=wait.request_timeout_s())
                )
            except CohabitError as err:
                wait.failed_poll(err)
            else:
                if on_update is not None:
                    on_update(record)
                if (ready := wait.outcome(record)) is not None:
                    return ready
            await asyncio.sleep(wait.pause_s())

    async def get_deployment_status(self, deployment_id: Id) -> str:
        return await self._http.run(calls.deployment_status(deployment_id))

    async def get_deployment(self, deployment_id: Id) -> Deployment:
        return await self._http.run(calls.deployment(deployment_id))

    async def list_deployments(self, model_id: Id | None = None) -> list[Deployment]:
        return [deployment async for deployment in self.iter_deployments(model_id)]

    def iter_deployments(
        self, model_id: Id | None = None, *, page_size: int = PAGE_SIZE
    ) -> AsyncIterator[Deployment]:
        return every_async(self._http, partial(calls.deployments, model_id), page_size=page_size)

    async def list_active_deployments(self) -> list[ActiveDeployment]:
        return active(self._http.base_url, await self.list_deployments())

    async def stop_deployment(
        self, deployment_id: Id | None = None, repo_id: str | None = None, force: bool = False
    ) -> bool:
        if deployment_id is not None:
            return await self._http.run(calls.stop(deployment_id, force=force))
        if repo_id is None:
            raise ValueError("Either deployment_id or repo_id must be provided")
        model = await self._models.get_model_by_repo_id(repo_id)
        stopped = False
        for target in await self.list_deployments(model_id=model.id):
            if target.is_active:
                stopped = await self._http.run(calls.stop(target.id, force=force)) or stopped
        return stopped

    async def estimate_model_vram(
        self,
        deployment_request: CreateModelDeployment | None = None,
        *,
        model_id: Id | None = None,
        m_config_id: Id | None = None,
        m_file_id: Id | None = None,
        **kwargs: Any,
    ) -> VramEstimate:
        if deployment_request is None:
            if model_id is None:
                raise ValueError("Either deployment_request or model_id must be provided")
            deployment_request = _request(model_id, m_config_id, m_file_id, kwargs)
        return await self._http.run(calls.estimate(deployment_request))

    async def get_deployment_logs(
        self, deployment_id: Id, *, copy: int = 0
    ) -> ContainerLogResponse:
        return await self._http.run(calls.deployment_logs(deployment_id, copy=copy))

    async def get_deployment_log_patterns(self, deployment_id: Id) -> ContainerLogPatternResponse:
        return await self._http.run(calls.deployment_log_patterns(deployment_id))

    async def stream_deployment_logs(
        self,
        deployment_id: Id,
        *,
        poll_interval: float = 2.0,
        max_empty_polls: int | None = 10,
        copy: int = 0,
    ) -> AsyncIterator[str]:
        seen: list[str] = []
        empty = 0
        while True:
            lines = (await self.get_deployment_logs(deployment_id, copy=copy)).logs
            fresh = new_lines(seen, lines)
            for line in fresh:
                yield line
            seen = lines
            empty = 0 if fresh else empty + 1
            if max_empty_polls is not None and empty >= max_empty_polls:
                return
            if not (await self.get_deployment(deployment_id)).is_active:
                last = await self.get_deployment_logs(deployment_id, copy=copy)
                for line in new_lines(seen, last.logs):
                    yield line
                return
            await asyncio.sleep(poll_interval)

    async def get_deployment_events(
        self, deployment_id: Id, *, after: int = 0, limit: int | None = None
    ) -> DeploymentEvents:
        return await self._http.run(
            calls.deployment_events(deployment_id, after=after, limit=limit)
        )

    async def stream_deployment_events(
        self, deployment_id: Id, *, after: int = 0, poll_interval: float = 1.0
    ) -> AsyncIterator[DeploymentEvent]:
        follow = EventFollow(after=after)
        while True:
            page = await self.get_deployment_events(deployment_id, after=follow.after)
            for event in follow.take(page):
                yield event
            if follow.done:
                return
            if not page.events:
                await asyncio.sleep(poll_interval)

    async def list_model_instances(self, deployment_id: Id | None = None) -> list[ModelInstance]:
        return await self._http.run(calls.model_instances(deployment_id))

    async def get_health(self) -> list[dict[str, str]]:
        return await self._http.run(calls.health())

    async def get_status(self) -> dict[str, str]:
        return await self._http.run(calls.serving_status())
