"""An engine's log writer: the process that reads the engine's stdout and stderr through a
pipe and appends them to `engine.log` within its cap (`logfile.CappedLog`), so the cap holds
whatever rate the engine writes at. The spawner starts one beside each engine (`start`)::

    python -m cohabit.runtime.logwriter LOG --max-bytes N --backups K   # the pipe on stdin

It runs in a session of its own, like the engine, so both outlive a control plane that
exits (`--keep-engines`, a crash) and the engine keeps a reader for its output. It ignores
the signals that stop engines and ends when the pipe does — when every process holding the
engine's output has exited — having written everything they said.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from cohabit.runtime.logfile import CappedLog

MODULE = "cohabit.runtime.logwriter"
_READ_BYTES = 64 * 1024  # a pipe's default capacity on Linux


def start(
    log_path: Path, *, max_bytes: int, backups: int, env: Mapping[str, str], cwd: Path
) -> tuple[subprocess.Popen[bytes], int]:
    """Start the writer of `log_path`; returns it and the pipe's write end, to be the
    engine's stdout and stderr. The caller closes that end once the engine has it (the
    writer ends only when nobody holds it). Raises OSError when the writer cannot start."""
    read_end, write_end = os.pipe()
    try:
        writer = subprocess.Popen(
            [
                sys.executable,
                "-m",
                MODULE,
                str(log_path.absolute()),
                "--max-bytes",
                str(max_bytes),
                "--backups",
                str(backups),
            ],
            stdin=read_end,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
        )
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return writer, write_end


def copy(source_fd: int, log: CappedLog) -> None:
    """Copy everything readable from `source_fd` into `log` until end of file."""
    while chunk := os.read(source_fd, _READ_BYTES):
        log.write(chunk)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=MODULE, description=__doc__)
    parser.add_argument("log", type=Path)
    parser.add_argument("--max-bytes", type=int, required=True)
    parser.add_argument("--backups", type=int, required=True)
    args = parser.parse_args(argv)
    if args.max_bytes < 1 or args.backups < 0:
        parser.error("--max-bytes must be at least 1 and --backups at least 0")
    # The engine's group is signalled to stop it; this process is in another group, but a
    # terminal's Ctrl-C or a hang-up must not cut the log short either.
    for stop in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(stop, signal.SIG_IGN)
    log = CappedLog(args.log, max_bytes=args.max_bytes, backups=args.backups)
    try:
        copy(sys.stdin.fileno(), log)
    finally:
        log.close()


if __name__ == "__main__":
    main()
