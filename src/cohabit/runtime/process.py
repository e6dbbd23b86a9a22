"""Engine processes as the operating system sees them: the marks that make one ours, its
process group, and the state file that lets a restarted control plane find it again.
Used by `spawner.LocalRuntime`.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from cohabit.hardware.slots import SlotKey

# Every engine we start carries these in its environment; adoption checks them, so a reused
# pid or someone else's process is never taken for ours. The data dir tells apart the
# engines of two servers on one host whose deployments share an id (two test servers, a
# restored database).
DEPLOYMENT_MARK = "COHABIT_DEPLOYMENT_ID"
RUNTIME_MARK = "COHABIT_RUNTIME"
DATA_DIR_MARK = "COHABIT_DATA_DIR"
RUNTIME_NAME = "local"
# An engine forked by a pre-imported launcher (runtime/forkserver.py) shows the launcher's
# environment in /proc: the runtime and data dir marks and this one, no deployment. Its
# deployment is the folder it runs in, `<data dir>/engines/<id>`.
FORKED_MARK = "COHABIT_FORKED"
_SAME_START_S = 1.0  # create times are rounded differently by different readers


@dataclass(frozen=True, slots=True, kw_only=True)
class SavedEngine:
    """What `engine.json` keeps about a started engine (written at launch)."""

    deployment_id: str
    pid: int
    create_time: float | None
    port: int | None
    base_url: str | None
    health_url: str | None
    startup_timeout_s: float
    engine: str | None
    devices: tuple[SlotKey, ...]
    # The engine's log writer (runtime/logwriter.py), waited for before its last lines are read.
    log_writer_pid: int | None = None
    log_writer_create_time: float | None = None

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> SavedEngine | None:
        """The saved record, or None when there is none or it is unreadable."""
        try:
            data = json.loads(path.read_text())
            return cls(
                deployment_id=str(data["deployment_id"]),
                pid=int(data["pid"]),
                create_time=_float_or_none(data.get("create_time")),
                port=None if data.get("port") is None else int(data["port"]),
                base_url=data.get("base_url"),
                health_url=data.get("health_url"),
                startup_timeout_s=float(data["startup_timeout_s"]),
                engine=data.get("engine"),
                devices=tuple(
                    (str(node), _int_or_none(gpu), _int_or_none(part))
                    for node, gpu, part in data.get("devices", [])
                ),
                log_writer_pid=_int_or_none(data.get("log_writer_pid")),
                log_writer_create_time=_float_or_none(data.get("log_writer_create_time")),
            )
        except (OSError, ValueError, TypeError, KeyError):
            return None


def _float_or_none(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the engine binds it a moment later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def group_alive(pgid: int) -> bool:
    """True while any process of group `pgid` is running (zombies do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, psutil.Error):
            continue
    return False


def signal_group(pgid: int, sig: signal.Signals) -> None:
    """Send `sig` to every process of the group; a group already gone is fine. Group ids
    below 2 are refused: killpg(1) is kill(-1), every process the caller may signal (all of
    them, as root), and 0 is the caller's own group; an engine's group is never either."""
    if pgid < 2:
        raise ValueError(f"refusing to signal process group {pgid}: not an engine's")
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def create_time(pid: int) -> float | None:
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


def pid_reused(pid: int, created: float | None) -> bool:
    """True when a live process holds `pid` but is not the one that started at `created`:
    the number now belongs to someone else (and so may its process group)."""
    if created is None:
        return False
    try:
        return abs(psutil.Process(pid).create_time() - created) >= _SAME_START_S
    except psutil.Error:
        return False


