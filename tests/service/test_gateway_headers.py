"""Which headers the gateway passes, over real HTTP (the app on a loopback port, SQLite) to a
stand-in engine in this process that records the headers it receives and answers with
hop-by-hop headers, CORS headers and a cookie, as an engine behind a proxy may: hop-by-hop
headers (RFC 9110 §7.6.1: Connection and the fields it names, Keep-Alive, Proxy-*, TE,
Trailer, Transfer-Encoding, Upgrade) go neither way, the engine's CORS headers and cookies
never reach the caller (cohabit sends none), and end-to-end headers pass both ways. Raw
sockets on the caller's side, so the exact headers are sent and seen."""

from __future__ import annotations

import http.client
import http.server
import json
import socket
import socketserver
import threading
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.service.test_gateway import _settings, deployed, serve

# What an engine behind a misconfigured proxy, or one with CORS switched on, answers with.
ENGINE_HEADERS = (
    ("Connection", "X-Engine-Hop"),
    ("X-Engine-Hop", "1"),
    ("Keep-Alive", "timeout=5, max=100"),
    ("Proxy-Authenticate", 'Basic realm="engine"'),
    ("Proxy-Connection", "keep-alive"),
    ("Trailer", "X-Checksum"),
    ("Upgrade", "h2c"),
    ("Access-Control-Allow-Origin", "*"),
    ("Access-Control-Allow-Credentials", "true"),
    ("Access-Control-Expose-Headers", "X-Engine"),
    ("Set-Cookie", "session=abc; Path=/"),
    ("X-Engine", "kept"),
)
CALLER_HEADERS = (
    "Connection: keep-alive, X-Hop",
    "X-Hop: secret",
    "Keep-Alive: timeout=5",
    "Proxy-Authorization: Basic eDp5",
    "Proxy-Connection: keep-alive",
    "TE: trailers",
    "Trailer: X-Checksum",
    "Upgrade: h2c",
    "X-Caller: kept",
)
HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
}


class _Engine(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: HeaderEngine

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.server.received.append({name.lower() for name in self.headers})
        self.send_response(200)
        for name, value in ENGINE_HEADERS:
            self.send_header(name, value)
        if body.get("stream"):
            event = b'data: {"choices": [{"delta": {"content": "x"}}]}\n\ndata: [DONE]\n\n'
            self.send_header("content-type", "text/event-stream")
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            self.wfile.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(event), event))
            return
        payload = b'{"object": "chat.completion", "choices": []}'
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        del format, args


class HeaderEngine(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Engine)
        self.received: list[set[str]] = []  # the header names of each request

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def engine() -> Iterator[HeaderEngine]:
    server = HeaderEngine()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_hop_by_hop_headers_cookies_and_cors_do_not_pass_the_gateway(
    tmp_path: Path, engine: HeaderEngine, stream: bool
) -> None:
    database_url = f"sqlite:///{tmp_path / 'c.db'}"  # the store plays no part here
    with serve(_settings(tmp_path, database_url), engine) as served:  # type: ignore[arg-type]
        deployment_id = deployed(served, "tiny", tmp_path)
        where = urlsplit(served.root)
        body = json.dumps({"model": "tiny", "messages": [], "stream": stream}).encode()
        for path in (
            "/v1/chat/completions",
            f"/runtime/models/{deployment_id}/v1/chat/completions",
        ):
            head = [
                f"POST {path} HTTP/1.1",
                "Host: 127.0.0.1",
                "Content-Type: application/json",
                f"Content-Length: {len(body)}",
                *CALLER_HEADERS,
            ]
            assert where.hostname is not None and where.port is not None
            with socket.create_connection((where.hostname, where.port), timeout=30) as sock:
                sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
                answer = http.client.HTTPResponse(sock)
                answer.begin()
                relayed = {name.lower(): value for name, value in answer.getheaders()}
                answer.read()
            assert answer.status == 200
            assert relayed["x-engine"] == "kept"
            leaked = set(relayed) & (HOP_BY_HOP | {"x-engine-hop", "set-cookie"})
            # uvicorn writes its own Connection only to say it closes; ours stays open.
            assert not leaked, relayed
            assert not [name for name in relayed if name.startswith("access-control-")]
            received = engine.received[-1]
            assert "x-caller" in received
            assert not received & (HOP_BY_HOP | {"x-hop"}), received
    assert len(engine.received) == 2
