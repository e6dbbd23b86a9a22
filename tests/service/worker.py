"""A server process for the multi-process tests: the real app on 127.0.0.1 with the scripted
runtime double, against the database given. Prints `PORT <n>` once it listens.

    python -m tests.service.worker DATABASE_URL DATA_DIR [--ready-after N] [--lease-s S]
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

import uvicorn

from cohabit.hardware.model import Fleet, Gpu, Node, Vendor
from cohabit.service.app import create_app
from cohabit.service.settings import Settings
from cohabit.units import GIB
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
    args = parser.parse_args()
    settings = Settings(
        data_dir=args.data_dir,
        database_url=args.database_url,
        poll_interval_s=0.05,
        lease_s=args.lease_s,
    )
    runtime = ScriptedRuntime(Script(ready_after_polls=args.ready_after))
    app = create_app(settings, runtime=runtime, fleet=SMALL_FLEET)
    # IPPROTO_TCP, not 0: asyncio turns Nagle off only on sockets that say they are TCP, and
    # Nagle against delayed ACKs holds every small keep-alive answer back ~40 ms.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    print(f"PORT {sock.getsockname()[1]}", flush=True)
    server.run(sockets=[sock])
    sys.exit(0)


if __name__ == "__main__":
    main()
