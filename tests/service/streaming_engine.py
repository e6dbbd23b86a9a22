"""A stand-in for llama.cpp's `llama-server` that streams without end: it takes the options the
llama.cpp launcher passes (and refuses others, as the real one does), answers /health and
/v1/models, and answers a streamed chat completion with SSE chunks, as llama-server writes
them, until its caller stops reading or goes away — the engine a caller that never reads
keeps busy. Non-streamed chats answer at once. It ends by itself after --lifetime seconds.

    python tests/service/streaming_engine.py --model M --alias A --host H --port P
                                             --ctx-size N --n-gpu-layers N [--lifetime S]
"""

from __future__ import annotations

import argparse
import http.server
import json
import threading

CHUNK = {"choices": [{"index": 0, "delta": {"content": "x" * 512}, "finish_reason": None}]}
EVENT = b"data: " + json.dumps(CHUNK).encode() + b"\n\n"


class Engine(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        if self.path not in ("/health", "/v1/models"):
            self.send_error(404)
            return
        self._json({"object": "list", "data": [{"id": "stand-in"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        if not body.get("stream"):
            message = {"role": "assistant", "content": "x"}
            self._json({"object": "chat.completion", "choices": [{"message": message}]})
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        chunk = b"%x\r\n%s\r\n" % (len(EVENT), EVENT)
        try:
            while True:
                self.wfile.write(chunk)  # blocks once the caller's side stops reading
        except OSError:
            self.close_connection = True

    def _json(self, data: dict[str, object]) -> None:
        payload = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: object) -> None:
        del format, args


def main() -> None:
    parser = argparse.ArgumentParser(prog="llama-server")
    for option in ("--model", "--alias", "--host", "--ctx-size", "--n-gpu-layers"):
        parser.add_argument(option, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--lifetime", type=float, default=120.0)
    args = parser.parse_args()
    server = http.server.ThreadingHTTPServer((args.host, args.port), Engine)
    server.daemon_threads = True
    threading.Timer(args.lifetime, server.shutdown).start()
    server.serve_forever()


if __name__ == "__main__":
    main()
