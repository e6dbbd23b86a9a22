"""The gateway's HTTP/1.1 client to engines (service/gateway/proxy.py): a pool of keep-alive
connections per engine, on asyncio streams, that reads a small answer whole with its head
and hands a larger one, or a stream (SSE), on piece by piece as it arrives.

Why not httpx: on this project's 2-core machine httpx spent ~3 ms of CPU per proxied
request (its models, URL handling and anyio layers), more than the whole budget of the
gateway; this client does the little a proxy to a known engine needs in ~0.1 ms. What it
does not do, because engines do not need it: TLS, proxies, redirects, cookies, HTTP/2.

A pooled connection the engine closed while idle is never used: uvicorn (llama-cpp-python's
server, vLLM) closes idle keep-alive connections after 5 s (`timeout_keep_alive`, uvicorn's
config.py default, which llama_cpp/server/__main__.py keeps), so one idle for `IDLE_S` is
dropped, one already at EOF too; should the engine close one at the very moment it is
reused, the request is sent again once on a new connection — only when not one byte of an
answer came back, which is the case where the engine did not take the request.

An answer the engine garbles — not an HTTP/1.x status line, a header line that is not
`name: value` with a token name and no control bytes in the value, a Content-Length that is
not one number, both Content-Length and Transfer-Encoding (RFC 9112 §6.3: a smuggling
sign), a head over `HEAD_LIMIT_BYTES` — is an `UpstreamError` naming what was wrong, never
relayed: uvicorn would refuse such headers on the way out with a traceback and a 500.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import deque
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

IDLE_S = 4.0  # below the engines' 5 s keep-alive timeout
MAX_IDLE_PER_ENGINE = 64
HEAD_LIMIT_BYTES = 64 * 1024  # the answer's status line and headers
# A body announced by its length up to this size is read with the head, so the answer goes
# out whole and the connection back to its pool at once (a non-streamed completion is a few
# KiB); a larger one, and every chunked stream, passes through piece by piece.
WHOLE_LIMIT_BYTES = 1024 * 1024
_NO_BODY_STATUS = frozenset({204, 304})
_PIECE_BYTES = 256 * 1024  # the most read at once from a body
_CHUNK_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")
# A status line (RFC 9112 §4) and a header line (§5: a token name, no space before the
# colon, a value without control bytes but HTAB); obs-fold is garbage here.
_STATUS_LINE = re.compile(rb"HTTP/1\.([01]) ([1-5][0-9][0-9])(?: [^\x00-\x08\x0a-\x1f\x7f]*)?")
_HEADER_LINE = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+):([^\x00-\x08\x0a-\x1f\x7f]*)")

Headers = list[tuple[bytes, bytes]]


class UpstreamError(Exception):
    """The engine could not be reached, or broke off or garbled its answer."""


class Unreachable(UpstreamError):
    """No connection could be made: nothing listens there (any more), or not in time."""


class _Connection:
    __slots__ = ("idle_since", "reader", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.idle_since = 0.0

    def usable(self, now: float) -> bool:
        return (
            now - self.idle_since < IDLE_S
            and not self.reader.at_eof()
            and not self.writer.is_closing()
        )

    def close(self) -> None:
        self.writer.close()


class Answer:
    """An engine's answer: status and headers read, and `whole` the body when it was read
    with them; else `body()` yields it as it comes and gives the connection back to its pool
    at the end (or closes it when cut short)."""

    __slots__ = ("_chunked", "_connection", "_pool", "content_length", "headers", "status", "whole")

    def __init__(
        self,
        *,
        status: int,
        headers: Headers,
        content_length: int | None,
        chunked: bool,
        connection: _Connection,
        pool: _Pool | None,
    ) -> None:
        self.status = status
        self.headers = headers
        self.content_length = content_length  # None: chunked, or until the engine closes
        self.whole: bytes | None = None
        self._chunked = chunked
        self._connection: _Connection | None = connection
        self._pool = pool  # None: the connection cannot be reused (Connection: close…)

    def keep_whole(self, body: bytes) -> None:
        self.whole = body
        self.release(done=True)

    async def body(self, read_timeout_s: float) -> AsyncIterator[bytes]:
        if self.whole:
            yield self.whole
        connection = self._connection
        if connection is None:
            return
        reader = connection.reader
        complete = False  # a consumer that stops early leaves bytes unread: no reuse
        try:
            if self._chunked:
                async for piece in _chunks(reader, read_timeout_s):
                    yield piece
            elif self.content_length is not None:
                async for piece in _pieces(reader, self.content_length, read_timeout_s):
                    yield piece
            else:
                while True:
                    async with asyncio.timeout(read_timeout_s):
                        piece = await reader.read(_PIECE_BYTES)
                    if not piece:
                        break
                    yield piece
            complete = True
        except (
            OSError,
            TimeoutError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
        ) as err:
            raise UpstreamError(f"the engine's answer broke off: {err!r}") from err
        finally:
            self.release(done=complete)

    def release(self, *, done: bool = False) -> None:
        """Give the connection back (the whole answer was read) or close it."""
        connection, self._connection = self._connection, None
        if connection is None:
            return
        if done and self._pool is not None:
            self._pool.give_back(connection)
        else:
            connection.close()


async def _pieces(
    reader: asyncio.StreamReader, length: int, read_timeout_s: float
) -> AsyncIterator[bytes]:
    """The next `length` bytes, in pieces as they arrive."""
    left = length
    while left:
        async with asyncio.timeout(read_timeout_s):
            piece = await reader.read(min(left, _PIECE_BYTES))
        if not piece:
            raise UpstreamError("the engine closed the connection mid-answer")
        left -= len(piece)
        yield piece


async def _chunks(reader: asyncio.StreamReader, read_timeout_s: float) -> AsyncIterator[bytes]:
    """The data of a chunked body (RFC 9112 §7.1) as it arrives: a chunk already here is one
    piece, a large or late one comes in several; trailers dropped."""
    while True:
        async with asyncio.timeout(read_timeout_s):
            line = await reader.readuntil(b"\r\n")
        size_field = line[:-2].partition(b";")[0].strip()
        if _CHUNK_SIZE.fullmatch(size_field) is None:
            raise UpstreamError(f"bad chunk size line {line[:40]!r}")
        left = int(size_field, 16)
        if left == 0:
            async with asyncio.timeout(read_timeout_s):
                while await reader.readuntil(b"\r\n") != b"\r\n":
                    pass
            return
        async for piece in _pieces(reader, left, read_timeout_s):
            yield piece
        async with asyncio.timeout(read_timeout_s):
            end = await reader.readexactly(2)
        if end != b"\r\n":
            raise UpstreamError(f"a chunk runs past its size: {end!r} where CRLF belongs")


class _Pool:
    """Idle keep-alive connections to one engine, the most recently used taken first."""

    __slots__ = ("host", "idle", "port")

    def __init__(self, host: str, port: int) -> None:
        self.host = host
        self.port = port
        self.idle: deque[_Connection] = deque()

    def take(self) -> _Connection | None:
        now = time.monotonic()
        while self.idle:
            connection = self.idle.pop()
            if connection.usable(now):
                return connection
            connection.close()
        return None

    def give_back(self, connection: _Connection) -> None:
        connection.idle_since = time.monotonic()
        self.idle.append(connection)
        while len(self.idle) > MAX_IDLE_PER_ENGINE:
            self.idle.popleft().close()

    def close(self) -> None:
        while self.idle:
            self.idle.pop().close()


class Upstreams:
    """The pools, one per engine base URL (`http://host:port`), for one event loop."""

    def __init__(self, *, connect_timeout_s: float, read_timeout_s: float) -> None:
        self.connect_timeout_s = connect_timeout_s
        self.read_timeout_s = read_timeout_s
        self._pools: dict[str, _Pool] = {}

    def _pool(self, base_url: str) -> _Pool:
        pool = self._pools.get(base_url)
        if pool is None:
            where = urlsplit(base_url)
            if where.scheme != "http" or not where.hostname:
                raise UpstreamError(f"engine URL {base_url!r} is not http://host:port")
            pool = self._pools[base_url] = _Pool(where.hostname, where.port or 80)
        return pool

    async def send(
        self, base_url: str, method: str, target: str, headers: Headers, body: bytes
    ) -> Answer:
        """Send one request (`target`: path and query) and read the answer's head."""
        pool = self._pool(base_url)
        head = _request_head(method, target, pool, headers, len(body))
        connection = pool.take()
        if connection is not None:
            try:
                return await self._exchange(pool, connection, head, body, method)
            except _NotTaken:
                pass  # closed by the engine as we reused it: once more on a new connection
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                reader, writer = await asyncio.open_connection(
                    pool.host, pool.port, limit=HEAD_LIMIT_BYTES
                )
        except (OSError, TimeoutError) as err:
            raise Unreachable(f"cannot connect to {base_url}: {err!r}") from err
        try:
            return await self._exchange(pool, _Connection(reader, writer), head, body, method)
        except _NotTaken as err:
            raise UpstreamError(f"{base_url} closed the connection: {err.__cause__!r}") from err

    async def _exchange(
        self, pool: _Pool, connection: _Connection, head: bytes, body: bytes, method: str
    ) -> Answer:
        reader = connection.reader
        answered = False  # a byte of an answer came back: the engine took the request
        try:
            connection.writer.write(head + body if len(body) < 65536 else head)
            if len(body) >= 65536:
                connection.writer.write(body)
            async with asyncio.timeout(self.read_timeout_s):
                answer = None
                while answer is None:  # past interim (1xx) answers
                    raw = await reader.readuntil(b"\r\n\r\n")
                    answered = True
                    answer = _answer(raw, connection, pool, method)
                length = answer.content_length
                if length is not None and length <= WHOLE_LIMIT_BYTES:
                    answer.keep_whole(await reader.readexactly(length))
            return answer
        except asyncio.IncompleteReadError as err:
            connection.close()
            if answered:
                raise UpstreamError("the engine closed the connection mid-answer") from err
            if not err.partial:
                raise _NotTaken from err
            raise UpstreamError(f"the engine broke off its answer: {err.partial[:80]!r}") from err
        except (ConnectionResetError, BrokenPipeError) as err:
            connection.close()
            if answered:
                raise UpstreamError(f"the engine broke off its answer: {err!r}") from err
            raise _NotTaken from err
        except asyncio.LimitOverrunError as err:
            connection.close()
            raise UpstreamError(
                f"the engine's answer head is over {HEAD_LIMIT_BYTES // 1024} KiB"
            ) from err
        except (OSError, TimeoutError) as err:
            connection.close()
            raise UpstreamError(f"the engine did not answer: {err!r}") from err
        except UpstreamError:
            connection.close()
            raise

    async def aclose(self) -> None:
        for pool in self._pools.values():
            pool.close()
        self._pools.clear()


