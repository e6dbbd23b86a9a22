"""Where a ModelShape comes from: a config.json, a model directory (config + safetensors
headers or a .gguf), a .gguf file, or a Hugging Face repo id. With `ggufheader.py`, the only
module here that reads files; tensor bytes come from headers, never from loading weights, and
every file is treated as untrusted: sizes are capped and checked before anything is read on.
Called by `estimate.py`, model registration and the spawner.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gguf import LlamaFileType

from cohabit.estimate.errors import ModelNotFound, UnsupportedModel
from cohabit.estimate.ggufheader import GGUFArray, read_gguf_header
from cohabit.estimate.limits import MAX_DIMENSION, MAX_LAYERS, open_model_file, whole_number
from cohabit.estimate.shape import (
    FULL,
    SLIDING,
    CheckpointBytes,
    ModelShape,
    MoEShape,
    QuantSpec,
    TensorInfo,
    shape_from_config,
)
from cohabit.yamlfile import strict_json

# Caps on what a model directory may make us read. A config.json is a few KiB (the largest,
# with vision and quantization sections, stay under 100 KiB); safetensors caps its own JSON
# header at 100 MB, but a header that size is millions of entries and about a GB of Python
# objects, while real shards list a few thousand tensors in well under 1 MiB.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
MAX_INDEX_BYTES = 32 * 1024 * 1024  # an index maps every tensor to its shard: ~90 B a tensor
MAX_HEADER_BYTES = 16 * 1024 * 1024
MAX_HEADER_TENSORS = 200_000
MAX_TENSOR_DIMS = 8
# A whole checkpoint: DeepSeek-V3 has 163 shards and ~91,000 tensors (experts unmerged).
MAX_SHARDS = 4_096
MAX_CHECKPOINT_TENSORS = 500_000
INDEX_NAME = "model.safetensors.index.json"

# Bits per element of each safetensors dtype (huggingface/safetensors, safetensors/src/tensor.rs:
# `Dtype` and its `bitsize`).
SAFETENSORS_DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}


def read_config(path: Path, *, limit: int = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """A JSON object from a config.json-like file of at most `limit` bytes."""
    try:
        with open_model_file(path) as handle:
            data = handle.read(limit + 1)
    except OSError as err:
        raise UnsupportedModel(f"{path}: not readable ({err.strerror or err})") from None
    if len(data) > limit:
        raise UnsupportedModel(f"{path}: larger than {limit:,} bytes, more than a config holds")
    try:
        parsed = strict_json(data)
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise UnsupportedModel(f"{path}: not a readable JSON config ({err})") from None
    if not isinstance(parsed, dict):
        raise UnsupportedModel(f"{path}: config.json is not a JSON object")
    return parsed


def read_safetensors_header(path: Path) -> tuple[TensorInfo, ...]:
    """Tensor names, dtypes and byte sizes from one .safetensors file: an 8-byte little-endian
    length, then that many bytes of JSON, then the tensor data. Nothing past the header is read.

    The header is checked as the safetensors library checks it before loading
    (safetensors/src/tensor.rs, `Metadata::validate`): each tensor has a known dtype, a shape
    of whole numbers and `data_offsets` [start, end] whose span is exactly its elements × the
    dtype's size; the spans tile the data section, which ends where the file ends.
    """
    try:
        with open_model_file(path) as handle:
            size = handle.seek(0, 2)
            handle.seek(0)
            prefix = handle.read(8)
            if len(prefix) != 8:
                raise UnsupportedModel(f"{path}: too short to be a safetensors file")
            (length,) = struct.unpack("<Q", prefix)
            if length > size - 8:
                raise UnsupportedModel(
                    f"{path}: safetensors header claims {length:,} bytes but only "
                    f"{size - 8:,} bytes remain"
                )
            if length > MAX_HEADER_BYTES:
                raise UnsupportedModel(
                    f"{path}: safetensors header of {length:,} bytes is over the limit of "
                    f"{MAX_HEADER_BYTES:,}"
                )
            raw = handle.read(length)
    except OSError as err:
        raise ModelNotFound(f"{path}: cannot read ({err.strerror or err})") from None
    objects = 0

    def count_objects(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        # Refuse early: each tensor is one JSON object, so a header with far more objects
        # than tensors we accept is stopped before it is all built.
        nonlocal objects
        objects += 1
        if objects > MAX_HEADER_TENSORS + 2:
            raise ValueError(f"more than {MAX_HEADER_TENSORS:,} entries")
        return dict(pairs)

    try:
        header = strict_json(raw, object_hook=count_objects)
    except ValueError as err:
        raise UnsupportedModel(f"{path}: safetensors header is not valid JSON ({err})") from None
    if not isinstance(header, dict):
        raise UnsupportedModel(f"{path}: safetensors header is not a JSON object")
    entries = sorted(
        (
            _safetensors_entry(path, name, info)
            for name, info in header.items()
            if name != "__metadata__"
        ),
        key=lambda entry: entry[1],
    )
    end = 0
    for tensor, start in entries:
        if start != end:
            raise UnsupportedModel(
                f"{path}: tensor {tensor.name!r} starts at data byte {start:,}, expected {end:,} "
                "(tensors must tile the data section)"
            )
        end = start + tensor.nbytes
    if 8 + length + end != size:
        raise UnsupportedModel(
            f"{path}: tensors end at data byte {end:,} but the data section holds "
            f"{size - 8 - length:,} bytes"
        )
    return tuple(tensor for tensor, _ in entries)


def _safetensors_entry(path: Path, name: str, info: Any) -> tuple[TensorInfo, int]:
    """One header entry as a TensorInfo and its start offset, or one line saying what is off."""
    where = f"{path}: tensor {name!r}"
    if not isinstance(info, dict):
        raise UnsupportedModel(f"{where}: expected an object, got {type(info).__name__}")
    missing = [key for key in ("dtype", "shape", "data_offsets") if key not in info]
    if missing:
        raise UnsupportedModel(f"{where}: no {' or '.join(missing)}")
    dtype, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
    bits = SAFETENSORS_DTYPE_BITS.get(dtype) if isinstance(dtype, str) else None
    if bits is None:
        raise UnsupportedModel(f"{where}: unknown dtype {dtype!r}")
    if (
        not isinstance(shape, list)
        or len(shape) > MAX_TENSOR_DIMS
        or not all(
            isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 1 << 63 for d in shape
        )
    ):
        raise UnsupportedModel(f"{where}: shape {shape!r} is not a list of whole numbers")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offsets)
        and offsets[0] <= offsets[1]
    ):
        raise UnsupportedModel(f"{where}: data_offsets {offsets!r} is not [start, end]")
    numel = math.prod(shape)
    start, end = offsets
    if numel * bits % 8 or end - start != numel * bits // 8:
        raise UnsupportedModel(
            f"{where}: {dtype} shape {shape} is {numel * bits / 8:,g} bytes but data_offsets "
            f"span {end - start:,}"
        )
    return TensorInfo(name=name, dtype=dtype, numel=numel, nbytes=end - start), start


def safetensors_bytes(directory: Path) -> CheckpointBytes | None:
    """Exact bytes of the safetensors checkpoint in `directory`: every shard's header when the
    shards are present, else the index's `metadata.total_size`, else None."""
    files = sorted(directory.glob("*.safetensors"))
    if len(files) > MAX_SHARDS:
        raise UnsupportedModel(
            f"{directory}: {len(files):,} safetensors files, over the limit of {MAX_SHARDS:,}"
        )
    if files:
        tensors: list[TensorInfo] = []
        for file in files:
            tensors.extend(read_safetensors_header(file))
            if len(tensors) > MAX_CHECKPOINT_TENSORS:
                raise UnsupportedModel(
                    f"{directory}: over {MAX_CHECKPOINT_TENSORS:,} tensors in its safetensors files"
                )
        return CheckpointBytes(
            format="safetensors",
            total_bytes=sum(t.nbytes for t in tensors),
            tensors=tuple(tensors),
            file_count=len(files),
        )
    index = directory / INDEX_NAME
    if index.is_file():
        metadata = read_config(index, limit=MAX_INDEX_BYTES).get("metadata")
        total = metadata.get("total_size") if isinstance(metadata, dict) else None
        if isinstance(total, int | float) and not isinstance(total, bool):
            total_bytes = whole_number(total, key="metadata.total_size", where=str(index))
            if total_bytes > 0:
                return CheckpointBytes(format="safetensors", total_bytes=total_bytes, file_count=0)
    return None


