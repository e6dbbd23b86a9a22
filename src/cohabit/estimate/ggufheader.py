"""A GGUF file's header read without trusting it: the metadata key/values and the tensor infos,
nothing of the tensor data. Every count and length is checked against the bytes left in the
file and against fixed caps before anything is kept, and the read stops past a time ceiling,
so a crafted header costs a few tens of MiB at worst (a few hundred KiB for real files) and
is refused within milliseconds. `checkpoint.py` (the one caller) makes a ModelShape of it.

The layout is llama.cpp's (ggml/include/gguf.h; the checks follow gguf_init_from_reader in
ggml/src/gguf.cpp): "GGUF", u32 version, u64 tensor count, u64 key/value count; per pair a
string key, a u32 type and the value (an array is a u32 item type, a u64 count and the items;
arrays of arrays are refused, as llama.cpp refuses them); per tensor a string name (under 64
bytes), a u32 dimension count (at most 4), the dimensions, a u32 ggml type and a u64 offset
into the data section, which starts at the next multiple of `general.alignment` (default 32).
A string is a u64 length and that many bytes. Files are little-endian; a version that reads
as 0x03000000 marks a big-endian file (gguf-py/gguf/gguf_reader.py reads those too).
"""

from __future__ import annotations

import struct
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from cohabit.estimate.errors import ModelNotFound, UnsupportedModel
from cohabit.estimate.limits import open_model_file
from cohabit.estimate.shape import TensorInfo

# Caps. Real files stay far below each (Llama-3: 291 tensors, 128,256 tokens, ~25 keys), while
# together they keep what a crafted header can make us hold to a few tens of MiB.
MAX_KEYS = 65_536
MAX_TENSORS = 131_072  # ~200 bytes kept per tensor: ≤ 26 MiB
MAX_ARRAY_ITEMS = 1 << 24  # walked, not kept: the largest vocabularies hold ~262k tokens
MAX_KEPT_ITEMS = 4_096  # numeric arrays up to this length are kept (per-layer head counts)
MAX_KEPT_STRING_BYTES = 1_024  # longer strings (chat templates, licences) are checked, skipped
MAX_KEY_BYTES = 1_024
MAX_NAME_BYTES = 63  # GGML_MAX_NAME (64) counts the terminating NUL
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_SECONDS = 5.0  # a header that takes longer to walk is refused
_WINDOW_BYTES = 1 << 20  # bytes read from the file at a time
_CHECK_EVERY = 4_096  # array items walked between two looks at the clock

# gguf_type: (name, struct code, size); 8 is STRING and 9 ARRAY, handled apart.
_SCALARS: dict[int, tuple[str, str, int]] = {
    0: ("UINT8", "B", 1),
    1: ("INT8", "b", 1),
    2: ("UINT16", "H", 2),
    3: ("INT16", "h", 2),
    4: ("UINT32", "I", 4),
    5: ("INT32", "i", 4),
    6: ("FLOAT32", "f", 4),
    7: ("BOOL", "?", 1),
    10: ("UINT64", "Q", 8),
    11: ("INT64", "q", 8),
    12: ("FLOAT64", "d", 8),
}
_STRING, _ARRAY = 8, 9

Scalar = int | float | bool | str


@dataclass(frozen=True, slots=True, kw_only=True)
class GGUFArray:
    """An array value: its item type, its length, and its items when they are numbers and
    there are at most MAX_KEPT_ITEMS of them (None otherwise: token lists are only counted)."""

    item_type: str
    length: int
    values: tuple[int | float | bool, ...] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class GGUFHeader:
    """What the header says. `metadata` leaves out strings longer than MAX_KEPT_STRING_BYTES."""

    version: int
    metadata: Mapping[str, Scalar | GGUFArray]
    tensors: tuple[TensorInfo, ...]
    data_offset: int


class _Bad(Exception):
    """Internal: the header is damaged; the message says how (the path is added once)."""


