"""Where a ModelShape comes from: a config.json, a model directory (config + safetensors
headers or a .gguf), a .gguf file, or a Hugging Face repo id. The only module here that reads
files; tensor bytes come from headers, never from loading weights. Called by `estimate.py`.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cohabit.estimate.errors import ModelNotFound, UnsupportedModel
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

MAX_HEADER_BYTES = 100 * 1024 * 1024  # safetensors caps its JSON header at 100 MB too
INDEX_NAME = "model.safetensors.index.json"


def read_config(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelNotFound(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise UnsupportedModel(f"{path}: not a readable JSON config ({err})") from None
    if not isinstance(data, dict):
        raise UnsupportedModel(f"{path}: config.json is not a JSON object")
    return data


def read_safetensors_header(path: Path) -> tuple[TensorInfo, ...]:
    """Tensor names, dtypes and byte sizes from one .safetensors file: an 8-byte little-endian
    length, then that many bytes of JSON. Nothing past the header is read."""
    try:
        with path.open("rb") as handle:
            prefix = handle.read(8)
            if len(prefix) != 8:
                raise UnsupportedModel(f"{path}: too short to be a safetensors file")
            (length,) = struct.unpack("<Q", prefix)
            if length > MAX_HEADER_BYTES:
                raise UnsupportedModel(f"{path}: safetensors header of {length} bytes")
            header = json.loads(handle.read(length))
    except OSError as err:
        raise ModelNotFound(f"{path}: cannot read ({err.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise UnsupportedModel(f"{path}: safetensors header is not JSON") from None
    tensors = []
    for name, info in header.items():
        if name == "__metadata__" or not isinstance(info, dict):
            continue
        start, end = info["data_offsets"]
        tensors.append(
            TensorInfo(
                name=name,
                dtype=str(info["dtype"]),
                numel=math.prod(int(d) for d in info["shape"]),
                nbytes=int(end) - int(start),
            )
        )
    return tuple(tensors)


def safetensors_bytes(directory: Path) -> CheckpointBytes | None:
    """Exact bytes of the safetensors checkpoint in `directory`: every shard's header when the
    shards are present, else the index's `metadata.total_size`, else None."""
    files = sorted(directory.glob("*.safetensors"))
    if files:
        tensors: list[TensorInfo] = []
        for file in files:
            tensors.extend(read_safetensors_header(file))
        return CheckpointBytes(
            format="safetensors",
            total_bytes=sum(t.nbytes for t in tensors),
            tensors=tuple(tensors),
            file_count=len(files),
        )
    index = directory / INDEX_NAME
    if index.is_file():
        data = read_config(index)
        total = (data.get("metadata") or {}).get("total_size")
        if isinstance(total, int) and total > 0:
            return CheckpointBytes(format="safetensors", total_bytes=total, file_count=0)
    return None


def _gguf_value(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def shape_from_gguf(path: Path) -> ModelShape:
    """ModelShape and exact tensor bytes from a GGUF file's metadata (`gguf` package).

    A damaged file can fail anywhere in the reader's parsing (bad magic, truncated arrays,
    out-of-range offsets); every such failure is the same user problem: not a readable GGUF.
    """
    try:
        return _shape_from_gguf(path)
    except (OSError, ValueError, IndexError, KeyError, TypeError, struct.error) as err:
        raise UnsupportedModel(f"{path}: not a readable GGUF file ({err})") from None


def _shape_from_gguf(path: Path) -> ModelShape:
    from gguf import GGUFReader, LlamaFileType

    reader = GGUFReader(path)
    arch = _gguf_value(reader, "general.architecture")
    if not isinstance(arch, str):
        raise UnsupportedModel(f"{path}: GGUF has no general.architecture")

    def num(key: str, default: int | None = None) -> int:
        value = _gguf_value(reader, f"{arch}.{key}")
        if isinstance(value, list):
            value = max(value) if value else None
        if value is None:
            if default is None:
                raise UnsupportedModel(f"{path}: GGUF has no {arch}.{key}")
            return default
        return int(value)

    tensors = tuple(
        TensorInfo(
            name=str(t.name),
            dtype=t.tensor_type.name,
            numel=int(t.n_elements),
            nbytes=int(t.n_bytes),
        )
        for t in reader.tensors
    )
    names = {t.name for t in tensors}
    hidden = num("embedding_length")
    heads = num("attention.head_count")
    layers = num("block_count")
    tokens = _gguf_value(reader, "tokenizer.ggml.tokens")
    vocab = num("vocab_size", len(tokens) if isinstance(tokens, list) else 0)
    if vocab == 0:
        embd = next((t for t in tensors if t.name == "token_embd.weight"), None)
        vocab = embd.numel // hidden if embd else 0
    if vocab == 0:
        raise UnsupportedModel(f"{path}: GGUF has no vocabulary size")
    file_type = _gguf_value(reader, "general.file_type")
    type_name = "F16"
    if isinstance(file_type, int):
        try:
            type_name = LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            type_name = "F16"
    experts = num("expert_count", 0)
    moe = None
    if experts > 1:
        moe = MoEShape(
            num_experts=experts,
            experts_per_token=num("expert_used_count", 1),
            expert_intermediate_size=num(
                "expert_feed_forward_length", num("feed_forward_length", 4 * hidden)
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
        num_kv_heads=num("attention.head_count_kv", heads),
        head_dim=num("attention.key_length", hidden // heads),
        intermediate_size=num("feed_forward_length", 4 * hidden),
        vocab_size=vocab,
        dtype="float16",
        tie_word_embeddings="output.weight" not in names,
        max_model_len=num("context_length", 2048),
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
        TensorInfo(
            name=tensor_name,
            dtype=str(info.dtype),
            numel=math.prod(info.shape),
            nbytes=int(info.data_offsets[1] - info.data_offsets[0]),
        )
        for file_meta in meta.files_metadata.values()
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
