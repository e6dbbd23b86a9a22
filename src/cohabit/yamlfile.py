"""Reading the YAML (or JSON) files people and scripts write (fleet files, request files).

Every problem becomes one `FileProblem` whose message names the file, the entry and what is
wrong, so command lines can print it as one line and exit non-zero. A file is read as JSON when
its name ends in `.json` or its text starts with `{`: JSON is YAML too, but the json module
reads it several times faster than even libyaml (generated inventories run to megabytes). YAML
in the block style programs write is read by `read_block_yaml`, several times faster than
libyaml too; anything else by PyYAML (libyaml's loader where the wheel has it).
Only a regular file of at most `MAX_FILE_BYTES` is read, a key given twice in one mapping is
refused (YAML and JSON parsers keep the last silently), and so is a size over `MAX_SIZE_BYTES`.
"""

from __future__ import annotations

import json
import math
import re
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
    data = dict(pairs)
    if len(data) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {key!r}")
            seen.add(key)
    return data


def _parse_json(path: Path, text: str) -> object:
    try:
        return strict_json(text, object_hook=_unique_keys)
    except json.JSONDecodeError as exc:
        raise FileProblem(f"{path}: not valid JSON (line {exc.lineno}): {exc.msg}") from None
    except ValueError as exc:
        raise FileProblem(f"{path}: not valid JSON: {exc}") from None


def _parse_yaml(path: Path, text: str) -> object:
    data = read_block_yaml(text)
    if data is not NOT_BLOCK_YAML:
        return data
    try:
        return yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise FileProblem(f"{path}: not valid YAML{where}: {problem}") from None
    except RecursionError:
        raise FileProblem(f"{path}: not valid YAML: nested too deeply") from None


# -- The block YAML that generated files are written in, read at the speed of json ---------------
#
# Fleet and request files of thousands of entries are mostly written by programs (PyYAML's
# block style: one `key: value` or `- key: value` per line). `read_block_yaml` reads that
# subset line by line; anything else — flow collections, anchors, tags, block or multi-line
# scalars, comments after a value, a duplicate key, a value PyYAML would turn into a date or a
# non-decimal number, tabs — makes it answer NOT_BLOCK_YAML, and the file goes to PyYAML,
# which reads it (or reports its error) as before. So what it returns is always what PyYAML
# returns for the same text; tests/test_yamlfile.py checks that on generated documents.

NOT_BLOCK_YAML: Any = object()

_PLAIN = r"(?:[A-Za-z0-9_./~+]|-(?=[0-9.]))[^:#\n]*(?::(?! |$)[^:#\n]*)*"
_VALUE = rf"'[^'\n]*'|\"[^\"\\\n]*\"|{_PLAIN}"
# One line: indent, "- ", then `key:` with an optional value, or a value alone; blank and
# comment lines match with every group empty; anything else lands in the last group.
_BLOCK_LINE = re.compile(
    rf"^( *)(- +)?(?:([A-Za-z_][A-Za-z0-9_]*):(?: +({_VALUE})?)? *|({_VALUE}) *|(?:#.*)?|(.+))$",
    re.MULTILINE,
)
# Characters that end a line for YAML but not for the pattern, tabs, and a byte-order mark.
_OUTSIDE_BLOCK_YAML = re.compile("[\t\r\x85\u2028\u2029\ufeff]")
_DECIMAL = re.compile(r"[-+]?(?:0|[1-9][0-9]*)")
_SIMPLE_FLOAT = re.compile(r"[-+]?[0-9]+\.[0-9]*(?:[eE][-+][0-9]+)?")
_BOOL_TAG, _NULL_TAG = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:null"
_INT_TAG, _FLOAT_TAG = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"


class _NotBlockYaml(Exception):
    """The text leaves the subset `read_block_yaml` reads."""


