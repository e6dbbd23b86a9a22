"""`Client` and `AsyncClient`: one connection to a cohabit server (`client.serving`,
`client.models`, `client.cluster`, `client.auth`), and an OpenAI client pointed at a
deployment through the gateway.

    client = Client()   # COHABIT_BASE_URL (default http://127.0.0.1:8420/api), COHABIT_API_TOKEN
    deployment_id = client.serving.deploy_model(repo_id="Qwen/Qwen3-8B")
"""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Any

from cohabit.sdk.auth import AsyncAuthService, AuthService
from cohabit.sdk.calls import Id
from cohabit.sdk.cluster import AsyncClusterService, ClusterService
from cohabit.sdk.http import (
    DEFAULT_TIMEOUT_S,
    AsyncHttpSession,
    HttpSession,
    endpoint_url,
    resolve_api_key,
    resolve_base_url,
)
from cohabit.sdk.models import AsyncModelsService, ModelsService
from cohabit.sdk.serving import AsyncServingService, ServingService

if TYPE_CHECKING:
    import openai


def _openai_module() -> Any:
    try:
        import openai
    except ImportError:
        raise ImportError("client.openai() needs the openai package: pip install openai") from None
    return openai


class Client:
    """A cohabit server. `base_url` is the API root (…/api); `api_key` the bearer token;
    `timeout_s` each request's transport timeout (polls clip it to the time left)."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.base_url = resolve_base_url(base_url)
        self.api_key = resolve_api_key(api_key)
        self._http = HttpSession(self.base_url, self.api_key, timeout_s=timeout_s)
        self.models = ModelsService(self._http)
        self.serving = ServingService(self._http, self.models)
        self.cluster = ClusterService(self._http)
        self.auth = AuthService(self._http)

    def endpoint(self, deployment_id: Id) -> str:
        """The OpenAI-compatible base URL (…/v1) of a deployment, through the gateway."""
        return endpoint_url(self.base_url, self.serving.get_deployment(deployment_id))

    def openai(self, deployment_id: Id, **kwargs: Any) -> openai.OpenAI:
        """An `openai.OpenAI` client for the deployment, sending this client's token."""
        module = _openai_module()
        client: openai.OpenAI = module.OpenAI(
            base_url=self.endpoint(deployment_id), api_key=self.api_key or "none", **kwargs
        )
        return client

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


class AsyncClient:
    """`Client`, awaited: the same calls, arguments and models."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.base_url = resolve_base_url(base_url)
        self.api_key = resolve_api_key(api_key)
        self._http = AsyncHttpSession(self.base_url, self.api_key, timeout_s=timeout_s)
        self.models = AsyncModelsService(self._http)
        self.serving = AsyncServingService(self._http, self.models)
        self.cluster = AsyncClusterService(self._http)
        self.auth = AsyncAuthService(self._http)

    async def endpoint(self, deployment_id: Id) -> str:
        return endpoint_url(self.base_url, await self.serving.get_deployment(deployment_id))

    async def openai(self, deployment_id: Id, **kwargs: Any) -> openai.AsyncOpenAI:
        """An `openai.AsyncOpenAI` client for the deployment."""
        module = _openai_module()
        client: openai.AsyncOpenAI = module.AsyncOpenAI(
            base_url=await self.endpoint(deployment_id),
            api_key=self.api_key or "none",
            **kwargs,
        )
        return client

    async def aclose(self) -> None:
        await self._http.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()
