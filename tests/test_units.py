"""Sizes in, bytes inside, GiB out."""

from __future__ import annotations

import pytest

from cohabit.units import GB, GIB, MIB, SizeError, format_gib, gib_ceil, gib_floor, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16GiB", 16 * GIB),
        ("15360MiB", 15360 * MIB),
        ("20GB", 20 * GB),
        ("20 gb", 20 * GB),
        ("1.5GiB", 3 * GIB // 2),
        ("512Mi", 512 * MIB),
        ("4096", 4096),
        (1024, 1024),
        (0, 0),
        ("0.5", 0),
    ],
)
def test_parse_size(text: object, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("-1GiB", "vram: size must not be negative"),
        (-5, "vram: size must not be negative"),
        ("16 parsecs", "vram: unknown unit 'parsecs'"),
        ("lots", "vram: cannot read 'lots' as a size"),
        (True, "vram: expected a size"),
        (None, "vram: expected a size"),
        ([16], "vram: expected a size such as 16GiB, got list"),
        (float("nan"), "vram: size must be a finite"),
    ],
)
def test_bad_sizes_name_the_field(value: object, message: str) -> None:
    with pytest.raises(SizeError, match="^" + message.replace("(", r"\(")):
        parse_size(value, field="vram")


@pytest.mark.parametrize(
    ("size", "text"),
    [(6 * GIB, "6 GiB"), (9 * GIB // 2, "4.5 GiB"), (0, "0 GiB"), (GIB + MIB, "1 GiB")],
)
def test_format_gib(size: int, text: str) -> None:
    assert format_gib(size) == text


def test_gib_rounding_requests_up_capacity_down() -> None:
    assert gib_ceil(6 * GIB + 1) == 7
    assert gib_ceil(6 * GIB) == 6
    assert gib_floor(16 * GIB - 1) == 15
