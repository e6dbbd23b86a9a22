"""How `cohabit serve` runs the app under uvicorn: `server_options(settings, open_files=…)`, the
options it hands `uvicorn.run`, with `guarded_protocol`, uvicorn's httptools protocol plus
what uvicorn lacks — deadlines on each request's head and body, a size limit on its head,
and a cap on the connections held open that keeps descriptors in reserve; and
`raise_open_files_limit`, run first.

Checked against uvicorn 0.55 (protocols/http/httptools_impl.py, config.py, server.py):
`timeout_keep_alive` is armed only once a response is complete, so a connection that sends
nothing, or half a head, is held for ever; `limit_concurrency` answers 503 once a head is
complete, so it does nothing for connections whose head never is;
`h11_max_incomplete_event_size` bounds heads for h11 alone, and httptools buffers a head
(`on_url`, `on_header`) without a limit. `timeout_graceful_shutdown` is uvicorn's own: once it
runs out, the requests still going (a stream its caller never reads) are cancelled and the
shutdown goes on to the app's lifespan, which stops the engines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import resource
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from cohabit.service.settings import Settings

# Descriptors kept for everything but client connections: the event loop, the database's
# connections, engines' logs and pipes, the gateway's idle engine connections.
RESERVED_FILES = 256
HEAD_LIMIT_BYTES = 64 * 1024  # a request's line and headers (uvicorn's h11 default: 16 KiB)
RETRY_AFTER_S = 1
_LINUX_NR_OPEN = 1 << 20  # what a soft limit may reach when the hard one is unlimited


def raise_open_files_limit() -> int:
    """Raise this process's soft RLIMIT_NOFILE to its hard limit (a soft limit of 1024 under a
    far higher hard one is common) and return the soft limit in force. A limit that cannot be
    raised is left as it is."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = _LINUX_NR_OPEN if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < wanted:
        # macOS caps the soft limit lower (kern.maxfilesperproc): then keep what we have.
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def connection_cap(max_connections: int, open_files: int) -> int:
    """How many connections are held open at once: `max_connections`, or fewer when the
    open-files limit leaves less once `RESERVED_FILES` are kept back — halved, since a
    request the gateway proxies holds an engine connection beside its caller's.

    >>> connection_cap(4096, 1024), connection_cap(4096, 1_048_576)
    (384, 4096)
    """
    return max(8, min(max_connections, (open_files - RESERVED_FILES) // 2))


def server_options(settings: Settings, *, open_files: int) -> dict[str, Any]:
    """uvicorn's options (uvicorn/config.py `Config`) for the app, beside host, port and
    logging; `open_files` is the soft open-files limit in force (`raise_open_files_limit`)."""
    return {
        "http": guarded_protocol(
            head_timeout_s=settings.head_timeout_s,
            body_timeout_s=settings.body_timeout_s,
            max_connections=connection_cap(settings.max_connections, open_files),
        ),
        # The C HTTP parser and event loop: with uvicorn's pure-Python h11 and asyncio's loop,
        # parsing and scheduling were most of what the gateway adds to a request
        # (docs/benchmarks.md#gateway).
        "loop": "uvloop",
        # The app serves no WebSocket; an upgraded connection would leave the guard's count
        # (httptools_impl.py `handle_websocket_upgrade` hands it to another protocol).
        "ws": "none",
        "timeout_keep_alive": settings.keep_alive_s,
        "timeout_graceful_shutdown": settings.shutdown_timeout_s,
    }


class ConnectionGuard:
    """One server's open connections, and of them those waiting for a request head (new,
    or idle between two requests), the longest waiting first."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.open: set[GuardedHttpTools] = set()
        self.waiting: dict[GuardedHttpTools, None] = {}  # insertion order: oldest first

    def forget(self, connection: GuardedHttpTools) -> None:
        self.open.discard(connection)
        self.waiting.pop(connection, None)


class GuardedHttpTools(HttpToolsProtocol):
    """uvicorn's httptools protocol with deadlines on each request's head (`head_timeout_s`,
    from the connection's opening or the first byte of a kept connection's next request)
    and body (`body_timeout_s`, once the head has come), a size limit on its head
    (`HEAD_LIMIT_BYTES`), and the server's connections held to `guard.cap`.

    A head past its deadline closes the connection; a body past its deadline is answered
    408 (when no answer has begun) and closed. A new connection past the cap closes the one
    that has waited longest for a head (a half-sent head, or an idle keep-alive connection
    its client will replace), so connections that never finish a head cannot shut others
    out; when every connection is inside a request, the new one is answered 503 and closed.
    A request whose head and body came in one read, the usual case, arms no timer.
    `guarded_protocol` makes the subclass one server uses."""

    guard: ClassVar[ConnectionGuard]
    head_timeout_s: ClassVar[float]
    body_timeout_s: ClassVar[float]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None  # the head's or the body's
        self._in_head = True  # between requests, waiting for (the rest of) a head
        self._head_bytes = 0  # of the head being received
        self._head_tail = b""  # its last bytes, up to 3
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        guard = self.guard
        if len(guard.open) >= guard.cap:
            oldest = next(iter(guard.waiting), None)
            if oldest is None:
                self._refuse(
                    503,
                    f"the server holds the most connections it takes ({guard.cap}), all of "
                    "them busy; retry in a moment",
                )
                return
            oldest.drop()
        guard.open.add(self)
        guard.waiting[self] = None
        self._arm(self.head_timeout_s)  # a connection that sends nothing is a late head too

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.guard.forget(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._in_head and self._head_size(data) > HEAD_LIMIT_BYTES:
            self._refuse(431, f"the request head is over {HEAD_LIMIT_BYTES // 1024} KiB")
            return
        super().data_received(data)
        if self._deadline is None and not self.transport.is_closing():
            if self._in_head:
                self._arm(self.head_timeout_s)  # a kept connection's next head has begun
            elif self.cycle is not None and self.cycle.more_body:
                self._arm(self.body_timeout_s)  # the head came, the body is on its way

    def _head_size(self, data: bytes) -> int:
        """The head's size so far with `data`, up to its blank line when `data` holds it;
        counted before the parser sees `data`, which keeps a head it has not finished."""
        tail = self._head_tail
        window = tail + data if tail else data
        end = window.find(b"\r\n\r\n")
        if end >= 0:
            return self._head_bytes - len(tail) + end + 4
        self._head_bytes += len(data)
        self._head_tail = window[-3:]  # a blank line may straddle two reads
        return self._head_bytes

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = 0
        self._head_tail = b""
        self._disarm()
        self.guard.waiting.pop(self, None)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()
        if self.cycle is not None and self.cycle.response_complete:
            self._await_next_head()  # the rest of a body answered before it was read

    def on_response_complete(self) -> None:
        super().on_response_complete()
        cycle = self.cycle
        if cycle is None or (cycle.response_complete and not cycle.more_body):
            self._await_next_head()

    def _await_next_head(self) -> None:
        if not self.transport.is_closing():
            self._in_head = True
            self.guard.waiting[self] = None  # now the most recent to wait

    def drop(self) -> None:
        """Close this connection (waiting for a head) to make room for another."""
        self._disarm()
        self.guard.forget(self)
        self.transport.close()

    def _arm(self, timeout_s: float) -> None:
        self._deadline = self.loop.call_later(timeout_s, self._late)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _late(self) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self._in_head:
            self.drop()
        elif self.cycle is not None and not self.cycle.response_started:
            self._refuse(408, f"the request body did not arrive within {self.body_timeout_s:g} s")
        else:
            self.transport.close()  # answered already; the rest of its body will not come

    def _refuse(self, status_code: int, message: str) -> None:
        """Answer `{"detail": message}` and close, before the request was read whole."""
        self._refused = True
        self._disarm()
        self.guard.forget(self)
        body = json.dumps({"detail": message}).encode()
        head = [
            b"HTTP/1.1 %d %s\r\n" % (status_code, _REASONS[status_code]),
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n",
        ]
        if status_code == 503:
            head.append(b"retry-after: %d\r\n" % RETRY_AFTER_S)
        self.transport.write(b"".join(head) + b"\r\n" + body)
        self.transport.close()


_REASONS = {
    408: b"Request Timeout",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}


def guarded_protocol(
    *, head_timeout_s: float, body_timeout_s: float, max_connections: int
) -> type[GuardedHttpTools]:
    """The protocol class for one server (uvicorn's `http` option takes a class): its
    deadlines, and its own guard holding at most `max_connections`."""
    head_s, body_s, guard = head_timeout_s, body_timeout_s, ConnectionGuard(max_connections)

    class ServerProtocol(GuardedHttpTools):
        pass

    ServerProtocol.guard = guard
    ServerProtocol.head_timeout_s = head_s
    ServerProtocol.body_timeout_s = body_s
    return ServerProtocol
