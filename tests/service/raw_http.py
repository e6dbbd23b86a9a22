"""HTTP/1.1 over a raw loopback socket, for tests that must send what a client library would
not: a head without its body, a body that never ends, half a head. The answer is read with
the standard library's parser while a thread sends, so a server that answers before it has
read everything is heard."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True, kw_only=True)
class Answer:
    status: int
    headers: dict[str, str]  # lower-case names
    body: Any  # parsed JSON


def head(method: str, path: str, *headers: str) -> bytes:
    """A request head to 127.0.0.1 with `headers` ("Name: value")."""
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def exchange(
    address: tuple[str, int],
    sent_head: bytes,
    pieces: Iterable[bytes] = (),
    *,
    timeout_s: float = 10,
) -> Answer:
    """Send `sent_head`, then `pieces` from a thread until done or the server closes the
    connection; the answer."""
    with socket.create_connection(address, timeout=timeout_s) as sock:
        sock.sendall(sent_head)
        sender = threading.Thread(target=_send_quietly, args=(sock, pieces), daemon=True)
        sender.start()
        try:
            return read_answer(sock)
        finally:
            sender.join(timeout_s)


def read_answer(sock: socket.socket) -> Answer:
    response = http.client.HTTPResponse(sock)
    try:
        response.begin()
        headers = {name.lower(): value for name, value in response.getheaders()}
        return Answer(status=response.status, headers=headers, body=json.loads(response.read()))
    finally:
        response.close()


def chunked(pieces: Iterable[bytes]) -> Iterable[bytes]:
    """`pieces` as chunks of a chunked body, without its last (empty) chunk."""
    for piece in pieces:
        yield b"%x\r\n%s\r\n" % (len(piece), piece)


def _send_quietly(sock: socket.socket, pieces: Iterable[bytes]) -> None:
    try:
        for piece in pieces:
            sock.sendall(piece)
    except OSError:
        pass  # the server stopped reading and closed the connection