class _Cursor:
    """Reads forward through the file in windows, refusing to go past its end."""

    def __init__(self, handle: BinaryIO, size: int, deadline: float) -> None:
        self.handle = handle
        self.size = size
        self.deadline = deadline
        self.pos = 0
        self._buf = b""
        self._start = 0
        self.order = "<"
        self._structs: dict[str, struct.Struct] = {}

    def use_big_endian(self) -> None:
        self.order = ">"
        self._structs.clear()

    @property
    def remaining(self) -> int:
        return self.size - self.pos

    def length_reader(self) -> Callable[[bytes, int], tuple[int]]:
        """struct's unpack_from for a string length in this file's byte order."""
        return struct.Struct(self.order + "Q").unpack_from

    def window(self, n: int) -> tuple[bytes, int]:
        """The buffer holding [pos, pos + n) and pos's index in it."""
        if n > self.remaining:
            raise _Bad(f"ends {n - self.remaining:,} bytes short at offset {self.pos:,}")
        index = self.pos - self._start
        if index < 0 or index + n > len(self._buf):
            self.handle.seek(self.pos)
            self._buf = self.handle.read(max(n, _WINDOW_BYTES))
            self._start = self.pos
            index = 0
            if len(self._buf) < n:
                raise _Bad("changed size while being read")
        return self._buf, index

    def unpack(self, code: str) -> int | float | bool:
        fmt = self._structs.get(code)
        if fmt is None:
            fmt = self._structs[code] = struct.Struct(self.order + code)
        buf, index = self.window(fmt.size)
        self.pos += fmt.size
        value: int | float | bool = fmt.unpack_from(buf, index)[0]
        return value

    def u32(self) -> int:
        return int(self.unpack("I"))

    def u64(self) -> int:
        return int(self.unpack("Q"))

    def take(self, n: int) -> bytes:
        buf, index = self.window(n)
        self.pos += n
        return buf[index : index + n]

    def skip(self, n: int) -> None:
        if n > self.remaining:
            raise _Bad(f"ends {n - self.remaining:,} bytes short at offset {self.pos:,}")
        self.pos += n

    def check_clock(self) -> None:
        if time.monotonic() > self.deadline:
            raise _Bad(f"header takes over {MAX_SECONDS:g} s to read (at offset {self.pos:,})")

    def string(self, what: str, *, cap: int) -> str | None:
        """A string's text when it is at most `cap` bytes, else None (skipped)."""
        length = self.u64()
        if length > self.remaining:
            raise _Bad(f"{what} claims {length:,} bytes but only {self.remaining:,} bytes remain")
        if length > cap:
            self.skip(length)
            return None
        return self.take(length).decode("utf-8", errors="replace")


def read_gguf_header(path: Path) -> GGUFHeader:
    """The metadata and tensor infos of the GGUF file at `path`.

    Raises ModelNotFound when the file cannot be opened, UnsupportedModel (one line naming the
    file and the damage) when the header is not a sound GGUF header.
    """
    try:
        with open_model_file(path) as handle:
            size = handle.seek(0, 2)
            cursor = _Cursor(handle, size, time.monotonic() + MAX_SECONDS)
            return _read(cursor)
    except _Bad as bad:
        raise UnsupportedModel(f"{path}: not a readable GGUF file: {bad}") from None
    except OSError as err:
        raise ModelNotFound(f"{path}: cannot read ({err.strerror or err})") from None


