"""Sizes: integers of bytes inside, strings with a unit at the edges.

Every layer calls `parse_size()` on what a user typed and `format_gib()` for what a user reads;
nothing else converts units. Public "GB" fields count GiB (2**30 bytes): requests round up,
capacities round down (`gib_ceil`, `gib_floor`). Spans of time people read go through
`format_duration()`.
"""

from __future__ import annotations

import math
import re

KIB = 1 << 10
MIB = 1 << 20
GIB = 1 << 30
TIB = 1 << 40
KB = 10**3
MB = 10**6
GB = 10**9
TB = 10**12

_FACTORS: dict[str, int] = {
    "": 1,
    "b": 1,
    "kib": KIB,
    "mib": MIB,
    "gib": GIB,
    "tib": TIB,
    "ki": KIB,
    "mi": MIB,
    "gi": GIB,
    "ti": TIB,
    "kb": KB,
    "mb": MB,
    "gb": GB,
    "tb": TB,
    "k": KB,
    "m": MB,
    "g": GB,
    "t": TB,
}
_SIZE_RE = re.compile(r"^\s*(?P<number>\d+(?:\.\d+)?|\.\d+)\s*(?P<unit>[A-Za-z]*)\s*$")


class SizeError(ValueError):
    """A size that cannot be read: the message names the field and the value."""


def parse_size(value: object, *, field: str = "size") -> int:
    """Read a size given as bytes (int) or a string with a unit; return whole bytes.

    Binary units (KiB, MiB, GiB, TiB, and Kubernetes' Ki/Mi/Gi/Ti) are powers of 1024; decimal
    ones (KB, MB, GB, TB) powers of 1000, as the SI and the Kubernetes quantity format define
    them. Fractions are floored to whole bytes.

    >>> parse_size("16GiB"), parse_size("15360MiB"), parse_size("20GB"), parse_size(1024)
    (17179869184, 16106127360, 20000000000, 1024)

    Raises:
        SizeError: the value is negative, not a number, has an unknown unit, or is a bool.
    """
    if isinstance(value, bool) or value is None:
        raise SizeError(f"{field}: expected a size such as 16GiB, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise SizeError(f"{field}: size must not be negative, got {value}")
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or value < 0:
            raise SizeError(f"{field}: size must be a finite, non-negative number, got {value}")
        return int(value)
    if not isinstance(value, str):
        raise SizeError(f"{field}: expected a size such as 16GiB, got {type(value).__name__}")
    text = value.strip()
    if text.startswith("-"):
        raise SizeError(f"{field}: size must not be negative, got {value!r}")
    match = _SIZE_RE.match(text)
    if match is None:
        raise SizeError(
            f"{field}: cannot read {value!r} as a size (examples: 16GiB, 15360MiB, 20GB)"
        )
    unit = match.group("unit").lower()
    if unit not in _FACTORS:
        raise SizeError(
            f"{field}: unknown unit {match.group('unit')!r} in {value!r} "
            "(use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)"
        )
    number = match.group("number")
    if "." in number:
        whole, _, frac = number.partition(".")
        scale = int("1" + "0" * len(frac))
        numerator = int(whole or "0") * scale + int(frac)
        return numerator * _FACTORS[unit] // scale
    return int(number) * _FACTORS[unit]


def format_gib(size_bytes: int, *, digits: int = 1) -> str:
    """Render bytes for people: ``format_gib(6 * GIB) == "6 GiB"``, ``"4.5 GiB"``.

    Trailing zeros are dropped so whole budgets read as whole numbers.
    """
    text = f"{size_bytes / GIB:.{digits}f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    if text == "-0":
        text = "0"
    return f"{text} GiB"


def format_duration(seconds: float) -> str:
    """Render a span for people, to its largest whole unit: ``"45 s"``, ``"12 min"``,
    ``"3 h 5 min"``, ``"2 d 4 h"``."""
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{whole} s"
    minutes, _ = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def gib_ceil(size_bytes: int) -> int:
    """Whole GiB covering a request (a 6.1 GiB budget asks for 7)."""
    return -(-size_bytes // GIB)


def gib_floor(size_bytes: int) -> int:
    """Whole GiB a capacity can promise (a 15.7 GiB card offers 15)."""
    return size_bytes // GIB


def format_age(seconds: float) -> str:
    """A time span for people, in its largest whole unit: "12 s", "5 min", "3 h", "2 d".

    >>> format_age(59.9), format_age(61), format_age(7200), format_age(200_000)
    ('59 s', '1 min', '2 h', '2 d')
    """
    whole = max(0, int(seconds))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if whole >= size:
            return f"{whole // size} {unit}"
    return f"{whole} s"
