"""Engine log rotation (copy, then truncate) and tails across the rotated file."""

from __future__ import annotations

from pathlib import Path

from cohabit.runtime import logfile


def test_rotate_keeps_backups_and_truncates_in_place(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    with log.open("ab") as writer:  # an engine holding its log open for append
        for run in range(4):
            writer.write(f"run {run}\n".encode())
            writer.flush()
            logfile.rotate(log, backups=2)
        writer.write(b"after\n")
        writer.flush()
    assert log.read_text() == "after\n"  # appends land at the start of the truncated file
    assert logfile.backup_path(log, 1).read_text() == "run 3\n"
    assert logfile.backup_path(log, 2).read_text() == "run 2\n"
    assert not logfile.backup_path(log, 3).exists()


def test_rotate_if_large(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("x" * 100)
    assert not logfile.rotate_if_large(log, max_bytes=100)
    log.write_text("x" * 101)
    assert logfile.rotate_if_large(log, max_bytes=100)
    assert log.stat().st_size == 0


def test_tail_reaches_into_the_previous_file_only_when_asked(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("a\nb\n")
    logfile.rotate(log)
    log.write_text("c\n")
    assert logfile.tail(log, 2) == ["b", "c"]
    assert logfile.tail(log, 5) == ["a", "b", "c"]
    assert logfile.tail(log, 5, previous=False) == ["c"]
    assert logfile.tail(tmp_path / "missing.log", 5) == []