def read_block_yaml(text: str) -> Any:
    """What PyYAML's safe loader reads from `text`, or NOT_BLOCK_YAML when `text` is not
    block YAML of plain or simply quoted one-line scalars (see above)."""
    if (
        _OUTSIDE_BLOCK_YAML.search(text)
        or yaml.reader.Reader.NON_PRINTABLE.search(text)
        # Resolvers registered for any first character or by path: leave them to PyYAML.
        or None in _Loader.yaml_implicit_resolvers
        or _Loader.yaml_path_resolvers
    ):
        return NOT_BLOCK_YAML
    try:
        return _BlockReader().read(text)
    except _NotBlockYaml:
        return NOT_BLOCK_YAML


class _BlockReader:
    """One reading: a stack of open collections, each with the column its keys or dashes
    sit at; a line closes every collection deeper than its indent."""

    def __init__(self) -> None:
        self.scalars: dict[str, Any] = {}
        self.resolvers = _Loader.yaml_implicit_resolvers

    def read(self, text: str) -> Any:
        stack: list[tuple[int, Any]] = []  # (column, dict or list), innermost last
        top_column = -1  # and top: stack[-1], or nothing yet
        top: Any = None
        root: Any = NOT_BLOCK_YAML
        # A key given without a value on its line: its mapping, the key, its column.
        open_key: tuple[dict[Any, Any], Any, int] | None = None
        scalars, scalar = self.scalars, self.scalar
        for indent, dash, key, value, item, other in _BLOCK_LINE.findall(text):
            column = len(indent)
            if (
                value
                and not dash
                and column == top_column
                and open_key is None
                and type(top) is dict
            ):
                # The commonest line by far: one more `key: value` of the open mapping.
                name = scalars[key] if key in scalars else scalar(key)
                if name in top:
                    raise _NotBlockYaml  # PyYAML reports the duplicate with both lines
                top[name] = scalars[value] if value in scalars else scalar(value)
                continue
            if other:
                raise _NotBlockYaml
            if not (dash or key or item):
                continue  # a blank or comment line
            if open_key is not None:
                mapping, name, key_column = open_key
                open_key = None
                if column > key_column or (column == key_column and dash):
                    # The key's value is the block that starts here.
                    mapping[name] = [] if dash else {}
                    stack.append((column, mapping[name]))
                else:
                    mapping[name] = None
            while stack and stack[-1][0] > column:
                stack.pop()
            if dash:
                if not stack:
                    if root is not NOT_BLOCK_YAML:
                        raise _NotBlockYaml
                    root = []
                    stack.append((column, root))
                elif stack[-1][0] != column or type(stack[-1][1]) is not list:
                    raise _NotBlockYaml
                if item:
                    stack[-1][1].append(scalar(item))
                    top_column, top = stack[-1]
                    continue
                if not key:
                    raise _NotBlockYaml  # a dash alone on its line
                entry: dict[Any, Any] = {}
                stack[-1][1].append(entry)
                column += len(dash)
                stack.append((column, entry))
            elif item:
                raise _NotBlockYaml  # a scalar that goes on from the line before
            else:
                if stack and stack[-1][0] == column and type(stack[-1][1]) is list:
                    stack.pop()  # a sequence given as a key's value at the key's indent ends
                if not stack:
                    if root is not NOT_BLOCK_YAML:
                        raise _NotBlockYaml
                    root = {}
                    stack.append((column, root))
                elif stack[-1][0] != column or type(stack[-1][1]) is not dict:
                    raise _NotBlockYaml
            top_column, top = stack[-1]
            name = scalar(key)
            if name in top:
                raise _NotBlockYaml  # PyYAML reports the duplicate with both lines
            if value:
                top[name] = scalar(value)
            else:
                top[name] = None
                open_key = (top, name, column)
        return root

    def scalar(self, text: str) -> Any:
        """A one-line scalar as PyYAML's safe loader reads it: quoted ones as written, plain
        ones through PyYAML's own implicit resolvers (null, bool, decimal int, float)."""
        found = self.scalars.get(text, NOT_BLOCK_YAML)
        if found is not NOT_BLOCK_YAML:
            return found
        first = text[0]
        if first in "'\"":
            found = text[1:-1]
        else:
            plain = text.rstrip(" ")
            found = plain
            for tag, pattern in self.resolvers.get(first, ()):
                if pattern.match(plain):
                    found = _resolved(tag, plain)
                    break
        self.scalars[text] = found
        return found


