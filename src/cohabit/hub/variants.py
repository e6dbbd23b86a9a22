"""GGUF variants of a repo: which quantization each `.gguf` file carries (split files
`…-00001-of-00003.gguf` make one variant), and the default choice — the largest variant whose
estimate fits the largest free device of the fleet. Pure: sizes and estimates come in as
values. Used by the service's variant route and by `cohabit models pull`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cohabit.units import format_gib

# The quantization names llama.cpp's `llama-quantize` writes into file names (its
# tools/quantize/quantize.cpp QUANT_OPTIONS), plus the float types.
_QUANT = re.compile(
    r"(?:^|[-._/])"
    r"(I?Q\d_(?:K_[A-Z]+|K|\d|[A-Z]+)|TQ\d_\d|MXFP4(?:_MOE)?|BF16|F16|F32)"
    r"(?=[-._/]|$)",
    re.IGNORECASE,
)
_SHARD = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


@dataclass(frozen=True, slots=True, kw_only=True)
class Variant:
    """One quantization: its files (shards in order) and their total size."""

    name: str  # upper case, as llama.cpp spells it: Q4_K_M, Q8_0, F16
    files: tuple[str, ...]
    size_bytes: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Choice:
    variant: Variant
    fits: bool
    reason: str  # one line: why this one


def quantization_of(filename: str) -> str | None:
    """`Qwen2.5-0.5B-Instruct-Q4_K_M.gguf` → `Q4_K_M`; a file without one → None."""
    if not filename.lower().endswith(".gguf"):
        return None
    matches = _QUANT.findall(filename)
    return matches[-1].upper() if matches else None


def variants_of(files: Mapping[str, int | None]) -> list[Variant]:
    """Group a repo's `.gguf` files (name → size) by quantization, smallest first. Files
    with no quantization in their name (e.g. `mmproj` projectors) belong to none."""
    groups: dict[str, list[str]] = {}
    for name in files:
        quant = quantization_of(name)
        if quant is not None and "mmproj" not in name.lower():
            groups.setdefault(quant, []).append(name)
    found = [
        Variant(
            name=quant,
            files=tuple(sorted(names)),
            size_bytes=sum(files[name] or 0 for name in names),
        )
        for quant, names in groups.items()
    ]
    return sorted(found, key=lambda v: (v.size_bytes, v.name))


def first_file(variant: Variant) -> str:
    """The file an engine is pointed at: the only one, or shard 00001 of a split model."""
    for name in variant.files:
        shard = _SHARD.search(name)
        if shard is None or int(shard.group(1)) == 1:
            return name
    return variant.files[0]


def choose(
    variants: Sequence[Variant],
    needed_bytes: Mapping[str, int],
    *,
    largest_free_bytes: int,
    where: str,
) -> Choice:
    """The largest variant whose estimate (`needed_bytes`, by variant name) fits
    `largest_free_bytes`; when none does, the smallest, marked as not fitting.

    Q4_K_M needing 5.2 GiB, Q8_0 9.1 GiB, F16 16.4 GiB with 12 GiB free on node-a gpu 0 →
    Q8_0: "Q8_0 is the largest variant that fits: needs 9.1 GiB, node-a gpu 0 has 12 GiB free".
    """
    if not variants:
        raise ValueError("no GGUF variants to choose from")
    free = format_gib(largest_free_bytes)
    fitting = [v for v in variants if needed_bytes.get(v.name, v.size_bytes) <= largest_free_bytes]
    if fitting:
        best = max(fitting, key=lambda v: (v.size_bytes, v.name))
        need = format_gib(needed_bytes.get(best.name, best.size_bytes))
        return Choice(
            variant=best,
            fits=True,
            reason=(
                f"{best.name} is the largest variant that fits: needs {need}, "
                f"{where} has {free} free"
            ),
        )
    smallest = min(variants, key=lambda v: (needed_bytes.get(v.name, v.size_bytes), v.name))
    need = format_gib(needed_bytes.get(smallest.name, smallest.size_bytes))
    return Choice(
        variant=smallest,
        fits=False,
        reason=(
            f"no variant fits the largest free device ({where}, {free} free); "
            f"{smallest.name}, the smallest, needs {need}"
        ),
    )
