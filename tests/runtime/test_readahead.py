"""Page-cache warming (runtime/readahead.py): which files are read ahead, and when nothing is.
The kernel call is recorded, not faked away: each test also lets it run on real files."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cohabit.runtime import readahead
from cohabit.units import GIB, MIB


@pytest.fixture
def advised(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """(file, advice) of every posix_fadvise call, each still made."""
    calls: list[tuple[str, int]] = []
    real = os.posix_fadvise

    def record(fd: int, offset: int, length: int, advice: int) -> None:
        calls.append((os.readlink(f"/proc/self/fd/{fd}"), advice))
        real(fd, offset, length, advice)

    monkeypatch.setattr(readahead.os, "posix_fadvise", record)
    return calls


def test_a_gguf_file_is_read_ahead(tmp_path: Path, advised: list[tuple[str, int]]) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF" + bytes(MIB))
    done = readahead.read_ahead(str(model), available_bytes=8 * GIB)
    assert advised == [(str(model), os.POSIX_FADV_WILLNEED)]
    assert done.describe() == "read ahead 1 weight file(s), 1.0 MiB, into the page cache"
    assert done.total_bytes == MIB + 4


def test_a_folder_reads_its_weight_files_only(
    tmp_path: Path, advised: list[tuple[str, int]]
) -> None:
    for name in ("config.json", "model-00002.safetensors", "model-00001.safetensors"):
        (tmp_path / name).write_bytes(b"x" * 10)
    readahead.read_ahead(str(tmp_path), available_bytes=8 * GIB)
    assert [Path(file).name for file, _ in advised] == [
        "model-00001.safetensors",
        "model-00002.safetensors",
    ]


def test_weights_above_half_the_available_memory_are_left_alone(
    tmp_path: Path, advised: list[tuple[str, int]]
) -> None:
    model = tmp_path / "big.gguf"
    model.write_bytes(bytes(3 * MIB))
    done = readahead.read_ahead(str(model), available_bytes=5 * MIB)
    assert advised == []
    assert done.skipped is not None and "more than half" in done.describe()


def test_nothing_to_read(tmp_path: Path, advised: list[tuple[str, int]]) -> None:
    done = readahead.read_ahead(str(tmp_path / "gone.gguf"), available_bytes=8 * GIB)
    assert advised == [] and done.describe() == "weights not read ahead: no weight file found"
