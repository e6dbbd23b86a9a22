"""The pre-imported launcher: one parked process per Python engine that has imported the
engine's modules and touched no device, and starts each engine of that kind as a fork of
itself, so a load skips the imports (llama-cpp-python's server: about 0.7 s of a 1 s start).

    python -m cohabit.runtime.forkserver CONTROL_FD MODULE [MODULE ...]

The parked process imports MODULEs, says it is ready on the control socket (a
SOCK_SEQPACKET socket pair, one message per request), then for each request receives the
engine's module, arguments, environment, folder and the file descriptor of its output (sent
with SCM_RIGHTS), forks, and answers the child's pid. The child leads a session of its own,
takes the output as stdout and stderr and /dev/null as stdin, moves to the engine's folder,
replaces its environment with the engine's and runs the module as `python -m` does
(`runpy.run_module(..., run_name="__main__", alter_sys=True)`); it never returns into the
loop. The parked process reaps its children as they exit (SIGCHLD, through a wake-up pipe)
and writes each one's exit code, as `subprocess.Popen.returncode` reads (negative for a
signal), into the file the request named, and ends when the control socket closes (the
server that started it is gone); the engines it started run on, like any other engine.

Nothing initialises a GPU before the fork: the modules are imported, never run (no model is
loaded and no device is asked for), and `device_handles` reads, from /proc, whether the
parked process holds any GPU device file open (a CUDA or ROCm context opens /dev/nvidia*
or /dev/kfd, /dev/dri); the spawner stops using a launcher that does. An engine's
environment may differ from the parked process's only in what its libraries read when it
selects devices, after the fork (`LATE_READ`); any other difference, a preloaded library
above all, starts the engine as a fresh process instead. `/proc/<pid>/environ` of a forked
engine shows the parked process's environment, which carries the runtime's marks but no
deployment: such an engine is marked by `process.FORKED_MARK` and known by its folder
(`runtime/process.py`).

The server side is `ForkServer`, which `spawner.LocalRuntime` holds, one per engine kind.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

# Read by the CUDA and ROCm runtimes when a device is first asked for, never at import:
# an engine may set them after the fork (CUDA Programming Guide, "CUDA Environment
# Variables"; ROCR-Runtime core/runtime/amd_filter_device.cpp).
LATE_READ = frozenset(
    {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"}
)
DEVICE_FILES = ("/dev/nvidia", "/dev/kfd", "/dev/dri/")
_MESSAGE_MAX = 1 << 20
READY_TIMEOUT_S = 60.0  # importing a big engine (vLLM, torch) on a loaded host


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """One engine to start: `python -m module *argv` in `cwd` with exactly `env`."""

    module: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str
    exit_file: str

    def encode(self) -> bytes:
        return json.dumps(
            {
                "module": self.module,
                "argv": list(self.argv),
                "env": dict(self.env),
                "cwd": self.cwd,
                "exit_file": self.exit_file,
            }
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> Request:
        body = json.loads(data)
        return cls(
            module=body["module"],
            argv=tuple(body["argv"]),
            env=body["env"],
            cwd=body["cwd"],
            exit_file=body["exit_file"],
        )


def device_handles(pid: int) -> list[str]:
    """The GPU device files process `pid` holds open (empty: no device context)."""
    found = []
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith(DEVICE_FILES):
                    found.append(target)
    return found


def read_exit(path: Path) -> int | None:
    """The exit code the parked process wrote for an engine, or None (not yet, or never)."""
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


# --- the parked process ----------------------------------------------------------------


def _run_child(request: Request, output: int) -> None:
    """In the forked child: become the engine; never returns."""
    code = 1
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        os.dup2(output, 1)
        os.dup2(output, 2)
        os.close(stdin)
        os.close(output)
        os.chdir(request.cwd)
        os.environ.clear()
        os.environ.update(request.env)
        sys.argv = [request.module, *request.argv]
        # The module runs afresh as `__main__`, as under `python -m`; what it imports stays.
        sys.modules.pop(request.module, None)
        sys.modules.pop(f"{request.module}.__main__", None)
        runpy.run_module(request.module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as exit:
        if exit.code is None:
            code = 0
        elif isinstance(exit.code, int):
            code = exit.code
        else:
            print(exit.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code & 0xFF)


def _reap(children: dict[int, str]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        exit_file = children.pop(pid, None)
        if exit_file is not None:
            with contextlib.suppress(OSError):
                partial = f"{exit_file}.partial"
                Path(partial).write_text(f"{os.waitstatus_to_exitcode(status)}\n")
                os.replace(partial, exit_file)


def serve(control_fd: int, modules: Sequence[str]) -> int:
    """The parked process's life: import, say ready, fork on request, reap; 0 at the end."""
    control = socket.socket(fileno=control_fd)
    for module in modules:
        importlib.import_module(module)
    children: dict[int, str] = {}
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    control.send(json.dumps({"ready": True, "pid": os.getpid()}).encode())
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ)
    selector.register(wake_read, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj == wake_read:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_read, 4096)
                continue
            data, fds, _, _ = socket.recv_fds(control, _MESSAGE_MAX, 1)
            if not data:
                return 0
            request = Request.decode(data)
            pid = os.fork()
            if pid == 0:
                selector.close()
                control.close()
                os.close(wake_read)
                os.close(wake_write)
                _run_child(request, fds[0])
            for fd in fds:
                os.close(fd)
            children[pid] = request.exit_file
            control.send(json.dumps({"pid": pid}).encode())
        _reap(children)


