"""Reading the YAML (or JSON) files people and scripts write (fleet files, request files).

Every problem becomes one `FileProblem` whose message names the file, the entry and what is
wrong, so command lines can print it as one line and exit non-zero. A file is read as JSON when
its name ends in `.json` or its text starts with `{`: JSON is YAML too, but the json module
reads it several times faster than even libyaml (generated inventories run to megabytes).
Only a regular file of at most `MAX_FILE_BYTES` is read, a key given twice in one mapping is
refused (YAML and JSON parsers keep the last silently), and so is a size over `MAX_SIZE_BYTES`.
"""

from __future__ import annotations

import json
import math
import stat
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, NoReturn

import yaml

from cohabit.units import MIB, TIB, SizeError, parse_size

# The largest file read: generated inventories of thousands of nodes stay far below it, and
# `/dev/zero` or a sparse file of a TiB is refused without reading it into memory.
MAX_FILE_BYTES = 16 * MIB
# The largest size one entry may give: 1 PiB is beyond any device or host memory, and far
# below what breaks the sums the planner makes over a fleet.
MAX_SIZE_BYTES = 1024 * TIB
_MERGE_TAG = "tag:yaml.org,2002:merge"

# libyaml's loader when the wheel has it: large request files load several times faster.
_BASE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_BASE_LOADER):  # type: ignore[misc,valid-type]
    """The safe loader, refusing a key given twice in one mapping with the line of both."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[object, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if key in first_line:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first on line {first_line[key]})",
                    key_node.start_mark,
                )
            first_line[key] = line
        return super().construct_mapping(node, deep=deep)  # type: ignore[no-any-return]


class FileProblem(ValueError):
    """A file that cannot be used as written; `str()` is the one line to show."""


def load_mapping(path: Path, *, what: str) -> dict[str, Any]:
    """Parse a YAML or JSON file whose top level must be a mapping."""
    text = _read_text(path, what=what)
    data = _parse_json(path, text) if _is_json(path, text) else _parse_yaml(path, text)
    if not isinstance(data, dict):
        raise FileProblem(f"{path}: expected a mapping at the top of the {what}")
    return data


def _read_text(path: Path, *, what: str) -> str:
    """The file's text, refusing before opening it what is not a regular file (a FIFO would
    block the open, a device never ends) and reading at most `MAX_FILE_BYTES` + 1 bytes, so a
    file that grows while read is refused too."""
    try:
        status = path.stat()
        if not stat.S_ISREG(status.st_mode):
            raise FileProblem(f"{path}: {what} is not a regular file")
        if status.st_size > MAX_FILE_BYTES:
            raise FileProblem(_too_large(path, what))
        with path.open("rb") as file:
            raw = file.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise FileProblem(f"{path}: {what} not found") from None
    except OSError as exc:
        raise FileProblem(f"{path}: cannot read {what}: {exc.strerror}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise FileProblem(_too_large(path, what))
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileProblem(f"{path}: {what} is not UTF-8 text (byte {exc.start:,})") from None


def _too_large(path: Path, what: str) -> str:
    return f"{path}: {what} is larger than {MAX_FILE_BYTES // MIB} MiB"


def _is_json(path: Path, text: str) -> bool:
    return path.suffix.lower() == ".json" or text.lstrip().startswith("{")


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text} is out of range")
    return value


def strict_json(
    data: str | bytes, *, object_hook: Callable[[list[tuple[str, Any]]], Any] | None = None
) -> Any:
    """JSON from a file we did not write: NaN, Infinity and numbers that overflow a float are
    refused (Python's json accepts them), and nesting deep enough to exhaust the stack is a
    ValueError like every other problem (JSONDecodeError, UnicodeDecodeError, digit limits).
    `object_hook` receives each object's pairs (json's object_pairs_hook)."""
    try:
        return json.loads(
            data,
            parse_constant=_no_constant,
            parse_float=_finite_float,
            object_pairs_hook=object_hook,
        )
    except RecursionError:
        raise ValueError("nested too deeply") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for key, value in pairs:
        if key in data:
            raise ValueError(f"duplicate key {key!r}")
        data[key] = value
    return data


def _parse_json(path: Path, text: str) -> object:
    try:
        return strict_json(text, object_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise FileProblem(f"{path}: not valid JSON (line {exc.lineno}): {exc.msg}") from None
    except ValueError as exc:
        raise FileProblem(f"{path}: not valid JSON: {exc}") from None


def _parse_yaml(path: Path, text: str) -> object:
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise FileProblem(f"{path}: not valid YAML{where}: {problem}") from None
    except RecursionError:
        raise FileProblem(f"{path}: not valid YAML: nested too deeply") from None


class Entry:
    """One mapping inside a file, with the label that errors carry (e.g. "nodes[1] (spark)")."""

    def __init__(self, path: Path, label: str, data: object) -> None:
        self.path = path
        self.label = label
        if not isinstance(data, Mapping):
            self.fail(f"expected a mapping, got {type(data).__name__}")
        self.data: Mapping[str, Any] = data

    def fail(self, problem: str) -> NoReturn:
        raise FileProblem(f"{self.path}: {self.label}: {problem}")

    def check_keys(self, allowed: Iterable[str], required: Iterable[str] = ()) -> None:
        allowed_set = set(allowed)
        unknown = sorted(str(key) for key in self.data if key not in allowed_set)
        if unknown:
            self.fail(f"unknown key {unknown[0]!r} (allowed: {', '.join(sorted(allowed_set))})")
        for key in required:
            if self.data.get(key) is None:
                self.fail(f"missing {key!r}")

    def string(self, key: str, default: str | None = None) -> str | None:
        value = self.data.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, str | int | float):
            self.fail(f"{key!r} must be a string, got {value!r}")
        text = str(value).strip()
        if not text:
            self.fail(f"{key!r} must not be empty")
        return text

    def required_string(self, key: str) -> str:
        value = self.string(key)
        if value is None:
            self.fail(f"missing {key!r}")
        return value

    def required_integer(self, key: str, *, minimum: int = 0) -> int:
        value = self.integer(key, minimum=minimum)
        if value is None:
            self.fail(f"missing {key!r}")
        return value

    def required_size(self, key: str) -> int:
        value = self.size(key)
        if value is None:
            self.fail(f"missing {key!r}")
        return value

    def integer(self, key: str, default: int | None = None, *, minimum: int = 0) -> int | None:
        value = self.data.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(f"{key!r} must be a whole number, got {value!r}")
        if value < minimum:
            self.fail(f"{key!r} must be at least {minimum}, got {value}")
        return int(value)

    def boolean(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            self.fail(f"{key!r} must be true or false, got {value!r}")
        return bool(value)

    def size(self, key: str, *, positive: bool = True) -> int | None:
        value = self.data.get(key)
        if value is None:
            return None
        try:
            size_bytes = parse_size(value, field=key)
        except SizeError as exc:
            self.fail(str(exc))
        if positive and size_bytes <= 0:
            self.fail(f"{key!r} must be greater than zero")
        if size_bytes > MAX_SIZE_BYTES:
            self.fail(f"{key!r} must be at most 1 PiB, got {value!r}")
        return size_bytes

    def entries(self, key: str) -> list[Entry]:
        value = self.data.get(key, [])
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail(f"{key!r} must be a list")
        result = []
        for position, item in enumerate(value):
            name = item.get("name") if isinstance(item, Mapping) else None
            label = f"{self.label}.{key}[{position}]" if self.label else f"{key}[{position}]"
            if name is not None:
                label += f" ({name})"
            result.append(Entry(self.path, label, item))
        return result
