"""A server process for the multi-process tests: the real app on 127.0.0.1 with the scripted
runtime double — or, with --fake-engines, the real LocalRuntime running fake engine processes
(tests/e2e/fake_service.py) — against the database given. Prints `PORT <n>` once it listens.

    python -m tests.service.worker DATABASE_URL DATA_DIR [--ready-after N] [--lease-s S]
                                   [--fake-engines] [--zygote]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
from pathlib import Path
from typing import NoReturn

import uvicorn

from cohabit.hardware.model import Fleet, Gpu, Node, Vendor
from cohabit.runtime.interface import EngineRuntime
from cohabit.runtime.spawner import LocalRuntime
from cohabit.service.app import Backend, create_app
from cohabit.service.settings import Settings
from cohabit.units import GIB
from tests.e2e.fake_service import fake_llamacpp
from tests.service.scripted_runtime import Script, ScriptedRuntime

# Two nodes of two 16 GiB cards each: 64 GiB in four budgets.
SMALL_FLEET = Fleet(
    nodes=tuple(
        Node(
            name=f"node-{n}",
            gpus=tuple(
                Gpu(index=i, vendor=Vendor.NVIDIA, product="Tesla T4", memory_bytes=16 * GIB)
                for i in range(2)
            ),
        )
        for n in "ab"
    )
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("database_url")
    parser.add_argument("data_dir", type=Path)
    parser.add_argument("--ready-after", type=int, default=1)
    parser.add_argument("--lease-s", type=float, default=5.0)
    parser.add_argument("--fake-engines", action="store_true")
    parser.add_argument("--zygote", action="store_true")
    args = parser.parse_args()
    if args.zygote:
        zygote(args)
    # IPPROTO_TCP, not 0: asyncio turns Nagle off only on sockets that say they are TCP, and
    # Nagle against delayed ACKs holds every small keep-alive answer back ~40 ms.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    serve(args, sock)


def serve(args: argparse.Namespace, sock: socket.socket) -> NoReturn:
    settings = Settings(
        data_dir=args.data_dir,
        database_url=args.database_url,
        poll_interval_s=0.05,
        lease_s=args.lease_s,
    )
    runtime: EngineRuntime = ScriptedRuntime(Script(ready_after_polls=args.ready_after))
    if args.fake_engines:
        runtime = LocalRuntime(
            args.data_dir, stop_grace_s=3.0, launchers={"llamacpp": fake_llamacpp}
        )
    app = create_app(settings, Backend(runtime=runtime, fleet=SMALL_FLEET))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    server.run(sockets=[sock])
    sys.exit(0)


def zygote(args: argparse.Namespace) -> NoReturn:
    """With --zygote: everything is imported once, then each line `fork` on stdin forks a
    fresh server (answered `PID <pid> PORT <port>`), so a crash test can SIGKILL and restart
    the server many times without paying for the imports each time. Exits at end of input."""
    for line in sys.stdin:
        if line.strip() != "fork":
            continue
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.bind(("127.0.0.1", 0))
        pid = os.fork()
        if pid == 0:
            sys.stdin.close()
            serve(args, sock)
        print(f"PID {pid} PORT {sock.getsockname()[1]}", flush=True)
        sock.close()
        with contextlib.suppress(ChildProcessError):
            while os.waitpid(-1, os.WNOHANG)[0] > 0:  # reap the servers killed so far
                pass
    sys.exit(0)


if __name__ == "__main__":
    main()
