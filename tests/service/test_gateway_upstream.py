"""The gateway's engine client (service/gateway/upstream.py) over real loopback sockets, against an
engine played by a script in the same event loop: each test says what the engine writes,
in which pieces and when, so a chunk can be split across reads anywhere, a connection closed
while it sits idle in the pool or at the moment it is reused, and an answer garbled."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from cohabit.service.gateway.upstream import (
    HEAD_LIMIT_BYTES,
    WHOLE_LIMIT_BYTES,
    Answer,
    UpstreamError,
    Upstreams,
)

JSON_ANSWER = b'{"usage": {"completion_tokens": 1}}'
# What llama-cpp-python's server (uvicorn) writes for a non-streamed completion.
OK_HEAD = (
    b"HTTP/1.1 200 OK\r\ndate: Tue, 01 Dec 2026 06:00:00 GMT\r\nserver: uvicorn\r\n"
    b"content-length: %d\r\ncontent-type: application/json\r\n\r\n" % len(JSON_ANSWER)
)
# A streamed one: SSE events in chunks, one with an extension, and a trailer after the end.
SSE = [b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n', b"data: [DONE]\n\n"]
CHUNKED = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    + b"%x\r\n%s\r\n" % (len(SSE[0]), SSE[0])
    + b"%x;note=last\r\n%s\r\n" % (len(SSE[1]), SSE[1])
    + b"0\r\nx-trailer: 1\r\n\r\n"
)

Script = Callable[["Engine", asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class Engine:
    """The scripted engine's counts: the requests it read, the connections it accepted."""

    url: str = ""
    connections: int = 0
    requests: int = 0

    async def read_request(self, reader: asyncio.StreamReader) -> bool:
        """Read one request (head and Content-Length body); False at the connection's end."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        lines = head.lower().split(b"\r\n")
        length = next((int(h[15:]) for h in lines if h.startswith(b"content-length:")), 0)
        await reader.readexactly(length)
        self.requests += 1
        return True


@asynccontextmanager
async def engine(script: Script) -> AsyncIterator[Engine]:
    """An engine serving each connection with `script(engine, reader, writer)`."""
    played = Engine()
    serving: set[asyncio.Task[Any]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            serving.add(task)
        played.connections += 1
        try:
            await script(played, reader, writer)
        except ConnectionError:
            pass  # the client closed first, as after a garbled answer
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    played.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield played
    finally:
        server.close()
        await server.wait_closed()
        if serving:  # each script ends as its client closes the connection
            await asyncio.wait(serving, timeout=5)


async def chat(upstreams: Upstreams, url: str) -> Answer:
    return await upstreams.send(url, "POST", "/v1/chat/completions", [], b"{}")


async def post(upstreams: Upstreams, url: str) -> tuple[Answer, bytes]:
    """A chat request and its answer's whole body."""
    answer = await chat(upstreams, url)
    return answer, b"".join([piece async for piece in answer.body(5.0)])


def run(script: Script, test: Callable[[Upstreams, Engine], Awaitable[None]]) -> None:
    """`test(upstreams, engine)` in a fresh event loop, against an engine playing `script`."""

    async def main() -> None:
        upstreams = Upstreams(connect_timeout_s=5.0, read_timeout_s=5.0)
        async with engine(script) as played:
            try:
                await test(upstreams, played)
            finally:
                await upstreams.aclose()

    asyncio.run(main())


