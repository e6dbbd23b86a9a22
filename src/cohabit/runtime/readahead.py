"""Page-cache warming: before an engine starts, ask the kernel to read its weight files
ahead (`posix_fadvise(POSIX_FADV_WILLNEED)` on each), so the engine's own reads — llama.cpp
maps a GGUF, vLLM and MLX read safetensors — find the pages in memory instead of waiting on
the disk one fault at a time.

The kernel queues the reads and returns: nothing here waits for the disk. The pages are
ordinary page cache, which the kernel takes back under memory pressure; they count against
no budget (a GPU engine copies the weights to the device and the host pages can go). Files
larger together than half the memory the host has available are not read ahead: they would
push out other processes' pages and be partly evicted before the engine reads them.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

from cohabit.units import GIB, MIB, format_gib

WEIGHT_SUFFIXES = (".gguf", ".safetensors", ".bin", ".npz")
AVAILABLE_SHARE = 2  # read ahead only what fits in 1/AVAILABLE_SHARE of available memory


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadAhead:
    """What was asked of the kernel: the files and their bytes, or why nothing."""

    files: tuple[str, ...]
    total_bytes: int
    skipped: str | None = None

    def describe(self) -> str:
        if self.skipped:
            return f"weights not read ahead: {self.skipped}"
        return (
            f"read ahead {len(self.files)} weight file(s), "
            f"{_size(self.total_bytes)}, into the page cache"
        )


def _size(size_bytes: int) -> str:
    """GiB for weights, MiB for the small ones (a tiny test model is 0 GiB)."""
    if size_bytes >= GIB // 10:
        return format_gib(size_bytes, digits=2)
    return f"{size_bytes / MIB:.1f} MiB"


def weight_files(model_path: str) -> list[Path]:
    """The weight files of a model: the file itself, or a folder's weight files."""
    path = Path(model_path)
    if path.is_file():
        return [path]
    if not path.is_dir():
        return []
    return sorted(p for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES and p.is_file())


def read_ahead(model_path: str, *, available_bytes: int) -> ReadAhead:
    """Ask the kernel to read `model_path`'s weights ahead, when they fit the rule above."""
    files = weight_files(model_path)
    sizes = []
    for file in files:
        with contextlib.suppress(OSError):
            sizes.append(file.stat().st_size)
    total = sum(sizes)
    names = tuple(str(f) for f in files)
    if not files:
        return ReadAhead(files=(), total_bytes=0, skipped="no weight file found")
    if total > available_bytes // AVAILABLE_SHARE:
        return ReadAhead(
            files=names,
            total_bytes=total,
            skipped=(
                f"{_size(total)} is more than half the {_size(available_bytes)} of memory available"
            ),
        )
    for file in files:
        with contextlib.suppress(OSError):
            fd = os.open(file, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
            finally:
                os.close(fd)
    return ReadAhead(files=names, total_bytes=total)