class _NotTaken(Exception):
    """The connection was closed before the engine answered a byte."""


def _request_head(method: str, target: str, pool: _Pool, headers: Headers, length: int) -> bytes:
    lines = [f"{method} {target} HTTP/1.1\r\n".encode("latin-1")]
    lines.append(b"host: %s:%d\r\n" % (pool.host.encode("idna"), pool.port))
    lines.extend(b"%s: %s\r\n" % (name, value) for name, value in headers)
    lines.append(b"content-length: %d\r\n\r\n" % length)
    return b"".join(lines)


def _answer(raw: bytes, connection: _Connection, pool: _Pool, method: str) -> Answer | None:
    """The answer a head announces; None for an interim (1xx) one, which a final answer
    follows. Raises UpstreamError for a head that is not HTTP/1.x."""
    lines = raw[:-4].split(b"\r\n")
    first = _STATUS_LINE.fullmatch(lines[0])
    if first is None:
        raise UpstreamError(f"not an HTTP/1.x answer: {lines[0][:80]!r}")
    status = int(first[2])
    if status < 200:
        return None  # 103 Early Hints and the like (nothing here asks for 100 or 101)
    headers: Headers = []
    content_length: int | None = None
    encoded = chunked = False
    reusable = first[1] == b"1"
    for line in lines[1:]:
        header = _HEADER_LINE.fullmatch(line)
        if header is None:
            raise UpstreamError(f"bad header line in the engine's answer: {line[:80]!r}")
        name, value = header[1].lower(), header[2].strip(b" \t")
        if name == b"content-length":
            if not value.isdigit() or content_length not in (None, int(value)):
                raise UpstreamError(f"bad content-length {value[:40]!r}")
            content_length = int(value)
        elif name == b"transfer-encoding":
            encoded, chunked = True, value.lower().endswith(b"chunked")
        elif name == b"connection" and b"close" in value.lower():
            reusable = False
        headers.append((name, value))
    if encoded and content_length is not None:
        raise UpstreamError("the engine's answer has both content-length and transfer-encoding")
    if method == "HEAD" or status in _NO_BODY_STATUS:
        content_length, chunked = 0, False
    elif content_length is None and not chunked:
        reusable = False  # the body ends when the engine closes
    return Answer(
        status=status,
        headers=headers,
        content_length=content_length,
        chunked=chunked,
        connection=connection,
        pool=pool if reusable else None,
    )