def answering(*pieces: bytes, pause_s: float = 0.0) -> Script:
    """An engine answering every request on a connection with `pieces`, written one by one
    with `pause_s` between them (each then reaches the client in a read of its own)."""

    async def script(
        engine: Engine, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while await engine.read_request(reader):
            for piece in pieces:
                writer.write(piece)
                await writer.drain()
                if pause_s:
                    await asyncio.sleep(pause_s)

    return script


def split(data: bytes, at: tuple[int, ...]) -> list[bytes]:
    edges = (0, *at, len(data))
    return [data[a:b] for a, b in itertools.pairwise(edges)]


_SIZE_LINE = CHUNKED.index(b"\r\n\r\n") + 4  # where the first chunk's size line starts


@pytest.mark.parametrize(
    "at",
    [
        pytest.param((_SIZE_LINE + 1,), id="inside a size line"),
        pytest.param((_SIZE_LINE + 3,), id="between a size line's CR and LF"),
        pytest.param((_SIZE_LINE + 10,), id="inside a chunk's data"),
        pytest.param((len(CHUNKED) - 20, len(CHUNKED) - 3), id="in the trailers"),
        pytest.param(tuple(range(1, len(CHUNKED))), id="every byte apart"),
    ],
)
def test_a_chunked_stream_split_anywhere_across_reads_comes_out_whole(at: tuple[int, ...]) -> None:
    async def test(upstreams: Upstreams, played: Engine) -> None:
        for _ in range(2):
            answer, body = await post(upstreams, played.url)
            assert (answer.status, answer.whole, body) == (200, None, b"".join(SSE))
        assert (played.requests, played.connections) == (2, 1)  # read to its end: reused

    run(answering(*split(CHUNKED, at), pause_s=0.002), test)


def test_a_small_answer_comes_whole_with_its_head_and_frees_its_connection_at_once() -> None:
    async def test(upstreams: Upstreams, played: Engine) -> None:
        first = await chat(upstreams, played.url)
        assert first.whole == JSON_ANSWER
        # Its body not even iterated, the connection is already back for the next one.
        second, body = await post(upstreams, played.url)
        assert (second.whole, body, played.connections) == (JSON_ANSWER, JSON_ANSWER, 1)
        assert b"".join([piece async for piece in first.body(5.0)]) == JSON_ANSWER

    run(answering(OK_HEAD, JSON_ANSWER, pause_s=0.01), test)


def test_a_large_answer_passes_through_in_pieces_and_its_connection_is_reused() -> None:
    data = bytes(range(256)) * (WHOLE_LIMIT_BYTES // 256 * 2)
    head = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % len(data)

    async def test(upstreams: Upstreams, played: Engine) -> None:
        for _ in range(2):
            answer, body = await post(upstreams, played.url)
            assert (answer.whole, answer.content_length, body) == (None, len(data), data)
        assert played.connections == 1

    run(answering(head, data), test)


def test_a_pooled_connection_the_engine_closed_while_idle_is_not_used() -> None:
    """uvicorn closes a keep-alive connection idle for 5 s; here the engine closes each one
    right after its first answer, before the next request comes."""

    async def script(
        engine: Engine, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await engine.read_request(reader)
        writer.write(OK_HEAD + JSON_ANSWER)
        await writer.drain()

    async def test(upstreams: Upstreams, played: Engine) -> None:
        for _ in range(3):
            answer, body = await post(upstreams, played.url)
            assert (answer.status, body) == (200, JSON_ANSWER)
            await asyncio.sleep(0.05)  # the engine's close reaches the pool
        assert (played.requests, played.connections) == (3, 3)

    run(script, test)


def test_a_pooled_connection_closed_as_it_is_reused_is_retried_once_on_a_new_one() -> None:
    """The engine reads the next request on a kept connection and closes it without a byte
    of answer (its keep-alive timeout struck as the request came): the engine did not take
    the request, so it goes again on a new connection, and the caller sees a plain 200."""

    async def script(
        engine: Engine, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await engine.read_request(reader)
        writer.write(OK_HEAD + JSON_ANSWER)
        await writer.drain()
        await engine.read_request(reader)  # and close: not answered

    async def test(upstreams: Upstreams, played: Engine) -> None:
        for _ in range(2):
            answer, body = await post(upstreams, played.url)
            assert (answer.status, body) == (200, JSON_ANSWER)
        assert (played.requests, played.connections) == (3, 2)

    run(script, test)


def test_an_answer_broken_off_after_its_first_byte_is_not_sent_again() -> None:
    """Once a byte of an answer came back the engine took the request (a generation may have
    run): no second try, an error naming what came."""

    async def script(
        engine: Engine, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        await engine.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-le")

    async def test(upstreams: Upstreams, played: Engine) -> None:
        with pytest.raises(UpstreamError, match=r"broke off its answer: b'HTTP/1.1 200 OK"):
            await chat(upstreams, played.url)
        assert (played.requests, played.connections) == (1, 1)

    run(script, test)


def test_interim_answers_are_passed_over_for_the_final_one() -> None:
    early_hints = b"HTTP/1.1 103 Early Hints\r\nlink: </a>; rel=preload\r\n\r\n"

    async def test(upstreams: Upstreams, played: Engine) -> None:
        answer, body = await post(upstreams, played.url)
        assert (answer.status, body) == (200, JSON_ANSWER)

    run(answering(early_hints, OK_HEAD + JSON_ANSWER), test)


@pytest.mark.parametrize(
    ("written", "message"),
    [
        (b"hello there\r\n\r\n", r"not an HTTP/1.x answer: b'hello there'"),
        (b"HTTP/2 200\r\n\r\n", r"not an HTTP/1.x answer: b'HTTP/2 200'"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", r"bad header line .*b'no colon here'"),
        (b"HTTP/1.1 200 OK\r\nbad name: 1\r\n\r\n", r"bad header line .*b'bad name: 1'"),
        (b"HTTP/1.1 200 OK\r\nx-a: 1\x01\r\n\r\n", r"bad header line .*x01"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: -5\r\n\r\n", r"bad content-length b'-5'"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n", r"b'2'"),
        (
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n",
            r"both content-length and transfer-encoding",
        ),
        (
            b"HTTP/1.1 200 OK\r\nx-big: " + b"a" * HEAD_LIMIT_BYTES + b"\r\n\r\n",
            r"head is over 64 KiB",
        ),
    ],
    ids=[
        "no status line",
        "not HTTP/1",
        "no colon",
        "space in a name",
        "control byte in a value",
        "negative length",
        "two lengths",
        "length and chunked",
        "head over the limit",
    ],
)
def test_a_garbled_head_is_an_error_naming_what_is_wrong(written: bytes, message: str) -> None:
    async def test(upstreams: Upstreams, played: Engine) -> None:
        with pytest.raises(UpstreamError, match=message):
            await chat(upstreams, played.url)
        assert played.requests == 1  # not sent again

    run(answering(written), test)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"zz\r\n", r"bad chunk size line b'zz\\r\\n'"),
        (b"-4\r\nabcd\r\n", r"bad chunk size line b'-4\\r\\n'"),
        (b"0x4\r\nabcd\r\n", r"bad chunk size line"),
        (b"2\r\nabcd\r\n0\r\n\r\n", r"a chunk runs past its size: b'cd'"),
    ],
    ids=["not hex", "negative", "0x prefix", "longer than its size"],
)
def test_a_garbled_chunked_body_ends_the_stream_with_an_error(body: bytes, message: str) -> None:
    head = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"

    async def test(upstreams: Upstreams, played: Engine) -> None:
        answer = await chat(upstreams, played.url)
        with pytest.raises(UpstreamError, match=message):
            async for _ in answer.body(5.0):
                pass
        # Its connection was closed, not pooled: the next request opens another.
        answer = await upstreams.send(played.url, "GET", "/v1/models", [], b"")
        answer.release()
        assert played.connections == 2

    run(answering(head + body), test)
