"""Engine logs: rotation, the cap that holds at every write (`CappedLog`), tails across the
rotated file, and a real stand-in engine flooding its output through its log writer as fast
as it can while the files are measured, during the flood and after it."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cohabit.runtime import environment, logfile, logwriter
from cohabit.runtime.interface import EngineState, RuntimeErrorCode
from cohabit.runtime.process import SavedEngine, pid_alive
from cohabit.runtime.spawner import LocalRuntime
from cohabit.units import MIB
from tests.runtime.conftest import fake_launcher, launch_request

Runtimes = Callable[..., LocalRuntime]


def files_of(log: Path, backups: int) -> list[Path]:
    """The log and every backup it may have, oldest last, one more than it keeps."""
    return [log, *(logfile.backup_path(log, n) for n in range(1, backups + 2))]


def size(path: Path) -> int:
    """Bytes in `path`; 0 when it is not there (a file being rotated may be missing)."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def oldest_first(log: Path, backups: int) -> bytes:
    return b"".join(p.read_bytes() for p in reversed(files_of(log, backups)) if p.exists())


def test_rotate_shifts_the_backups_and_moves_the_log(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    for run in range(4):
        log.write_text(f"run {run}\n")
        logfile.rotate(log, backups=2)
    assert not log.exists()  # the next writer starts a new file
    assert logfile.backup_path(log, 1).read_text() == "run 3\n"
    assert logfile.backup_path(log, 2).read_text() == "run 2\n"
    assert not logfile.backup_path(log, 3).exists()


def test_tail_reaches_into_the_previous_file_only_when_asked(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("a\nb\n")
    logfile.rotate(log)
    log.write_text("c\n")
    assert logfile.tail(log, 2) == ["b", "c"]
    assert logfile.tail(log, 5) == ["a", "b", "c"]
    assert logfile.tail(log, 5, previous=False) == ["c"]
    assert logfile.tail(tmp_path / "missing.log", 5) == []


def test_a_write_past_the_cap_is_cut_at_a_line_end_and_goes_on_in_a_new_file(
    tmp_path: Path,
) -> None:
    log = tmp_path / "engine.log"
    capped = logfile.CappedLog(log, max_bytes=10, backups=3)
    capped.write(b"aaaa\nbbbb\ncc")  # 12 bytes: the first 10 fit, up to the second line end
    capped.write(b"c\n" + b"x" * 25 + b"\nd\n")  # a line longer than a whole file is split
    capped.close()
    assert [p.read_bytes() for p in reversed(files_of(log, 3)) if p.exists()] == [
        b"aaaa\nbbbb\n",
        b"ccc\n",
        b"xxxxxxxxxx",
        b"xxxxxxxxxx",
        b"xxxxx\nd\n",
    ][-4:]  # three backups and the current file: the oldest was dropped


def test_a_file_left_over_its_cap_is_rotated_before_the_first_write(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_bytes(b"y" * 50)  # written under a larger cap
    capped = logfile.CappedLog(log, max_bytes=20, backups=1)
    capped.write(b"z\n")
    capped.close()
    assert log.read_bytes() == b"z\n"
    assert logfile.backup_path(log, 1).read_bytes() == b"y" * 50


@settings(max_examples=200, deadline=None)
@given(
    chunks=st.lists(
        st.lists(st.integers(min_value=0, max_value=40), max_size=6).map(
            lambda lengths: b"".join(b"L" * n + b"\n" for n in lengths)
        ),
        max_size=30,
    ),
    max_bytes=st.integers(min_value=41, max_value=200),
    backups=st.integers(min_value=0, max_value=3),
)
def test_the_cap_holds_at_every_write_and_the_newest_lines_are_kept_whole(
    tmp_path_factory: pytest.TempPathFactory, chunks: list[bytes], max_bytes: int, backups: int
) -> None:
    """Whatever the writes: no file ever holds more than `max_bytes`, at most `backups` old
    files are kept, and the files, oldest first, are the end of what was written, cut only
    at line ends (every line fits in a file here)."""
    folder = tmp_path_factory.mktemp("log")
    log = folder / "engine.log"
    capped = logfile.CappedLog(log, max_bytes=max_bytes, backups=backups)
    for chunk in chunks:
        capped.write(chunk)
        sizes = [size(p) for p in files_of(log, backups)]
        assert max(sizes) <= max_bytes
        assert sizes[-1] == 0
    capped.close()
    written = b"".join(chunks)
    kept = oldest_first(log, backups)
    assert written.endswith(kept)
    assert kept == b"" or written[: len(written) - len(kept)].endswith(b"\n") or kept == written
    for path in files_of(log, backups):
        assert not path.exists() or path.read_bytes().endswith(b"\n")


def test_a_flooding_engine_never_takes_its_logs_past_the_cap(
    runtimes: Runtimes, model_file: Path, tmp_path: Path
) -> None:
    """A stand-in engine writes 16 MiB in 256 KiB writes as fast as it can, against a cap of
    64 KiB × (2 backups + the current file). Measured while it is stopped half way (after
    its log was rotated twice) and between every status() call until it exits: no file is
    over 64 KiB and there is never a third backup. Once it has exited the files hold at
    most 192 KiB, every line whole and in order, the last one the engine's own last line,
    which is also what its failure says."""
    max_bytes, backups = 64 * 1024, 2
    go = tmp_path / "go"
    flood = fake_launcher(
        "flood", "--bytes", str(16 * MIB), "--pause-at", str(8 * MIB), "--go", str(go)
    )
    runtime = runtimes(
        startup_timeout_s=600,
        log_max_bytes=max_bytes,
        log_backups=backups,
        launchers={"fake": flood},
    )
    handle = runtime.start(launch_request("gpu16", 6, model_path=str(model_file)))
    log = Path(handle.log_path or "")
    files = files_of(log, backups)

    def within_cap() -> None:
        sizes = [size(p) for p in files]
        assert max(sizes) <= max_bytes, sizes
        assert sizes[-1] == 0, sizes

    deadline = time.monotonic() + 60
    while not files[2].exists():  # rotated twice: the flood is well under way
        assert runtime.status(handle).state is EngineState.STARTING
        within_cap()
        assert time.monotonic() < deadline, "the log was never rotated twice"
        time.sleep(0.02)
    within_cap()
    go.touch()
    deadline = time.monotonic() + 120
    while (status := runtime.status(handle)).state is EngineState.STARTING:
        within_cap()
        assert time.monotonic() < deadline, "the flood never ended"
        time.sleep(0.02)
    within_cap()
    assert sum(size(p) for p in files) <= (backups + 1) * max_bytes

    said = re.fullmatch(
        r"engine exited \(exit code 0\); last line: (fake-engine: flooded (\d+) bytes in "
        r"(\d+) lines)",
        status.error_message or "",
    )
    assert status.error_code is RuntimeErrorCode.CONTAINER_EXITED and said, status
    assert int(said[2]) >= 16 * MIB  # far more than the cap went through the writer
    kept = oldest_first(log, backups).decode().splitlines()
    assert kept[-1] == said[1]
    numbers = [int(line.split()[2]) for line in kept[:-1]]
    assert all(len(line) == 99 for line in kept[:-1])  # whole lines only
    assert numbers == list(range(int(said[3]) - len(numbers), int(said[3])))
    saved = SavedEngine.load(log.with_name("engine.json"))
    assert saved is not None and saved.log_writer_pid is not None
    assert not pid_alive(saved.log_writer_pid, saved.log_writer_create_time)


def test_a_write_the_disk_refuses_is_lost_and_the_next_opens_the_file_again(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "engines" / "dep-1"
    folder.mkdir(parents=True)
    capped = logfile.CappedLog(folder / "engine.log", max_bytes=100, backups=1)
    capped.write(b"first\n")
    (folder / "engine.log").unlink()
    folder.rmdir()  # retention removed the folder under a live writer
    capped.write(b"x" * 150 + b"\n")  # must rotate: fails, and is dropped
    folder.mkdir()
    capped.write(b"after\n")
    capped.close()
    assert (folder / "engine.log").read_bytes() == b"after\n"


def test_the_writer_ignores_a_stop_signal_and_writes_everything_it_is_sent(
    tmp_path: Path,
) -> None:
    """SIGTERM as a terminal or a careless group kill sends it: the writer goes on, and ends
    only at the end of its input, with all of it written."""
    log = tmp_path / "engine.log"
    writer, output = logwriter.start(
        log, max_bytes=MIB, backups=1, env=environment.passed(os.environ), cwd=tmp_path
    )
    try:
        with os.fdopen(os.dup(output), "wb") as pipe:
            pipe.write(b"before\n")
            pipe.flush()
            deadline = time.monotonic() + 60
            while size(log) < len(b"before\n"):  # running, its signal handling set up
                assert time.monotonic() < deadline
                time.sleep(0.02)
            writer.send_signal(signal.SIGTERM)
            pipe.write(b"after\n")
    finally:
        os.close(output)
    assert writer.wait(timeout=60) == 0
    assert log.read_bytes() == b"before\nafter\n"
