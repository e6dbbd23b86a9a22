"""Registering models: a local .gguf file, a local directory with config.json and safetensors,
or a Hugging Face repo id (read from the local Hub cache, or the Hub when online). Each model
gets a default config made from its metadata, so it can be deployed by id at once; its name
must be visible text (`name_problem`) that no other model's is, once normalised. And removing
one (`remove_model`). Called by the models router.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cohabit.estimate import EstimateError
from cohabit.estimate.checkpoint import load_shape
from cohabit.estimate.estimate import LLAMACPP_DEFAULT_CTX
from cohabit.estimate.shape import ModelShape
from cohabit.service.errors import InvalidInput, found
from cohabit.store import catalog
from cohabit.store.catalog import NewFile
from cohabit.store.database import Database
from cohabit.store.records import NAME_CHARS, ModelRecord

HUB = "HubsHf"
_DIRECTORY_FILES = ("*.safetensors", "*.json", "*.model", "*.txt", "*.gguf")
# Characters that reorder or hide text: a name holding one shows as another name.
_BIDI_CONTROLS = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)
_ZERO_WIDTH = frozenset("\u200b\u200c\u200d\u2060\ufeff")
_KINDS = {
    "Cc": "control character",
    "Cf": "invisible formatting character",
    "Cs": "lone surrogate",
    "Co": "private-use character",
    "Cn": "unassigned code point",
    "Zl": "line separator",
    "Zp": "paragraph separator",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class Registration:
    """What a user asked to register: a local path, or a repo id, or both (path wins).
    `path_loc` says where in the request the path came from, for a 422's `loc`."""

    name: str | None = None
    path: str | None = None
    path_loc: tuple[str | int, ...] = ("body", "path")
    repo_id: str | None = None
    description: str | None = None


def name_problem(name: str) -> str | None:
    r"""What makes `name` unfit to name a model, naming the character and its position
    (counted from 0); None when it is fit. A name is visible text: not empty, no space at
    either end, no control, bidirectional, zero-width or other invisible formatting
    character, no line separator, no private-use character (no agreed glyph), no unassigned
    code point (whose normalisation a later Unicode may change). Nothing is stripped: what
    is stored is what was asked for.

    >>> name_problem("llama\u202egguf")
    'has the bidirectional control U+202E RIGHT-TO-LEFT OVERRIDE at position 5'
    """
    if not name:
        return "is empty"
    for position, char in enumerate(name):
        kind = _invisible(char)
        if kind is not None:
            return f"has the {kind} {_spelled(char)} at position {position}"
    for position in (0, len(name) - 1):
        if name[position].isspace():
            end = "starts" if position == 0 else "ends"
            return f"{end} with the space {_spelled(name[position])} at position {position}"
    return None


def _invisible(char: str) -> str | None:
    if char in _BIDI_CONTROLS:
        return "bidirectional control"
    if char in _ZERO_WIDTH:
        return "zero-width character"
    return _KINDS.get(unicodedata.category(char))


def _spelled(char: str) -> str:
    """`U+202E RIGHT-TO-LEFT OVERRIDE`: the code point, and its name when it has one."""
    name = unicodedata.name(char, "")
    return f"U+{ord(char):04X} {name}" if name else f"U+{ord(char):04X}"


def _check_name(name: str, *, origin: str, loc: tuple[str | int, ...], hint: str = "") -> None:
    problem = name_problem(name)
    if problem is not None:
        raise InvalidInput(f"{origin} {problem}{hint}", loc=loc)


def register_model(db: Database, registration: Registration) -> ModelRecord:
    """Read the model's metadata, record it with its files and a default config.

    Raises InvalidInput when there is nothing to register, its name is unfit (`name_problem`)
    or its metadata cannot be read; Conflict when another model has the name.
    """
    if registration.name:
        _check_name(registration.name, origin="the name", loc=("body", "name"))
    model_path: str | None
    if registration.path:
        source = registration.path
        where = registration.path_loc
        try:
            model_path, model_format, files = _local(Path(registration.path).expanduser())
        except InvalidInput as err:
            raise InvalidInput(str(err), loc=where) from None
        except (OSError, RuntimeError, ValueError) as err:  # no such user, too long, NUL
            raise InvalidInput(f"{registration.path}: {_reason(err)}", loc=where) from None
        hub: str | None = None
    elif registration.repo_id:
        source = registration.repo_id
        where = ("body", "repo_modelId")
        model_path, model_format, files = _hub(registration.repo_id)
        hub = HUB
    else:
        raise InvalidInput(
            "give a model to register: 'path' (a .gguf file or a directory with config.json "
            "and safetensors), 'm_files' with a local storage_location, or 'repo_modelId'"
        )
    try:
        shape = load_shape(model_path or source)
    except EstimateError as err:
        raise InvalidInput(f"cannot read the model's metadata: {err}", loc=where) from None
    # A name read from the file's metadata is the file's to choose: cut it to the column.
    name = (registration.name or registration.repo_id or Path(source).stem or shape.name)[
        :NAME_CHARS
    ]
    if not registration.name:
        origin = f"the name taken from {source!r}"
        _check_name(name, origin=origin, loc=where, hint=": give the model a name ('name')")
    return found(
        lambda: catalog.add_model(
            db,
            name=name,
            repo_id=registration.repo_id,
            hub=hub,
            source=source,
            model_path=model_path,
            format=model_format,
            description=registration.description,
            files=files,
            default_config=default_config(shape, model_format),
        )
    )


