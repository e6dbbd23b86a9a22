"""LocalRuntime: the `EngineRuntime` for standalone hosts (and macOS's metal_spawner path).

It runs each engine as a local process in its own process group, with an environment of its
own (`runtime/environment.py`: none of the server's secrets) and its output written by a log
writer (`runtime/logwriter.py`) into a capped, rotated file under
`<data_dir>/engines/<deployment_id>/`, and drives every engine through
held → starting → ready | failed | stopped whenever the reconciler calls it: nothing runs in
the background, so every transition happens under one lock on the caller's thread.
At most one engine starts per device at a time (engines that share a card mis-size
themselves when they profile memory together, vllm#55827); the next is held until the one
before it is ready or has failed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path

import psutil

from cohabit.estimate.checkpoint import files_fingerprint, load_shape
from cohabit.estimate.errors import EstimateError
from cohabit.estimate.estimate import estimate_model
from cohabit.estimate.shape import ModelShape
from cohabit.hardware.model import HardwareClass, Vendor
from cohabit.hardware.slots import SlotKey
from cohabit.runtime import environment, logfile, logwriter
from cohabit.runtime.engines import (
    ModelFormat,
    check_engine,
    choose_engine,
    llamacpp,
    model_format,
)
from cohabit.runtime.engines.launch import build_launch
from cohabit.runtime.engines.spec import HardLimit, LaunchSpec, LaunchTarget
from cohabit.runtime.errors import LaunchError, fault_text
from cohabit.runtime.forkserver import LATE_READ, ForkedProcess, ForkServer, ForkServerError
from cohabit.runtime.forkserver import Request as ForkRequest
from cohabit.runtime.interface import (
    EngineHandle,
    EngineState,
    EngineStatus,
    LaunchRequest,
    RuntimeErrorCode,
)
from cohabit.runtime.milestones import LogWatch
from cohabit.runtime.probe import TAIL_LINES, EngineFailure, classify_exit, is_ready
from cohabit.runtime.process import (
    DATA_DIR_MARK,
    DEPLOYMENT_MARK,
    FORKED_MARK,
    RUNTIME_MARK,
    RUNTIME_NAME,
    SavedEngine,
    create_time,
    find_marked,
    free_port,
    group_alive,
    marked_leaders,
    marks,
    ours_created,
    pid_alive,
    pid_reused,
    signal_group,
)
from cohabit.runtime.readahead import read_ahead
from cohabit.units import format_gib

log = logging.getLogger(__name__)
LOG_NOTE = "[cohabit] "  # lines the spawner itself writes into an engine's log
HAMI_CORE_PATHS = ("/usr/local/vgpu/libvgpu.so", "/usr/lib/libvgpu.so")
HAMI_CACHE = "hami.cache"  # HAMi-core's shared region, one per deployment (spec.HardLimit)
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_POLL_S = 0.05
LOG_DRAIN_S = 5.0  # what an exited engine's log writer gets to write its last lines
EXIT_FILE = "engine.exit"  # a forked engine's exit code, written by its launcher

Launcher = Callable[[LaunchRequest, int], LaunchSpec]
# Engines a pre-imported launcher can start (runtime/forkserver.py): kind → the module its
# command runs as `python -m`, and what the launcher imports ahead.
PREIMPORTED: dict[str, tuple[str, tuple[str, ...]]] = {
    llamacpp.ENGINE: (llamacpp.PYTHON_MODULE, llamacpp.PREIMPORTS),
}
FORKSERVERS = "launchers"  # under the data dir: the parked processes' folder and logs


class _Phase(StrEnum):
    HELD = "held"  # waiting for its device's previous start-up to finish
    STARTING = "starting"
    READY = "ready"
    FAILED = "failed"
    STOPPED = "stopped"


_LIVE = (_Phase.HELD, _Phase.STARTING, _Phase.READY)


@dataclass(slots=True, kw_only=True)
class _Engine:
    """The supervisor's mutable record of one deployment's engine (never leaves this module)."""

    deployment_id: str
    directory: Path
    devices: frozenset[SlotKey]
    phase: _Phase
    request: LaunchRequest | None = None
    spec: LaunchSpec | None = None
    port: int | None = None
    base_url: str | None = None
    health_url: str | None = None
    startup_timeout_s: float = 0.0
    process: subprocess.Popen[bytes] | ForkedProcess | None = None
    pid: int | None = None
    create_time: float | None = None
    log_writer: subprocess.Popen[bytes] | None = None  # ours: started with the engine
    log_writer_pid: int | None = None  # an adopted engine's, from its state file
    log_writer_created: float | None = None
    launched_at: float = 0.0
    failure: EngineFailure | None = None
    failed_at: datetime | None = None
    exit_code: int | None = None
    extra_env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # written into the log at launch
    watch: LogWatch | None = None  # this run's load milestones, found in its log

    @property
    def log_path(self) -> Path:
        return self.directory / "engine.log"

    @property
    def state_path(self) -> Path:
        return self.directory / "engine.json"


def hami_core_library(paths: tuple[str, ...] = HAMI_CORE_PATHS) -> str | None:
    """Where HAMi-core's libvgpu.so is installed on this host, if anywhere."""
    return next((p for p in paths if Path(p).is_file()), None)


