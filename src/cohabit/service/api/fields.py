"""The constrained types request bodies are built from: what a name, a path, free text, a
byte count and a JSON object may hold. A value outside them is a 422 naming its field before
anything reaches the store, so SQLite and PostgreSQL answer alike (PostgreSQL refuses NUL
in text, over-long names and NaN in JSON; SQLite stores them all). Used by `schemas.py`."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import AfterValidator, Field, Strict, StringConstraints

from cohabit.store.records import NAME_CHARS

PATH_CHARS = 4096  # Linux PATH_MAX: a longer path cannot name a file
TEXT_CHARS = 65_536  # descriptions: generous, but bounded
JSON_DEPTH = 32  # nesting of config objects; real configs use two or three levels
MAX_BYTES = 2**63 - 1  # a byte count must fit the store's BIGINT

# What the schema shows of `_single_line` (lone surrogates, also refused, cannot be written
# into a UTF-8 document).
_LINE_PATTERN = "^[^\x00-\x1f\x7f-\x9f]*$"


def _is_control(char: str) -> bool:
    code = ord(char)
    return code < 0x20 or 0x7F <= code <= 0x9F or 0xD800 <= code <= 0xDFFF


def _is_unstorable(char: str) -> bool:
    """NUL (PostgreSQL text refuses it) and lone surrogates (not UTF-8)."""
    return char == "\x00" or 0xD800 <= ord(char) <= 0xDFFF


def _refuse(value: str, bad: Callable[[str], bool], what: str) -> str:
    position = next((i for i, char in enumerate(value) if bad(char)), None)
    if position is not None:
        raise ValueError(f"{what} {value[position]!r} at position {position}")
    return value


def _single_line(value: str) -> str:
    """Names, ids and paths: no control character at all."""
    return _refuse(value, _is_control, "contains the control character")


def _free_text(value: str) -> str:
    """Descriptions: tabs and line breaks allowed, other controls not."""
    return _refuse(
        value, lambda c: _is_control(c) and c not in "\t\n\r", "contains the control character"
    )


def _known_home(value: str) -> str:
    """`~user/…` must name a user this machine knows (else expanding it fails later)."""
    if value.startswith("~") and os.path.expanduser(value).startswith("~"):
        user = value[1:].partition("/")[0]
        raise ValueError(f"no such user {user!r} (in {value[: len(user) + 1]!r})")
    return value


def _json_object(value: dict[str, Any]) -> dict[str, Any]:
    _check_json(value, "", 0)
    return value


def _check_json(value: Any, where: str, depth: int) -> None:
    """Finite numbers, text without NUL or lone surrogates, bounded nesting."""
    at = f" at {where}" if where else ""
    if depth > JSON_DEPTH:
        raise ValueError(f"nested deeper than {JSON_DEPTH} levels{at}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value} is not a finite number{at}")
    if isinstance(value, str):
        _refuse(value, _is_unstorable, f"text{at} contains")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_json(key, where, depth + 1)
            _check_json(item, f"{where}.{key}" if where else str(key), depth + 1)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_json(item, f"{where}[{index}]", depth + 1)


_LINE_SCHEMA = Field(json_schema_extra={"pattern": _LINE_PATTERN})

Name = Annotated[
    str, StringConstraints(max_length=NAME_CHARS), AfterValidator(_single_line), _LINE_SCHEMA
]
"""A name, a repo id, an engine name, a label: one line of at most 255 characters."""

LocalPath = Annotated[
    str,
    StringConstraints(max_length=PATH_CHARS),
    AfterValidator(_single_line),
    AfterValidator(_known_home),
    _LINE_SCHEMA,
]
"""A path on the server's machine (or a source that may be one): one line, `~user` known."""

Text = Annotated[str, StringConstraints(max_length=TEXT_CHARS), AfterValidator(_free_text)]
"""Free text (descriptions): line breaks and tabs allowed, other controls not."""

ByteCount = Annotated[float, Strict(), Field(ge=0, le=MAX_BYTES, allow_inf_nan=False)]
"""A count of bytes sent as a JSON number: finite, not negative, fits a BIGINT."""

# A whole number as JSON writes one: true and false are not numbers here, though pydantic's
# lax mode would read them as 1 and 0.
Count = Annotated[int, Strict()]
Fraction = Annotated[float, Strict()]  # the same for a number with a fraction (ints accepted)
JsonObject = Annotated[dict[str, Any], AfterValidator(_json_object)]
"""A free-form object (engine configs): finite numbers, no NUL, bounded nesting."""
