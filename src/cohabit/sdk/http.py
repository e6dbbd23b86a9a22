"""The wire under both clients: where the server is (argument, `COHABIT_BASE_URL`, or the local
default), the bearer token (argument or `COHABIT_API_TOKEN`), one request described as a
`Call`, its answer as a `Reply`, and the server's `{"detail": …}` errors turned into
`errors.APIError` subclasses. `HttpSession` runs calls through a transport: one pooled
httpx.Client, or for a process that makes a call or two and must start at once a plain socket
(`lean_session`, the `cohabit` command line's `ps`: importing httpx takes longer than that
whole command may). `AsyncHttpSession` runs them on httpx.AsyncClient. The services never
touch a transport themselves; httpx loads with the first one that uses it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar
from urllib.parse import quote, urlencode, urlsplit

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

if TYPE_CHECKING:
    import httpx

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


class Routed(Protocol):
    """What `endpoint_url` reads of a deployment (`schemas.Deployment` has it)."""

    @property
    def id(self) -> object: ...
    @property
    def endpoint(self) -> str | None: ...
    @property
    def access_path(self) -> str | None: ...


def endpoint_url(base_url: str, deployment: Routed) -> str:
    """The OpenAI-compatible URL of a deployment: the `endpoint` the server gives, else its
    `access_path` on the server's origin (plus `/v1`), else the gateway's canonical
    `/runtime/models/{id}/v1`."""
    if deployment.endpoint:
        return deployment.endpoint
    origin = origin_of(base_url)
    if deployment.access_path:
        path = deployment.access_path.rstrip("/")
        return f"{origin}{path}" if path.endswith("/v1") else f"{origin}{path}/v1"
    return f"{origin}/runtime/models/{deployment.id}/v1"


def unparsed(call: Call[Any]) -> Call[Any]:
    """`call` with its answer left as the JSON it is, for a reader without the schemas."""
    return replace(call, parse=_as_is)


def _as_is(data: Any) -> Any:
    return data


@dataclass(frozen=True, slots=True, kw_only=True)
class Reply:
    """An HTTP answer, whichever transport read it."""

    status_code: int
    reason: str
    content: bytes

    def json(self) -> Any:
        return json.loads(self.content)


def answer(call: Call[T], reply: Reply) -> T:
    """The parsed body of a success, or the APIError the status calls for."""
    if reply.status_code >= 400:
        raise error_for_response(call, reply)
    if not reply.content:
        return call.parse(None)
    try:
        data = reply.json()
    except ValueError:
        raise APIError(
            f"{call.method} {call.path}: the server answered {reply.status_code} with "
            "something that is not JSON (is the URL the API root, ending in /api?)",
            status_code=reply.status_code,
        ) from None
    return call.parse(data)


def error_for_response(call: Call[Any], reply: Reply) -> APIError:
    try:
        detail = reply.json().get("detail")
    except (ValueError, AttributeError):
        detail = reply.content.decode("utf-8", "replace")[:200] or None
    status = reply.status_code
    text = _detail_text(detail) or reply.reason
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


def _unreachable(base_url: str, err: Exception) -> ServerUnreachable:
    reason = str(err) or type(err).__name__
    return ServerUnreachable(
        f"cannot reach the cohabit server at {base_url}: {reason}", base_url=base_url
    )


def _arguments(call: Call[Any], timeout_s: float) -> dict[str, Any]:
    """The httpx request of `call`."""
    return {
        "method": call.method,
        "url": call.path,
        "params": call.params,
        "json": call.json,
        "timeout": timeout_s,
    }


def _reply(response: httpx.Response) -> Reply:
    return Reply(
        status_code=response.status_code, reason=response.reason_phrase, content=response.content
    )


class Transport(Protocol):
    """Sends one call and reads its answer; raises ServerUnreachable when none comes."""

    def send(self, call: Call[Any], timeout_s: float) -> Reply: ...
    def close(self) -> None: ...


class HttpxTransport:
    """Calls on one pooled httpx.Client."""

    def __init__(self, base_url: str, headers: Mapping[str, str]) -> None:
        import httpx

        self.base_url = base_url
        self._client = httpx.Client(base_url=base_url, headers=headers)

    def send(self, call: Call[Any], timeout_s: float) -> Reply:
        import httpx

        try:
            return _reply(self._client.request(**_arguments(call, timeout_s)))
        except httpx.TransportError as err:
            raise _unreachable(self.base_url, err) from None

    def close(self) -> None:
        self._client.close()


class PlainTransport:
    """Calls over a plain socket, one connection each (`Connection: close`), in the HTTP/1.1
    a server speaks to a client that asks for no compression: plain http, no proxy. Only the
    socket module is imported: http.client would import ssl and the email package, about a
    tenth of the time `cohabit ps` may take, to read the same status line and headers."""

    def __init__(self, base_url: str, headers: Mapping[str, str]) -> None:
        parts = urlsplit(base_url)
        self.base_url = base_url
        self._address = (parts.hostname or "", parts.port or 80)
        self._prefix = parts.path.rstrip("/")
        self._head = {"Host": parts.netloc, **headers, "Connection": "close"}

    def send(self, call: Call[Any], timeout_s: float) -> Reply:
        import socket

        # Percent-encoded as httpx sends it: an id or a name may hold any character.
        target = quote(self._prefix + call.path, safe="/:@!$&'()*+,;=%")
        if call.params:
            target += "?" + urlencode(call.params, doseq=True)
        head, body = dict(self._head), b""
        if call.json is not None:
            body = json.dumps(call.json).encode()
            head["Content-Type"] = "application/json"
        if body or call.method in ("POST", "PUT", "PATCH"):
            head["Content-Length"] = str(len(body))
        lines = [f"{call.method} {target} HTTP/1.1", *(f"{k}: {v}" for k, v in head.items())]
        request = "\r\n".join([*lines, "", ""]).encode("latin-1") + body
        try:
            with socket.create_connection(self._address, timeout=timeout_s) as connection:
                connection.sendall(request)
                received = []
                while chunk := connection.recv(65536):
                    received.append(chunk)
        except OSError as err:
            raise _unreachable(self.base_url, err) from None
        try:
            return _read_reply(b"".join(received))
        except ValueError:
            raise _unreachable(
                self.base_url, ConnectionError("its answer was cut short, or is not HTTP")
            ) from None

    def close(self) -> None:
        return None  # each call closes its own connection


def _read_reply(data: bytes) -> Reply:
    """An HTTP/1.1 answer read to its end: the status line, the headers, then the body as
    `Transfer-Encoding: chunked` or `Content-Length` frame it. ValueError if it is cut short
    or is not HTTP."""
    head, blank, rest = data.partition(b"\r\n\r\n")
    if not blank:
        raise ValueError("no end of headers")
    status_line, *fields = head.decode("latin-1").split("\r\n")
    _version, status, reason = [*status_line.split(" ", 2), ""][:3]
    headers = {
        name.strip().lower(): value.strip() for name, _, value in (f.partition(":") for f in fields)
    }
    if "chunked" in headers.get("transfer-encoding", "").lower():
        content = bytearray()
        while True:
            size_end = rest.index(b"\r\n")
            size = int(rest[:size_end].split(b";")[0], 16)
            if size == 0:
                break
            content += rest[size_end + 2 : size_end + 2 + size]
            rest = rest[size_end + 2 + size + 2 :]
        return Reply(status_code=int(status), reason=reason, content=bytes(content))
    if "content-length" in headers:
        length = int(headers["content-length"])
        if len(rest) < length:
            raise ValueError("body shorter than its Content-Length")
        rest = rest[:length]
    return Reply(status_code=int(status), reason=reason, content=rest)


class HttpSession:
    """Runs calls through one transport (one pooled httpx.Client unless given another)."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        *,
        timeout_s: float,
        transport: Transport | None = None,
    ) -> None:
        self.base_url = base_url
        self.api_key = api_key
        self.timeout_s = timeout_s
        self._transport = transport or HttpxTransport(base_url, headers_for(api_key))

    def run(self, call: Call[T]) -> T:
        timeout_s = self.timeout_s if call.timeout_s is None else call.timeout_s
        return answer(call, self._transport.send(call, timeout_s))

    def close(self) -> None:
        self._transport.close()