def _reason(err: Exception) -> str:
    return (err.strerror if isinstance(err, OSError) else None) or str(err)


@dataclass(frozen=True, slots=True, kw_only=True)
class Removal:
    """What deleting a model did: how many ended deployments went with it, which files were
    deleted, and which were kept (with why)."""

    model: ModelRecord
    deployments_removed: int
    files_deleted: tuple[str, ...]
    files_kept: tuple[str, ...]
    kept_reason: str | None


def remove_model(db: Database, model_id: str, *, delete_files: bool, data_dir: Path) -> Removal:
    """Delete a model's rows (refused with Conflict while it has an active deployment). Its
    files stay unless `delete_files`; even then only those under the server's data directory
    go, since a registered path may be anyone's file."""
    model, removed = found(lambda: catalog.delete_model(db, model_id))
    locations = [f.storage_location for f in model.files if f.storage_type == "file"]
    paths = [Path(location) for location in locations if location]
    if not delete_files:
        return Removal(
            model=model,
            deployments_removed=removed,
            files_deleted=(),
            files_kept=tuple(map(str, paths)),
            kept_reason="kept: delete_files was not asked" if paths else None,
        )
    root = data_dir.resolve()
    deleted: list[str] = []
    kept: list[str] = []
    for path in paths:
        # The folder resolved, the name not: a link is removed, never what it points at.
        where = path.parent.resolve() / path.name
        if where.is_relative_to(root) and (where.is_file() or where.is_symlink()):
            where.unlink()
            deleted.append(str(path))
        else:
            kept.append(str(path))
    return Removal(
        model=model,
        deployments_removed=removed,
        files_deleted=tuple(deleted),
        files_kept=tuple(kept),
        kept_reason=f"kept: outside the server's data directory {root}" if kept else None,
    )


def default_config(shape: ModelShape, model_format: str) -> dict[str, Any]:
    """The engine the file format calls for, and a context the engine would pick itself:
    llama-server's 4096 (capped at the model's) or the model's declared length for vLLM."""
    if model_format == "gguf":
        return {
            "engine": "llamacpp",
            "max_model_len": min(shape.max_model_len, LLAMACPP_DEFAULT_CTX),
        }
    return {"engine": "vllm", "max_model_len": shape.max_model_len}


def _local(path: Path) -> tuple[str, str, list[NewFile]]:
    path = path.resolve()
    if path.is_file():
        if path.suffix != ".gguf":
            raise InvalidInput(f"{path}: a model file must be a .gguf; give a directory otherwise")
        return str(path), "gguf", [_file(path)]
    if not path.is_dir():
        raise InvalidInput(f"{path}: no such file or directory")
    if (path / "config.json").is_file():
        found = sorted({item for pattern in _DIRECTORY_FILES for item in path.glob(pattern)})
        if (
            not any(item.suffix == ".safetensors" for item in found)
            and not (path / "model.safetensors.index.json").is_file()
        ):
            raise InvalidInput(f"{path}: config.json but no .safetensors weights")
        return str(path), "safetensors", [_file(item) for item in found if item.is_file()]
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        return str(ggufs[0]), "gguf", [_file(ggufs[0])]
    raise InvalidInput(f"{path}: neither config.json with safetensors nor exactly one .gguf")


def _hub(repo_id: str) -> tuple[str | None, str, list[NewFile]]:
    """A repo already in the local Hub cache is served from there; otherwise it is recorded
    by id alone (its metadata still comes from the Hub) and cannot be launched until
    downloaded."""
    try:
        from huggingface_hub import snapshot_download

        local = Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # the hub raises many kinds; all mean "not in the local cache"
        return None, "safetensors", []
    ggufs = sorted(local.glob("*.gguf"))
    if not (local / "config.json").is_file() and len(ggufs) == 1:
        return str(ggufs[0]), "gguf", [_file(ggufs[0])]
    files = sorted({item for pattern in _DIRECTORY_FILES for item in local.glob(pattern)})
    return str(local), "safetensors", [_file(item) for item in files if item.is_file()]


def _file(path: Path) -> NewFile:
    return NewFile(
        name=path.name,
        size_bytes=path.stat().st_size,
        storage_type="file",
        storage_location=str(path),
    )