def _now() -> datetime:
    return datetime.now(UTC)


class LocalRuntime:
    """Starts, watches and stops engine processes on this host (implements EngineRuntime).

    `startup_timeout_s` overrides every engine's own default (llama.cpp 300 s, vLLM 1200 s,
    MLX 600 s). `hard_limit_library` is HAMi-core's libvgpu.so: when given, vLLM and
    llama.cpp engines on NVIDIA GPUs also get its per-device memory limit, each deployment
    with its own shared-region file (off by default; see docs/runtime.md).
    `vllm_kv_cache_bytes` sizes vLLM by --kv-cache-memory-bytes instead of utilization where
    the deployment's settings do not choose. `launchers` replaces or adds engines by name
    (tests run fake engines this way). `preimport()` parks a pre-imported launcher for each
    Python engine installed here (`PREIMPORTED`); engines start from it once it is ready.
    """

    def __init__(
        self,
        data_dir: Path,
        *,
        startup_timeout_s: float | None = None,
        stop_grace_s: float = 10.0,
        hard_limit_library: str | None = None,
        vllm_kv_cache_bytes: bool = False,
        log_max_bytes: int = logfile.DEFAULT_MAX_BYTES,
        log_backups: int = logfile.DEFAULT_BACKUPS,
        probe_timeout_s: float = 1.0,
        launchers: Mapping[str, Launcher] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir)
        self.startup_timeout_s = startup_timeout_s
        self.stop_grace_s = stop_grace_s
        self.hard_limit_library = hard_limit_library
        self.vllm_kv_cache_bytes = vllm_kv_cache_bytes
        self.log_max_bytes = log_max_bytes
        self.log_backups = log_backups
        self.probe_timeout_s = probe_timeout_s
        self._launchers = dict(launchers or {})
        self._engines: dict[str, _Engine] = {}
        self._forkservers: dict[str, ForkServer] = {}
        self._lock = threading.RLock()

    def preimport(self, kinds: tuple[str, ...] = tuple(PREIMPORTED)) -> list[str]:
        """Start a pre-imported launcher for each of `kinds` whose engine is installed (it
        imports in the background; engines start as fresh processes until it is ready).
        Returns the kinds started."""
        started = []
        folder = self.data_dir / FORKSERVERS
        with self._lock:
            for kind in kinds:
                module, imports = PREIMPORTED[kind]
                if kind in self._forkservers or not _installed(module):
                    continue
                server = ForkServer(kind, imports, env=self._forkserver_env(), cwd=folder / kind)
                server.start(folder / f"{kind}.log")
                self._forkservers[kind] = server
                started.append(kind)
        return started

    def close_launchers(self) -> None:
        """End the pre-imported launchers (the engines they started run on)."""
        with self._lock:
            for server in self._forkservers.values():
                server.stop()
            self._forkservers.clear()

    def _forkserver_env(self) -> dict[str, str]:
        """A launcher's environment, which every engine it forks shows in /proc: an engine's
        without the deployment's mark and the launch's own variables."""
        return environment.engine_env(
            os.environ,
            launcher_env={},
            request_env={},
            marks={
                RUNTIME_MARK: RUNTIME_NAME,
                DATA_DIR_MARK: str(self.data_dir.resolve()),
                FORKED_MARK: "1",
            },
        )

    # --- EngineRuntime -------------------------------------------------------------------

    def start(self, request: LaunchRequest) -> EngineHandle:
        """Start (or hold, while its device is busy starting another) the request's engine.

        Returns at once. Model files missing on disk come back through `status()` as
        MUST_REDOWNLOAD; a request that names an impossible engine raises LaunchError (an
        EngineChoiceError or BudgetTooSmall) and nothing is recorded.
        """
        self._directory(request.deployment_id)  # raises for an id unsafe as a file name
        with self._lock:
            current = self._engines.get(request.deployment_id)
            if current is not None and current.phase in _LIVE:
                return self._handle(current)
            engine = self._prepare(request)
            self._engines[request.deployment_id] = engine
            self._pump()
            return self._handle(engine)

    def status(self, handle: EngineHandle) -> EngineStatus:
        with self._lock:
            self._pump()
            engine = self._engines.get(handle.deployment_id)
            if engine is None:
                return EngineStatus(
                    state=EngineState.FAILED,
                    error_code=RuntimeErrorCode.CONTAINER_EXITED,
                    error_message=(
                        f"no engine for deployment {handle.deployment_id!r} in this runtime "
                        "(not started here, or not adopted after a restart)"
                    ),
                    error_at=_now(),
                )
            return self._status(engine)

    def stop(self, handle: EngineHandle) -> None:
        """Stop the engine: SIGTERM to its process group, SIGKILL after the grace period.
        Returns once the group is gone. Stopping what is not running is a no-op."""
        with self._lock:
            engine = self._engines.get(handle.deployment_id)
            if engine is None and self.adopt(handle) is None:
                return
            engine = self._engines[handle.deployment_id]
            # Signal only a process known to be this engine: a failed engine's pid may since
            # belong to someone else (our own children stay unreaped zombies until polled).
            running = engine.phase in (_Phase.STARTING, _Phase.READY)
            if running and not self._exited(engine)[0]:
                self._terminate(engine, grace_s=self.stop_grace_s)
            if engine.phase in _LIVE:
                engine.phase = _Phase.STOPPED
            self._pump()

    def adopt(self, handle: EngineHandle) -> EngineHandle | None:
        """Take over an engine a previous control plane started: its full handle when its
        process is alive and marked with this deployment's id. Its state file restores the
        port, URLs, devices and start-up timeout."""
        with self._lock:
            current = self._engines.get(handle.deployment_id)
            if current is not None and current.phase in _LIVE:
                same = handle.pid is None or handle.pid == current.pid
                return self._handle(current) if same else None
            if not _ID.match(handle.deployment_id):
                return None
            directory = self._directory(handle.deployment_id)
            saved = SavedEngine.load(directory / "engine.json")
            pid = handle.pid or (saved.pid if saved else None)
            by_marks = pid is None
            if by_marks:  # started, but its control plane died before recording the pid
                pid = find_marked(handle.deployment_id, self.data_dir)
            created = (
                None
                if pid is None
                else ours_created(pid, handle.deployment_id, self.data_dir, saved)
            )
            if pid is None or created is None:
                return None
            base = handle.base_url or (saved.base_url if saved else None)
            health = (saved.health_url if saved else None) or (base and f"{base}/v1/models")
            if by_marks or not health:
                # Found by its marks alone (its control plane died between starting it and
                # writing engine.json): nothing says where it listens. The stored handle's
                # URL, when there is one, is a queued launch's, and the process found may be
                # a later launch's on another port (a second control plane started it again
                # and died before recording it): watched there it would read STARTING until
                # its start-up timeout. Kill it; the caller starts it again.
                self._kill_unwatchable(handle.deployment_id, pid)
                return None
            engine = _Engine(
                deployment_id=handle.deployment_id,
                directory=directory,
                devices=frozenset(saved.devices if saved else ()),
                phase=_Phase.STARTING,
                port=handle.port or (saved.port if saved else None),
                base_url=base,
                health_url=health or None,
                startup_timeout_s=(
                    saved.startup_timeout_s if saved else llamacpp.STARTUP_TIMEOUT_S
                ),
                pid=pid,
                create_time=created,
                launched_at=time.monotonic(),
                log_writer_pid=saved.log_writer_pid if saved else None,
                log_writer_created=saved.log_writer_create_time if saved else None,
            )
            if engine.health_url and is_ready(engine.health_url, timeout_s=self.probe_timeout_s):
                engine.phase = _Phase.READY
            self._engines[handle.deployment_id] = engine
            return self._handle(engine)

    def _kill_unwatchable(self, deployment_id: str, pgid: int) -> None:
        signal_group(pgid, signal.SIGKILL)
        deadline = time.monotonic() + 5.0
        while group_alive(pgid):
            if time.monotonic() >= deadline:  # raise: a relaunch would run a second engine
                raise LaunchError(f"engine {pgid} of {deployment_id} outlived SIGKILL")
            time.sleep(_POLL_S)

    def logs(self, handle: EngineHandle, *, tail: int = 200) -> list[str]:
        path = (
            Path(handle.log_path)
            if handle.log_path
            else self._directory(handle.deployment_id) / "engine.log"
        )
        return logfile.tail(path, tail)

    def engines(self) -> list[EngineHandle]:
        """Every engine under this data dir whose process still runs, found by its state file
        and checked as `adopt` checks (marks and start time), whoever started it."""
        found: list[EngineHandle] = []
        for state in sorted((self.data_dir / "engines").glob("*/engine.json")):
            saved = SavedEngine.load(state)
            if saved is None:
                continue
            if ours_created(saved.pid, saved.deployment_id, self.data_dir, saved) is None:
                continue
            found.append(
                EngineHandle(
                    deployment_id=saved.deployment_id,
                    pid=saved.pid,
                    port=saved.port,
                    base_url=saved.base_url,
                    log_path=str(state.parent / "engine.log"),
                )
            )
        # Engines whose server died between starting them and writing engine.json.
        listed = {handle.deployment_id for handle in found}
        for deployment_id, pid in sorted(marked_leaders(self.data_dir).items()):
            if deployment_id not in listed and _ID.match(deployment_id):
                found.append(EngineHandle(deployment_id=deployment_id, pid=pid))
        return found

    def discard(self, deployment_id: str) -> None:
        """Remove the engine's directory (logs, state file) unless it is live here."""
        if not _ID.match(deployment_id):
            return
        with self._lock:
            engine = self._engines.get(deployment_id)
            if engine is not None and engine.phase in _LIVE:
                return
            self._engines.pop(deployment_id, None)
            shutil.rmtree(self._directory(deployment_id), ignore_errors=True)

    # --- beyond the protocol ---------------------------------------------------------------

    def stop_all(self) -> None:
        """Stop every engine this runtime knows (shutdown of a service that owns them), all
        at once: SIGTERM to every process group, SIGKILL to those still running after
        `stop_grace_s`, so it takes about that long however many engines there are."""
        with self._lock:
            running = [
                (engine, pgid)
                for engine in self._engines.values()
                if engine.phase in (_Phase.STARTING, _Phase.READY)
                and (pgid := engine.pid) is not None
                and not self._exited(engine)[0]
            ]
            for _engine, pgid in running:
                signal_group(pgid, signal.SIGTERM)
            deadline = time.monotonic() + self.stop_grace_s
            for engine, pgid in running:
                if not self._wait_group(engine, pgid, max(0.0, deadline - time.monotonic())):
                    signal_group(pgid, signal.SIGKILL)
                    self._wait_group(engine, pgid, 5.0)
                if engine.process is not None:  # reap our child; its exit code is the record's
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        code = engine.process.wait(timeout=5.0)
                        engine.exit_code = code if engine.exit_code is None else engine.exit_code
            for engine, _pgid in running:
                self._drain(engine)
            for engine in self._engines.values():
                if engine.phase in _LIVE:
                    engine.phase = _Phase.STOPPED

    # --- internals -------------------------------------------------------------------------

    def _directory(self, deployment_id: str) -> Path:
        if not _ID.match(deployment_id):
            raise LaunchError(
                f"deployment id {deployment_id!r} must be 1-128 letters, digits, '.', '_' or '-'"
            )
        return self.data_dir / "engines" / deployment_id

    def _prepare(self, request: LaunchRequest) -> _Engine:
        directory = self._directory(request.deployment_id)
        directory.mkdir(parents=True, exist_ok=True)
        engine = _Engine(
            deployment_id=request.deployment_id,
            directory=directory,
            devices=frozenset(a.slot.key for a in request.placement.allocations),
            phase=_Phase.HELD,
            request=request,
            extra_env=dict(request.env),
        )
        fmt = model_format(request.model_path)
        if fmt is None:
            self._fail(
                engine,
                EngineFailure(
                    code=RuntimeErrorCode.MUST_REDOWNLOAD,
                    message=(
                        f"model files missing on disk: {request.model_path} "
                        "(download the model again)"
                    ),
                ),
            )
            return engine
        name = request.engine if request.engine not in ("", "auto") else None
        if name is None:
            name = choose_engine(fmt, request.placement)
        if name not in self._launchers:
            check_engine(name, fmt, request.placement)
        request = _current_estimate(replace(request, engine=name), engine.notes)
        request = replace(request, model_path=_model_file(request.model_path, fmt))
        port = free_port()
        spec = self._spec(request, port, directory)
        timeout = self.startup_timeout_s or spec.startup_timeout_s
        engine.request = request
        engine.spec = spec
        engine.port = spec.port
        engine.base_url = spec.base_url
        engine.health_url = spec.health_url
        engine.startup_timeout_s = timeout
        return engine

    def _spec(self, request: LaunchRequest, port: int, directory: Path) -> LaunchSpec:
        custom = self._launchers.get(request.engine)
        if custom is not None:
            return custom(request, port)
        placement = request.placement
        hard_limit = None
        on_nvidia_gpu = (
            placement.gpu_vendor is Vendor.NVIDIA
            and placement.hardware_class is not HardwareClass.CPU
        )
        if self.hard_limit_library and on_nvidia_gpu and request.engine != "mlx":
            hard_limit = HardLimit(
                library=self.hard_limit_library, shared_cache=str(directory / HAMI_CACHE)
            )
        target = LaunchTarget(
            port=port,
            executable=shutil.which("llama-server") if request.engine == "llamacpp" else None,
            hard_limit=hard_limit,
            vllm_kv_cache_bytes=self.vllm_kv_cache_bytes,
        )
        shape = _gguf_shape(request.model_path) if request.engine == "llamacpp" else None
        return build_launch(request, target, shape=shape)

    def _handle(self, engine: _Engine) -> EngineHandle:
        return EngineHandle(
            deployment_id=engine.deployment_id,
            pid=engine.pid,
            port=engine.port,
            base_url=engine.base_url,
            log_path=str(engine.log_path),
        )

    def _status(self, engine: _Engine) -> EngineStatus:
        if engine.phase is _Phase.FAILED and engine.failure is not None:
            return EngineStatus(
                state=EngineState.FAILED,
                error_code=engine.failure.code,
                error_message=engine.failure.message,
                error_at=engine.failed_at,
                exit_code=engine.exit_code,
            )
        state = {
            _Phase.HELD: EngineState.STARTING,
            _Phase.STARTING: EngineState.STARTING,
            _Phase.READY: EngineState.READY,
            _Phase.STOPPED: EngineState.STOPPED,
        }[engine.phase]
        seen = () if engine.watch is None else engine.watch.seen
        return EngineStatus(
            state=state, exit_code=engine.exit_code, pid=engine.pid, milestones=seen
        )

    def _pump(self) -> None:
        """Advance every engine one step: notice exits, readiness and timeouts, then launch
        held engines whose devices have no start-up in progress."""
        for engine in list(self._engines.values()):
            if engine.phase in (_Phase.STARTING, _Phase.READY):
                self._contained(engine, self._check)
        busy: set[SlotKey] = set()
        for engine in self._engines.values():
            if engine.phase is _Phase.STARTING:
                busy |= engine.devices
        claimed: set[SlotKey] = set()
        for engine in list(self._engines.values()):
            if engine.phase is not _Phase.HELD:
                continue
            if engine.devices & (busy | claimed):
                claimed |= engine.devices  # first come, first started on each device
                continue
            if self._contained(engine, self._launch):
                busy |= engine.devices

    def _contained(self, engine: _Engine, step: Callable[[_Engine], object]) -> bool:
        """Run one engine's step; a fault in it fails that engine alone (RUNTIME_ERROR with
        the exception), so every other engine's status, start and stop go on unharmed."""
        try:
            return bool(step(engine))
        except Exception as err:
            log.exception("engine of %s: %s failed", engine.deployment_id, step.__name__)
            with contextlib.suppress(Exception):  # a failed engine must not run on unwatched
                if not self._exited(engine)[0]:
                    self._terminate(engine, grace_s=0.0)
            self._fail(
                engine,
                EngineFailure(code=RuntimeErrorCode.RUNTIME_ERROR, message=fault_text(err)),
            )
            return False

    def _launch(self, engine: _Engine) -> bool:
        """Run a held engine's command, its output going to its log writer; True when its
        process started."""
        spec, request = engine.spec, engine.request
        if spec is None or request is None:
            return False
        logfile.rotate(engine.log_path, backups=self.log_backups)
        # A region left by an earlier run of this deployment holds its old limit and dead
        # processes' usage; HAMi-core asks for a fresh file whenever limits change.
        (engine.directory / HAMI_CACHE).unlink(missing_ok=True)
        env = environment.engine_env(
            os.environ,
            launcher_env=spec.env,
            request_env=engine.extra_env,
            marks=marks(engine.deployment_id, self.data_dir),
        )
        warmed = read_ahead(request.model_path, available_bytes=psutil.virtual_memory().available)
        with engine.log_path.open("ab") as log:
            visible = " ".join(f"{k}={v}" for k, v in sorted(spec.env.items()))
            for said in engine.notes:
                log.write(f"{LOG_NOTE}{_now().isoformat()} {said}\n".encode())
            note = f"{LOG_NOTE}{_now().isoformat()} starting: {visible} {shlex.join(spec.argv)}"
            log.write(f"{note.replace('  ', ' ')}\n".encode())
            log.write(f"{LOG_NOTE}{_now().isoformat()} {warmed.describe()}\n".encode())
            written = log.tell()
        engine.watch = LogWatch(engine.log_path, spec.milestones, offset=written, skip=LOG_NOTE)
        # The writer gets only the allow-listed environment, without the marks: it is not
        # the engine, and adoption and the sweep must never take it for one.
        writer, output = logwriter.start(
            engine.log_path,
            max_bytes=self.log_max_bytes,
            backups=self.log_backups,
            env=environment.passed(os.environ),
            cwd=engine.directory,
        )
        engine.log_writer = writer
        try:
            try:
                process = self._forked(engine, spec, env, output) or subprocess.Popen(
                    spec.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=engine.directory,
                    start_new_session=True,  # its own process group: stop() kills the tree
                )
            finally:
                os.close(output)  # the engine has its own; the writer ends when none is left
        except (OSError, ValueError, TypeError) as err:  # ValueError: a NUL in argv/env
            self._drain(engine)
            reason = err.strerror if isinstance(err, OSError) else None
            self._fail(
                engine,
                EngineFailure(
                    code=RuntimeErrorCode.RUNTIME_ERROR,
                    message=f"cannot run {spec.argv[0]!r}: {reason or err}",
                ),
            )
            return False
        engine.process = process
        engine.pid = process.pid
        engine.launched_at = time.monotonic()
        engine.phase = _Phase.STARTING
        engine.create_time = create_time(process.pid)
        SavedEngine(
            deployment_id=engine.deployment_id,
            pid=process.pid,
            create_time=engine.create_time,
            port=engine.port,
            base_url=engine.base_url,
            health_url=engine.health_url,
            startup_timeout_s=engine.startup_timeout_s,
            engine=spec.engine,
            devices=tuple(sorted(engine.devices, key=str)),
            log_writer_pid=writer.pid,
            log_writer_create_time=create_time(writer.pid),
        ).save(engine.state_path)
        return True

    def _forked(
        self, engine: _Engine, spec: LaunchSpec, env: Mapping[str, str], output: int
    ) -> ForkedProcess | None:
        """The engine forked from its kind's pre-imported launcher, or None: no launcher
        ready, a command other than `python -m` its module, or an environment that differs
        from the launcher's in more than `LATE_READ` and the deployment's mark (a variable a
        library reads at import, a preloaded library), which needs a fresh process."""
        server = self._forkservers.get(spec.engine)
        module = PREIMPORTED.get(spec.engine, ("", ()))[0]
        if server is None or spec.argv[:3] != (sys.executable, "-m", module):
            return None
        base = server.env
        differs = {k for k in env.keys() | base.keys() if env.get(k) != base.get(k)}
        if differs - LATE_READ - {DEPLOYMENT_MARK, FORKED_MARK} or not server.ready():
            return None
        exit_file = engine.directory / EXIT_FILE
        exit_file.unlink(missing_ok=True)
        request = ForkRequest(
            module=module,
            argv=spec.argv[3:],
            env=env,
            cwd=str(engine.directory),
            exit_file=str(exit_file),
        )
        try:
            process = server.spawn(request, output)
        except ForkServerError as err:
            log.warning("deployment %s: %s; starting it afresh", engine.deployment_id, err)
            return None
        with engine.log_path.open("ab") as log_file:
            said = f"{LOG_NOTE}{_now().isoformat()} forked from the pre-imported {module}"
            log_file.write(f"{said}\n".encode())
        return process

    def _check(self, engine: _Engine) -> None:
        exited, code = self._exited(engine)
        if exited:
            # Leftover workers of a dead engine; never the group of a process that took over
            # the number (an adopted engine is no child of ours: its pid can be reused).
            if engine.pid is not None and not pid_reused(engine.pid, engine.create_time):
                signal_group(engine.pid, signal.SIGKILL)
            self._drain(engine)
            engine.exit_code = code
            self._fail(engine, classify_exit(code, self._own_lines(engine)))
            return
        if engine.phase is not _Phase.STARTING or engine.health_url is None:
            return
        if engine.watch is not None:
            engine.watch.look()
        if is_ready(engine.health_url, timeout_s=self.probe_timeout_s):
            engine.phase = _Phase.READY
            if engine.watch is not None:  # lines its log writer wrote while we probed
                engine.watch.look()
            return
        waited_s = time.monotonic() - engine.launched_at
        if waited_s > engine.startup_timeout_s:
            self._terminate(engine, grace_s=min(self.stop_grace_s, 5.0))
            lines = self._own_lines(engine)
            said = f"; last line: {lines[-1].strip()}" if lines else ""
            self._fail(
                engine,
                EngineFailure(
                    code=RuntimeErrorCode.STARTUP_TIMEOUT,
                    message=(
                        f"not ready after {engine.startup_timeout_s:g} s "
                        f"({engine.health_url} did not answer){said}"
                    ),
                    line=lines[-1].strip() if lines else "",
                ),
            )

    def _own_lines(self, engine: _Engine) -> list[str]:
        lines = logfile.tail(engine.log_path, TAIL_LINES, previous=False)
        return [line for line in lines if not line.startswith(LOG_NOTE)]

    def _exited(self, engine: _Engine) -> tuple[bool, int | None]:
        process = engine.process
        if process is not None:
            code = process.poll()
            return (process.ended if isinstance(process, ForkedProcess) else code is not None), code
        if engine.pid is None:
            return True, None
        return not pid_alive(engine.pid, engine.create_time), None

    def _terminate(self, engine: _Engine, *, grace_s: float) -> None:
        pgid = engine.pid
        if pgid is None:
            return
        signal_group(pgid, signal.SIGTERM)
        if not self._wait_group(engine, pgid, grace_s):
            signal_group(pgid, signal.SIGKILL)
            self._wait_group(engine, pgid, 5.0)
        if engine.process is not None:
            try:
                code = engine.process.wait(timeout=5.0)
            except subprocess.TimeoutExpired:
                code = None
            if engine.exit_code is None:
                engine.exit_code = code
        self._drain(engine)

    def _drain(self, engine: _Engine) -> None:
        """Wait, at most LOG_DRAIN_S, for the engine's log writer to end. It ends once no
        process holds the engine's output, having written all of it, so what is read from
        the log afterwards ends with the engine's last words."""
        if engine.log_writer is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                engine.log_writer.wait(timeout=LOG_DRAIN_S)
            return
        pid, deadline = engine.log_writer_pid, time.monotonic() + LOG_DRAIN_S
        while pid is not None and pid_alive(pid, engine.log_writer_created):
            if time.monotonic() >= deadline:
                return
            time.sleep(_POLL_S)

    def _wait_group(self, engine: _Engine, pgid: int, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while True:
            if engine.process is not None:
                engine.process.poll()  # reap the leader, or the group never looks gone
            if not group_alive(pgid):
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)

    def _fail(self, engine: _Engine, failure: EngineFailure) -> None:
        engine.phase = _Phase.FAILED
        engine.failure = failure
        engine.failed_at = _now()