# --- the server's side -----------------------------------------------------------------


class ForkServerError(Exception):
    """The parked process could not start an engine (it died, or answered nonsense)."""


class ForkedProcess:
    """An engine forked by a parked process: what the spawner asks of a `Popen`. Its exit
    code comes from the file the parked process writes on reaping it; when that process is
    gone too (killed), an engine that ended has no code (`poll` says so with `ended`)."""

    def __init__(self, pid: int, exit_file: Path, server: ForkServer) -> None:
        self.pid = pid
        self.exit_file = exit_file
        self.server = server
        self.returncode: int | None = None
        self.ended = False

    def poll(self) -> int | None:
        if self.ended:
            return self.returncode
        code = read_exit(self.exit_file)
        if code is None and self.server.alive():
            return None  # running, or exited a moment ago and about to be reaped
        if code is None and _running(self.pid):
            return None
        self.returncode, self.ended = code, True
        return code

    def wait(self, timeout: float) -> int | None:
        deadline = time.monotonic() + timeout
        while True:
            code = self.poll()
            if self.ended:
                return code
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout)
            time.sleep(0.01)


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


class ForkServer:
    """One parked process for one engine kind, started by `start` and used once it said it
    is ready (`ready()` never waits). `spawn` forks an engine from it."""

    def __init__(self, kind: str, modules: Sequence[str], *, env: Mapping[str, str], cwd: Path):
        self.kind = kind
        self.modules = tuple(modules)
        self.env = dict(env)
        self.cwd = cwd
        self.process: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None
        self._ready = False

    def start(self, log_path: Path) -> None:
        self.cwd.mkdir(parents=True, exist_ok=True)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", __name__, str(theirs.fileno()), *self.modules],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
            )
        theirs.close()
        ours.setblocking(False)
        self._control = ours

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def ready(self) -> bool:
        """True once the parked process has imported its modules and holds no device."""
        if self._ready:
            return self.alive()
        if self._control is None or not self.alive():
            return False
        try:
            said = self._control.recv(_MESSAGE_MAX)
        except BlockingIOError:
            return False
        except OSError:
            return False
        if not said or not json.loads(said).get("ready"):
            return False
        assert self.process is not None
        if device_handles(self.process.pid):
            self.stop()  # a device context before the fork: every engine would share it
            return False
        self._ready = True
        return True

    def wait_ready(self, timeout_s: float = READY_TIMEOUT_S) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.ready():
            if not self.alive() or time.monotonic() >= deadline:
                return False
            time.sleep(0.01)
        return True

    def spawn(self, request: Request, output: int) -> ForkedProcess:
        """Fork the engine of `request`, its stdout and stderr going to `output`.

        Raises ForkServerError when the parked process is gone or does not answer."""
        control = self._control
        if control is None or not self._ready:
            raise ForkServerError(f"the {self.kind} launcher is not ready")
        try:
            control.setblocking(True)
            control.settimeout(10.0)
            socket.send_fds(control, [request.encode()], [output])
            said = control.recv(_MESSAGE_MAX)
            pid = int(json.loads(said)["pid"])
        except (OSError, ValueError, KeyError, TypeError) as err:
            self.stop()
            raise ForkServerError(
                f"the {self.kind} launcher did not start the engine: {err}"
            ) from None
        finally:
            with contextlib.suppress(OSError):
                control.setblocking(False)
        return ForkedProcess(pid, Path(request.exit_file), self)

    def stop(self) -> None:
        """End the parked process (never the engines it started)."""
        self._ready = False
        if self._control is not None:
            self._control.close()
            self._control = None
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5.0)


def main(argv: Sequence[str]) -> int:
    if len(argv) < 1:
        print("usage: python -m cohabit.runtime.forkserver FD [MODULE ...]", file=sys.stderr)
        return 2
    return serve(int(argv[0]), argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