def _resolved(tag: str, plain: str) -> Any:
    if tag == _NULL_TAG:
        return None
    if tag == _BOOL_TAG:
        return yaml.constructor.SafeConstructor.bool_values[plain.lower()]
    if tag == _INT_TAG and _DECIMAL.fullmatch(plain):
        return int(plain)
    if tag == _FLOAT_TAG and _SIMPLE_FLOAT.fullmatch(plain):
        return float(plain)
    raise _NotBlockYaml  # octal, hex, sexagesimal, .inf, dates, merge keys, …


# Sizes read from text, by the text: a fleet file gives the same few memory sizes thousands of
# times. Only so many are kept, as a long-running server reads file after file.
_SIZES: dict[str, int] = {}
_SIZES_KEPT = 4096


class Entry:
    """One mapping inside a file, with the label that errors carry (e.g. "nodes[1] (spark)").

    The checks below run once per entry of files with tens of thousands of them: each takes
    the common case (a value of the expected type) first, and builds a label only for a
    message."""

    __slots__ = ("_label", "_parent", "_position", "data", "path")

    def __init__(self, path: Path, label: str, data: object) -> None:
        self.path = path
        self._label: str | None = label
        self._parent: tuple[Entry, str] | None = None
        self._position = 0
        if type(data) is not dict and not isinstance(data, Mapping):
            self.fail(f"expected a mapping, got {type(data).__name__}")
        self.data: Mapping[str, Any] = data

    @property
    def label(self) -> str:
        if self._label is None and self._parent is not None:
            parent, key = self._parent
            label = f"{parent.label}.{key}" if parent.label else key
            label += f"[{self._position}]"
            name = self.data.get("name")
            self._label = label if name is None else f"{label} ({name})"
        return self._label or ""

    def fail(self, problem: str) -> NoReturn:
        raise FileProblem(f"{self.path}: {self.label}: {problem}")

    def check_keys(self, allowed: Iterable[str], required: Iterable[str] = ()) -> None:
        data = self.data
        allowed_set = allowed if isinstance(allowed, frozenset) else frozenset(allowed)
        if not data.keys() <= allowed_set:
            unknown = sorted(str(key) for key in data if key not in allowed_set)
            self.fail(f"unknown key {unknown[0]!r} (allowed: {', '.join(sorted(allowed_set))})")
        for key in required:
            if data.get(key) is None:
                self.fail(f"missing {key!r}")

    def string(self, key: str, default: str | None = None) -> str | None:
        value = self.data.get(key, default)
        if value is None:
            return None
        if type(value) is not str and (
            isinstance(value, bool) or not isinstance(value, str | int | float)
        ):
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
        if type(value) is not int and (isinstance(value, bool) or not isinstance(value, int)):
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
        size_bytes = _SIZES.get(value) if type(value) is str else None
        if size_bytes is None:
            try:
                size_bytes = parse_size(value, field=key)
            except SizeError as exc:
                self.fail(str(exc))
            if type(value) is str and len(_SIZES) < _SIZES_KEPT:
                _SIZES[value] = size_bytes
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
        return [self._listed(key, position, item) for position, item in enumerate(value)]

    def _listed(self, key: str, position: int, item: object) -> Entry:
        """Item `position` of this entry's list `key`, labelled only when a message needs it
        (e.g. "nodes[1] (spark)")."""
        entry = Entry.__new__(Entry)
        entry.path = self.path
        entry._label = None
        entry._parent = (self, key)
        entry._position = position
        entry.data = {}
        if type(item) is not dict and not isinstance(item, Mapping):
            entry.fail(f"expected a mapping, got {type(item).__name__}")
        entry.data = item
        return entry