# httpx honours these (in either case) for plain http URLs; a plain socket knows none of them.
_PROXY_VARIABLES = ("http_proxy", "all_proxy")


def lean_session(
    base_url: str | None = None,
    api_key: str | None = None,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> HttpSession:
    """A session for a process that makes a call or two and must start at once: on a plain
    socket where that reaches the server as httpx would — a plain http URL without credentials
    in it, and no proxy set in the environment — else on httpx. ValueError for a base URL that
    is not an http(s) URL."""
    url = resolve_base_url(base_url)
    key = resolve_api_key(api_key)
    parts = urlsplit(url)
    proxied = any(os.environ.get(name) or os.environ.get(name.upper()) for name in _PROXY_VARIABLES)
    plain = parts.scheme == "http" and parts.username is None and not proxied
    transport = (PlainTransport if plain else HttpxTransport)(url, headers_for(key))
    return HttpSession(url, key, timeout_s=timeout_s, transport=transport)


class AsyncHttpSession:
    """Runs calls on one pooled httpx.AsyncClient."""

    def __init__(self, base_url: str, api_key: str | None, *, timeout_s: float) -> None:
        import httpx

        self.base_url = base_url
        self.api_key = api_key
        self.timeout_s = timeout_s
        self._client = httpx.AsyncClient(base_url=base_url, headers=headers_for(api_key))

    async def run(self, call: Call[T]) -> T:
        import httpx

        timeout_s = self.timeout_s if call.timeout_s is None else call.timeout_s
        try:
            response = await self._client.request(**_arguments(call, timeout_s))
        except httpx.TransportError as err:
            raise _unreachable(self.base_url, err) from None
        return answer(call, _reply(response))

    async def close(self) -> None:
        await self._client.aclose()