def shape_from_gguf(path: Path) -> ModelShape:
    """ModelShape and exact tensor bytes from a GGUF file's header (`ggufheader.py`, which
    checks every count and length before it reads on). Numbers the formulas use are checked as
    config.json's are: whole, in range, and the layer count capped."""
    header = read_gguf_header(path)
    meta = header.metadata
    where = str(path)
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise UnsupportedModel(f"{path}: GGUF has no general.architecture")

    def num(key: str, default: int | None = None, *, maximum: int = MAX_DIMENSION) -> int:
        value = meta.get(f"{arch}.{key}")
        if isinstance(value, GGUFArray):  # per-layer values (head counts): the largest
            value = max(value.values) if value.values else None
        if value is None:
            if default is None:
                raise UnsupportedModel(f"{path}: GGUF has no {arch}.{key}")
            return default
        return whole_number(value, key=f"{arch}.{key}", where=where, maximum=maximum)

    def positive(key: str, default: int | None = None, *, maximum: int = MAX_DIMENSION) -> int:
        value = num(key, default, maximum=maximum)
        if value <= 0:
            raise UnsupportedModel(f"{path}: {arch}.{key} must be positive, got {value}")
        return value

    tensors = header.tensors
    names = {t.name for t in tensors}
    hidden = positive("embedding_length")
    heads = positive("attention.head_count")
    layers = positive("block_count", maximum=MAX_LAYERS)
    tokens = meta.get("tokenizer.ggml.tokens")
    vocab = num("vocab_size", tokens.length if isinstance(tokens, GGUFArray) else 0)
    if vocab == 0:
        embd = next((t for t in tensors if t.name == "token_embd.weight"), None)
        vocab = embd.numel // hidden if embd else 0
    if vocab == 0:
        raise UnsupportedModel(f"{path}: GGUF has no vocabulary size")
    file_type = meta.get("general.file_type")
    type_name = "F16"
    if isinstance(file_type, int) and not isinstance(file_type, bool):
        try:
            type_name = LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            type_name = "F16"
    experts = num("expert_count", 0)
    moe = None
    if experts > 1:
        moe = MoEShape(
            num_experts=experts,
            experts_per_token=positive("expert_used_count", 1),
            expert_intermediate_size=positive(
                "expert_feed_forward_length", positive("feed_forward_length", 4 * hidden)
            ),
        )
    window = num("attention.sliding_window", 0) or None
    kinds: tuple[str, ...] = ()
    if window and arch in ("gemma2", "gemma3", "gpt-oss"):
        period = 6 if arch == "gemma3" else 2
        kinds = tuple(SLIDING if (i + 1) % period else FULL for i in range(layers))
    shape = ModelShape(
        name=path.name,
        architecture=arch,
        model_type=arch,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=positive("attention.head_count_kv", heads),
        head_dim=positive("attention.key_length", max(1, hidden // heads)),
        intermediate_size=positive("feed_forward_length", 4 * hidden),
        vocab_size=vocab,
        dtype="float16",
        tie_word_embeddings="output.weight" not in names,
        max_model_len=positive("context_length", 2048),
        sliding_window=window,
        layer_kinds=kinds,
        moe=moe,
        quant=QuantSpec(method="gguf", gguf_type=type_name),
    )
    return shape.with_checkpoint(
        CheckpointBytes(format="gguf", total_bytes=sum(t.nbytes for t in tensors), tensors=tensors)
    )


def _from_directory(directory: Path, name: str) -> ModelShape:
    config = directory / "config.json"
    if not config.is_file():
        ggufs = sorted(directory.glob("*.gguf"))
        if len(ggufs) == 1:
            return shape_from_gguf(ggufs[0])
        raise ModelNotFound(f"{directory}: no config.json (and not exactly one .gguf) there")
    shape = shape_from_config(read_config(config), name=name)
    checkpoint = safetensors_bytes(directory)
    return shape if checkpoint is None else shape.with_checkpoint(checkpoint)


def _looks_like_repo_id(text: str) -> bool:
    parts = text.split("/")
    return (
        len(parts) == 2
        and all(parts)
        and not text.startswith((".", "~"))
        and not text.endswith((".json", ".gguf"))
    )


def _from_hub(repo_id: str) -> ModelShape:
    """Config (and safetensors headers, by HTTP range requests) from the Hugging Face Hub; the
    local cache first, the network only when the cache misses and HF_HUB_OFFLINE is unset."""
    try:
        from huggingface_hub import get_safetensors_metadata, hf_hub_download
    except ImportError:  # pragma: no cover - a declared dependency
        raise ModelNotFound(f"{repo_id}: huggingface_hub is not installed") from None
    try:
        config_path = Path(hf_hub_download(repo_id, "config.json"))
    except Exception as err:  # the hub raises many kinds; all mean "not available"
        raise ModelNotFound(
            f"{repo_id}: not a local path, and the Hugging Face Hub has no config.json for it "
            f"({type(err).__name__})"
        ) from None
    shape = shape_from_config(read_config(config_path), name=repo_id)
    try:
        meta = get_safetensors_metadata(repo_id)
    except Exception:  # offline, gated or no safetensors: fall back to the architecture
        return shape
    tensors = tuple(
        _safetensors_entry(
            Path(repo_id) / file_name,
            tensor_name,
            {"dtype": info.dtype, "shape": info.shape, "data_offsets": list(info.data_offsets)},
        )[0]
        for file_name, file_meta in meta.files_metadata.items()
        for tensor_name, info in file_meta.tensors.items()
    )
    return shape.with_checkpoint(
        CheckpointBytes(
            format="safetensors",
            total_bytes=sum(t.nbytes for t in tensors),
            tensors=tensors,
            file_count=len(meta.files_metadata),
        )
    )


def load_shape(source: str | Path) -> ModelShape:
    """Resolve a config.json, a model directory, a .gguf file or a repo id to a ModelShape.

    Raises ModelNotFound (nothing there) or UnsupportedModel (files lack what we need).
    """
    text = str(source)
    path = Path(text).expanduser()
    if path.is_dir():
        return _from_directory(path, path.name)
    if path.is_file():
        if path.suffix == ".gguf":
            return shape_from_gguf(path)
        config: Mapping[str, Any] = read_config(path)
        name = path.parent.name if path.name == "config.json" else path.stem
        shape = shape_from_config(config, name=name or path.name)
        checkpoint = safetensors_bytes(path.parent)
        return shape if checkpoint is None else shape.with_checkpoint(checkpoint)
    if isinstance(source, str) and _looks_like_repo_id(text):
        return _from_hub(text)
    raise ModelNotFound(f"{text}: no such file or directory")


def files_fingerprint(source: str | Path) -> str | None:
    """A short digest of the names, sizes and modification times of a local model's files
    (a .gguf, or a directory's config, weights and index); None for anything not on disk.
    Equal digests mean the files an estimate read are still the ones a launch will load."""
    path = Path(source)
    if path.is_file():
        files = [path]
    elif path.is_dir():
        files = sorted(
            p
            for pattern in ("*.json", "*.safetensors", "*.gguf")
            for p in path.glob(pattern)
            if p.is_file()
        )
    else:
        return None
    digest = hashlib.sha256()
    for file in files:
        stat = file.stat()
        digest.update(f"{file.name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]