def _read(cur: _Cursor) -> GGUFHeader:
    if cur.size < 24 or cur.take(4) != b"GGUF":
        raise _Bad("no GGUF magic at the start")
    version = cur.u32()
    if version & 0xFFFF == 0:  # written on a big-endian host
        cur.use_big_endian()
        version = int.from_bytes(version.to_bytes(4, "little"), "big")
    if version not in (2, 3):
        raise _Bad(f"GGUF version {version} (versions 2 and 3 are read)")
    n_tensors, n_kv = cur.u64(), cur.u64()
    # The smallest pair is 14 bytes (8-byte length, a 1-byte key, type, a 1-byte value); the
    # smallest tensor info 25 (length, 1-byte name, dimension count, type, offset).
    _check_count("key/value count", n_kv, MAX_KEYS, 14, cur.remaining)
    _check_count("tensor count", n_tensors, MAX_TENSORS, 25, cur.remaining)
    metadata: dict[str, Scalar | GGUFArray] = {}
    seen: set[str] = set()
    for index in range(n_kv):
        key = cur.string(f"key {index}", cap=MAX_KEY_BYTES)
        if key is None:
            raise _Bad(f"key {index} is longer than {MAX_KEY_BYTES:,} bytes")
        if not key or key in seen:
            raise _Bad(f"key {index} is {'empty' if not key else f'a duplicate of {key!r}'}")
        seen.add(key)
        value = _value(cur, key, cur.u32())
        if value is not None:
            metadata[key] = value
        cur.check_clock()
    alignment = metadata.get("general.alignment", 32)
    if (
        not isinstance(alignment, int)
        or isinstance(alignment, bool)
        or alignment <= 0
        or alignment & (alignment - 1)
    ):
        raise _Bad(f"general.alignment {alignment!r} is not a power of two")
    tensors = _tensors(cur, n_tensors)
    data_offset = -(-cur.pos // alignment) * alignment
    expected = 0
    for tensor, offset in tensors:
        if offset != expected:
            raise _Bad(f"tensor {tensor.name!r} has offset {offset:,}, expected {expected:,}")
        expected += -(-tensor.nbytes // alignment) * alignment
        if data_offset + offset + tensor.nbytes > cur.size:
            raise _Bad(
                f"tensor {tensor.name!r} ends at byte {data_offset + offset + tensor.nbytes:,} "
                f"of a {cur.size:,}-byte file"
            )
    return GGUFHeader(
        version=version,
        metadata=metadata,
        tensors=tuple(tensor for tensor, _ in tensors),
        data_offset=data_offset,
    )


def _check_count(what: str, count: int, cap: int, min_bytes: int, remaining: int) -> None:
    if count * min_bytes > remaining:
        raise _Bad(
            f"{what} {count:,} needs at least {count * min_bytes:,} bytes "
            f"but only {remaining:,} bytes remain"
        )
    if count > cap:
        raise _Bad(f"{what} {count:,} is over the limit of {cap:,}")


def _value(cur: _Cursor, key: str, kind: int) -> Scalar | GGUFArray | None:
    if kind in _SCALARS:
        return cur.unpack(_SCALARS[kind][1])
    if kind == _STRING:
        return cur.string(f"value of {key!r}", cap=MAX_KEPT_STRING_BYTES)
    if kind != _ARRAY:
        raise _Bad(f"key {key!r} has unknown value type {kind}")
    item_kind, count = cur.u32(), cur.u64()
    if item_kind == _STRING:
        name, item_bytes = "STRING", 8  # each string's length; its bytes are checked as walked
    elif item_kind in _SCALARS:
        name, _, item_bytes = _SCALARS[item_kind]
    else:
        raise _Bad(f"metadata array {key!r} has item type {item_kind}, which is not allowed")
    if count * item_bytes > cur.remaining:
        raise _Bad(
            f"metadata array {key!r} claims {count:,} items but only {cur.remaining:,} bytes remain"
        )
    if count > MAX_ARRAY_ITEMS:
        raise _Bad(
            f"metadata array {key!r} claims {count:,} items, over the limit of {MAX_ARRAY_ITEMS:,}"
        )
    if item_kind == _STRING:
        _walk_strings(cur, key, count)
        return GGUFArray(item_type=name, length=count)
    if count > MAX_KEPT_ITEMS:
        cur.skip(count * item_bytes)
        return GGUFArray(item_type=name, length=count)
    raw = cur.take(count * item_bytes)
    values = struct.unpack(f"{cur.order}{count}{_SCALARS[item_kind][1]}", raw)
    return GGUFArray(item_type=name, length=count, values=values)


def _walk_strings(cur: _Cursor, key: str, count: int) -> None:
    """Step over `count` strings, checking each length against the bytes left. The strings
    that lie whole inside the read window are stepped over in a tight loop (a 262,144-token
    vocabulary in a tenth of a second); one that crosses the window's end goes the slow way."""
    index = 0
    length_at = cur.length_reader()
    while index < count:
        buf, start = cur.window(8)
        pos, end = start, len(buf)
        stop = min(count, index + _CHECK_EVERY)
        while index < stop and pos + 8 <= end:
            after = pos + 8 + length_at(buf, pos)[0]
            if after > end:
                break
            pos = after
            index += 1
        cur.pos += pos - start
        if index < stop:  # the next string, or its length, crosses the window's end
            length = cur.u64()
            if length > cur.remaining:
                raise _Bad(
                    f"metadata array {key!r} item {index:,} claims {length:,} bytes but "
                    f"only {cur.remaining:,} bytes remain"
                )
            cur.skip(length)
            index += 1
        cur.check_clock()


def _tensors(cur: _Cursor, count: int) -> list[tuple[TensorInfo, int]]:
    tensors: list[tuple[TensorInfo, int]] = []
    names: set[str] = set()
    for index in range(count):
        name = cur.string(f"tensor {index}'s name", cap=MAX_NAME_BYTES)
        if name is None:
            raise _Bad(f"tensor {index}'s name is {MAX_NAME_BYTES + 1} bytes or longer")
        if name in names:
            raise _Bad(f"tensor name {name!r} appears twice")
        names.add(name)
        n_dims = cur.u32()
        if n_dims > MAX_DIMS:
            raise _Bad(f"tensor {name!r} has {n_dims:,} dimensions (at most {MAX_DIMS})")
        dims = [int(cur.unpack("q")) for _ in range(n_dims)]
        if any(d < 0 for d in dims):
            raise _Bad(f"tensor {name!r} has a negative dimension {dims}")
        numel = 1
        for d in dims:
            numel *= d
        if numel >= 1 << 63:
            raise _Bad(f"tensor {name!r} has {numel:,} elements, more than an int64 holds")
        kind = cur.u32()
        try:
            ggml_type = GGMLQuantizationType(kind)
            block, type_size = GGML_QUANT_SIZES[ggml_type]
        except (ValueError, KeyError):
            raise _Bad(f"tensor {name!r} has unknown ggml type {kind}") from None
        row = dims[0] if dims else 1
        if row % block:
            raise _Bad(
                f"tensor {name!r} of type {ggml_type.name} has rows of {row:,} elements, "
                f"not a multiple of its block of {block}"
            )
        offset = cur.u64()
        tensors.append(
            (
                TensorInfo(
                    name=name,
                    dtype=ggml_type.name,
                    numel=numel,
                    nbytes=numel // block * type_size,
                ),
                offset,
            )
        )
        if index % _CHECK_EVERY == 0:
            cur.check_clock()
    return tensors
