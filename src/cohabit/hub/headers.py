"""Estimates for GGUF variants not downloaded yet: the GGUF header (metadata and tensor
table, at the start of the file) is fetched with one HTTP Range request and written at the
start of a sparse file of the full size, which the estimator reads as it reads any GGUF (it
never touches the tensor data). Called by the service's variant listing."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

from cohabit.estimate import EstimateError
from cohabit.estimate.estimate import LLAMACPP_DEFAULT_CTX, estimate_model
from cohabit.estimate.settings import EngineSettings
from cohabit.hub.client import HubFile, endpoint, ensure_online, token
from cohabit.hub.errors import HubUnavailable
from cohabit.hub.variants import Variant, first_file

HEADER_BYTES = 32 * 1024 * 1024  # a 150k-token vocabulary's metadata is a few MiB
_READ_BYTES = 256 * 1024
GGUF_ENGINES = ("llamacpp", "vllm")


def variant_estimates(
    repo_id: str, variant: Variant, files: dict[str, HubFile], *, revision: str, server: bool
) -> dict[str, int]:
    """Bytes per device each engine would reserve for `variant` at its default context
    (llama.cpp's 4096 tokens); an engine that cannot run it is left out. `server`: whether
    the header may be fetched with the server's credentials (hub/client.py `token`)."""
    listed = files[first_file(variant)]
    extra = variant.size_bytes - (listed.size_bytes or 0)  # the other shards' weights
    return dict(_estimates(repo_id, listed, revision, max(extra, 0), server))


@functools.lru_cache(maxsize=256)
def _estimates(
    repo_id: str, listed: HubFile, revision: str, extra_bytes: int, server: bool
) -> tuple[tuple[str, int], ...]:
    """Kept per file at a commit (a commit's files never change), and per credentials (what
    the server's token read is not handed to a caller without it): a pull lists the variants
    and then chooses among them without fetching each header twice."""
    with tempfile.TemporaryDirectory(prefix="cohabit-gguf-") as folder:
        path = Path(folder) / Path(listed.name).name
        _write_header(repo_id, listed, revision=revision, path=path, server=server)
        needed: list[tuple[str, int]] = []
        for engine in GGUF_ENGINES:
            try:
                estimate = estimate_model(
                    path, engine=engine, settings=EngineSettings(max_model_len=_ctx(path))
                )
            except (EstimateError, ValueError):
                continue
            needed.append((engine, estimate.total_bytes + extra_bytes))
        return tuple(needed)


def _ctx(path: Path) -> int | None:
    from cohabit.estimate.checkpoint import load_shape

    try:
        return min(load_shape(path).max_model_len, LLAMACPP_DEFAULT_CTX)
    except EstimateError:
        return None


def _write_header(repo_id: str, file: HubFile, *, revision: str, path: Path, server: bool) -> None:
    """The file's first bytes, asked for with a Range request and read no further than asked
    even when a mirror ignores the range and sends the whole file."""
    from huggingface_hub import get_session, hf_hub_url
    from huggingface_hub.utils._headers import build_hf_headers

    ensure_online()
    url = hf_hub_url(repo_id, file.name, revision=revision, endpoint=endpoint())
    want = min(file.size_bytes or HEADER_BYTES, HEADER_BYTES)
    headers = build_hf_headers(token=token(server=server))
    headers["Range"] = f"bytes=0-{want - 1}"
    headers["Accept-Encoding"] = "identity"
    head = bytearray()
    try:
        with get_session().stream("GET", url, headers=headers, follow_redirects=True) as response:
            response.raise_for_status()
            for chunk in response.iter_raw(_READ_BYTES):
                head += chunk[: want - len(head)]
                if len(head) >= want:
                    break  # leaving the block closes the connection: the rest is never read
    except Exception as err:
        raise HubUnavailable(f"{file.name}: cannot read its GGUF header: {err}") from None
    with path.open("wb") as handle:
        handle.write(head)
        handle.truncate(file.size_bytes or want)
