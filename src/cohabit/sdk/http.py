"""The wire under both clients: where the server is (argument, `COHABIT_BASE_URL`, or the local
default), the bearer token (argument or `COHABIT_API_TOKEN`), one request described as a
`Call`, and the server's `{"detail": …}` errors turned into `errors.APIError` subclasses.
`HttpSession` and `AsyncHttpSession` run calls; the services never touch httpx themselves.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

import httpx

from cohabit import __version__
from cohabit.sdk.errors import (
    APIError,
    AuthenticationError,
    ConflictError,
    NotFoundError,
    PermissionDeniedError,
    ServerError,
    ServerUnreachable,
    ValidationError,
)

T = TypeVar("T")

DEFAULT_BASE_URL = "http://127.0.0.1:8420/api"
DEFAULT_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Call(Generic[T]):
    """One HTTP request and how to read its JSON answer."""

    method: str
    path: str
    parse: Callable[[Any], T]
    params: Mapping[str, Any] | None = None
    json: Any = None
    timeout_s: float | None = None  # None: the client's timeout


def resolve_base_url(base_url: str | None) -> str:
    url = (base_url or os.environ.get("COHABIT_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"base URL {url!r} is not an http(s) URL like {DEFAULT_BASE_URL}")
    return url


def resolve_api_key(api_key: str | None) -> str | None:
    return api_key or os.environ.get("COHABIT_API_TOKEN") or None


def headers_for(api_key: str | None) -> dict[str, str]:
    headers = {"User-Agent": f"cohabit-sdk/{__version__}", "Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def origin_of(base_url: str) -> str:
    """`http://host:8420/api` → `http://host:8420`: where the gateway routes live."""
    parts = urlsplit(base_url)
    return f"{parts.scheme}://{parts.netloc}"


def answer(call: Call[T], response: httpx.Response) -> T:
    """The parsed body of a success, or the APIError the status calls for."""
    if response.status_code >= 400:
        raise error_for_response(call, response)
    if not response.content:
        return call.parse(None)
    try:
        data = response.json()
    except ValueError:
        raise APIError(
            f"{call.method} {call.path}: the server answered {response.status_code} with "
            "something that is not JSON (is the URL the API root, ending in /api?)",
            status_code=response.status_code,
        ) from None
    return call.parse(data)


def error_for_response(call: Call[Any], response: httpx.Response) -> APIError:
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        detail = response.text[:200] or None
    status = response.status_code
    text = _detail_text(detail) or response.reason_phrase
    if status == 404 and detail == "Not Found":
        text += f" ({call.path} is not a route here: is the URL the API root, ending in /api?)"
    kind: type[APIError] = APIError
    if status == 401:
        kind = AuthenticationError
        text += " (set COHABIT_API_TOKEN or pass api_key)"
    elif status == 403:
        kind = PermissionDeniedError
    elif status == 404:
        kind = NotFoundError
    elif status in (400, 422):
        kind = ValidationError
    elif status == 409:
        kind = ConflictError
    elif status >= 500:
        kind = ServerError
    return kind(f"{status}: {text}", status_code=status, detail=detail)


def _detail_text(detail: Any) -> str:
    if isinstance(detail, str):
        return detail
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):
        # FastAPI's 422: [{"loc": ["body", "m_id"], "msg": "…"}, …]
        first = detail[0]
        where = ".".join(str(part) for part in first.get("loc", ()) if part != "body")
        return f"{where}: {first.get('msg', '')}" if where else str(first.get("msg", ""))
    if isinstance(detail, dict):
        return str(detail.get("message") or detail.get("reason") or detail)
    return "" if detail is None else str(detail)


def _unreachable(base_url: str, err: httpx.TransportError) -> ServerUnreachable:
    reason = str(err) or type(err).__name__
    return ServerUnreachable(
        f"cannot reach the cohabit server at {base_url}: {reason}", base_url=base_url
    )


def _arguments(call: Call[Any], default_timeout_s: float) -> dict[str, Any]:
    """The httpx request of `call`, with its own timeout or the session's."""
    timeout_s = default_timeout_s if call.timeout_s is None else call.timeout_s
    return {
        "method": call.method,
        "url": call.path,
        "params": call.params,
        "json": call.json,
        "timeout": timeout_s,
    }


class HttpSession:
    """Runs calls on one pooled httpx.Client."""

    def __init__(self, base_url: str, api_key: str | None, *, timeout_s: float) -> None:
        self.base_url = base_url
        self.api_key = api_key
        self.timeout_s = timeout_s
        self._client = httpx.Client(base_url=base_url, headers=headers_for(api_key))

    def run(self, call: Call[T]) -> T:
        try:
            response = self._client.request(**_arguments(call, self.timeout_s))
        except httpx.TransportError as err:
            raise _unreachable(self.base_url, err) from None
        return answer(call, response)

    def close(self) -> None:
        self._client.close()


class AsyncHttpSession:
    """Runs calls on one pooled httpx.AsyncClient."""

    def __init__(self, base_url: str, api_key: str | None, *, timeout_s: float) -> None:
        self.base_url = base_url
        self.api_key = api_key
        self.timeout_s = timeout_s
        self._client = httpx.AsyncClient(base_url=base_url, headers=headers_for(api_key))

    async def run(self, call: Call[T]) -> T:
        try:
            response = await self._client.request(**_arguments(call, self.timeout_s))
        except httpx.TransportError as err:
            raise _unreachable(self.base_url, err) from None
        return answer(call, response)

    async def close(self) -> None:
        await self._client.aclose()