def _installed(module: str) -> bool:
    """Whether `module`'s package is installed, found without importing it (`find_spec` of a
    submodule would import its package into the server)."""
    return importlib.util.find_spec(module.partition(".")[0]) is not None


def _model_file(model_path: str, fmt: ModelFormat) -> str:
    """The model as the engine is given it: an absolute path (the engine runs in its own
    folder), and for llama.cpp, which takes a file, a directory of GGUF files means its first
    (split) file."""
    path = Path(model_path).absolute()
    if fmt is ModelFormat.GGUF and path.is_dir():
        return str(sorted(path.glob("*.gguf"))[0])
    return str(path)


def _gguf_shape(model_path: str) -> ModelShape | None:
    """The GGUF's shape for fitting layers and context; None when our reader cannot read it
    (llama.cpp then tries, and a corrupt file fails with its own message)."""
    try:
        return load_shape(Path(model_path))
    except EstimateError:
        return None


def _current_estimate(request: LaunchRequest, notes: list[str]) -> LaunchRequest:
    """The request with an estimate of its model's files as they are now, made with the
    settings admission parsed — never with defaults.

    The admission estimate stands while the files it read are unchanged. When they changed
    (a re-download, another quantization under the same path), or when admission made none
    (the caller gave the bytes), vLLM and MLX are estimated again explicitly with the same
    settings, and `notes` says so (the engine log shows it). A model the estimator cannot
    read keeps what admission had.
    """
    admitted = request.estimate
    if request.engine not in ("vllm", "mlx"):
        return request
    now = files_fingerprint(request.model_path)
    if admitted is not None and (admitted.files_fingerprint in (None, now)):
        return request
    try:
        fresh = estimate_model(request.model_path, engine=request.engine, settings=request.settings)
    except EstimateError as err:
        notes.append(f"could not re-estimate {request.model_path} ({err}); sizing as admitted")
        return request
    if admitted is None:
        said = "no admission estimate (the size was given)"
    else:
        said = (
            "model files changed since admission; re-estimated with the same settings: "
            f"{format_gib(fresh.total_bytes, digits=2)} (admitted "
            f"{format_gib(admitted.total_bytes, digits=2)})"
        )
    said += f"; flags sized from the estimate of {request.model_path}"
    log.info("deployment %s: %s", request.deployment_id, said)
    notes.append(said)
    return replace(request, estimate=fresh)