def pid_alive(pid: int, created: float | None) -> bool:
    """True while `pid` runs and is the process that started at `created` (not a reuse)."""
    try:
        proc = psutil.Process(pid)
        if created is not None and abs(proc.create_time() - created) >= _SAME_START_S:
            return False
        return bool(proc.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def marks(deployment_id: str, data_dir: Path) -> dict[str, str]:
    """The environment that makes an engine process the one of `deployment_id` under
    `data_dir` (its data dir as an absolute path)."""
    return {
        DEPLOYMENT_MARK: deployment_id,
        RUNTIME_MARK: RUNTIME_NAME,
        DATA_DIR_MARK: str(data_dir.resolve()),
    }


def _deployment(proc: psutil.Process, environ: dict[str, str], home: Path) -> str | None:
    """The deployment whose engine `proc` is under the data dir `home`, by its marks; None
    when it is no engine of ours there. An engine started before engines carried their data
    dir counts when it runs in its folder of `home` (every engine runs in its own:
    `<data dir>/engines/<id>`); a forked one is known by that folder alone. Raises
    psutil.Error when the process is gone or not ours to read."""
    if environ.get(RUNTIME_MARK) != RUNTIME_NAME:
        return None
    marked = environ.get(DATA_DIR_MARK)
    if marked is not None and marked != str(home):
        return None
    deployment_id = environ.get(DEPLOYMENT_MARK)
    if deployment_id and marked is not None:
        return deployment_id
    if deployment_id is None and (marked is None or environ.get(FORKED_MARK) is None):
        return None
    folder = Path(proc.cwd())
    if folder.parent != home / "engines" or folder.name != (deployment_id or folder.name):
        return None
    return folder.name


def _marked(proc: psutil.Process, deployment_id: str, data_dir: Path) -> bool:
    """Whether `proc` carries the marks of `deployment_id` under `data_dir` (`_deployment`).
    Raises psutil.Error when the process is gone or not ours to read."""
    return _deployment(proc, proc.environ(), data_dir.resolve()) == deployment_id


def find_marked(deployment_id: str, data_dir: Path) -> int | None:
    """The pid of a live engine group leader marked with `deployment_id` and `data_dir`,
    found by scanning processes: for an engine whose pid was never recorded (its control
    plane died between starting it and writing engine.json). `ours_created` still checks
    whatever this finds."""
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) != proc.pid:
                continue  # engines lead their own group; their workers share the marks
            if _marked(proc, deployment_id, data_dir):
                return proc.pid
        except (psutil.Error, OSError):
            continue
    return None


def marked_leaders(data_dir: Path) -> dict[str, int]:
    """Deployment id → pid of every live engine group leader marked with `data_dir`, found by
    scanning processes: also those whose engine.json was never written."""
    home = data_dir.resolve()
    found: dict[str, int] = {}
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) != proc.pid or proc.status() == psutil.STATUS_ZOMBIE:
                continue
            environ = proc.environ()
            if environ.get(DATA_DIR_MARK) != str(home):
                continue
            deployment_id = _deployment(proc, environ, home)
        except (psutil.Error, OSError):
            continue
        if deployment_id:
            found.setdefault(deployment_id, proc.pid)
    return found


def ours_created(
    pid: int, deployment_id: str, data_dir: Path, saved: SavedEngine | None
) -> float | None:
    """The start time of `pid` when it is a live engine this runtime started for
    `deployment_id` under `data_dir` (its environment carries our marks, and it is the
    process the state file recorded); None otherwise."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE or not _marked(proc, deployment_id, data_dir):
            return None
        created = float(proc.create_time())
    except psutil.Error:
        return None
    recorded = saved.create_time if saved is not None and saved.pid == pid else None
    if recorded is not None and abs(created - recorded) >= _SAME_START_S:
        return None  # the pid now belongs to a later process
    return created


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessFacts:
    """What the operating system says about a running engine process: its resident memory
    (with its children's, since vLLM's workers are children) and when it started."""

    pid: int
    rss_bytes: int
    started_at: float  # seconds since the epoch


def process_facts(pid: int) -> ProcessFacts | None:
    """Facts about `pid` while it runs; None once it is gone (or not ours to read)."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        family = [proc, *proc.children(recursive=True)]
        rss = 0
        for member in family:
            with contextlib.suppress(psutil.Error):
                rss += member.memory_info().rss
        return ProcessFacts(pid=pid, rss_bytes=rss, started_at=float(proc.create_time()))
    except psutil.Error:
        return None
