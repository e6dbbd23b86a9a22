"""Readiness and failure classification for engine processes.

`is_ready()` asks an engine's health URL; `classify_exit()` turns an exit code and the log's
tail into a `RuntimeErrorCode` with the engine's own line that explains it; `analyze_log()`
gives the logs API its `patterns_detected` and `failure_lines`. The spawner calls all three.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from http.client import HTTPConnection, HTTPException
from urllib.parse import urlsplit

from cohabit.runtime.interface import RuntimeErrorCode

# Most specific first: a CUDA OOM also reads "CUDA error: out of memory" and sits in a Python
# traceback, and llama.cpp follows an allocation failure with "failed to load model"; the
# first code that matches anywhere in the tail is the cause.
_PATTERNS: tuple[tuple[RuntimeErrorCode, re.Pattern[str]], ...] = (
    (
        RuntimeErrorCode.OOM,
        re.compile(
            r"out of memory|OutOfMemoryError|CUDA_ERROR_OUT_OF_MEMORY|hipErrorOutOfMemory"
            r"|cudaErrorMemoryAllocation|Insufficient Memory|ErrorOutOfMemory"
            r"|No available memory for the cache blocks"
            r"|larger than the available KV cache memory"
            r"|less than desired GPU memory utilization"
            r"|(?:failed|unable) to allocate \S+ buffer|\[metal::malloc\]|std::bad_alloc"
            r"|\bMemoryError\b",
            re.IGNORECASE,
        ),
    ),
    (
        RuntimeErrorCode.CUDA_ERROR,
        re.compile(
            r"CUDA error|cudaError\w*|CUDA_ERROR_\w+|no CUDA-capable device|No CUDA GPUs"
            r"|CUDA driver|Found no NVIDIA driver|NVIDIA driver on your system is too old"
            r"|ggml_cuda_init: failed|HIP error|hipError\w*|NCCL error|nccl\w*Error"
            r"|illegal memory access|device-side assert",
            re.IGNORECASE,
        ),
    ),
    (
        RuntimeErrorCode.MUST_REDOWNLOAD,
        re.compile(
            r"Model path does not exist"
            r"|(?:No such file or directory|FileNotFoundError|does not appear to have a file)"
            r".*\.(?:gguf|safetensors|bin|json)",
            re.IGNORECASE,
        ),
    ),
    (
        RuntimeErrorCode.MODEL_LOADING_FAILURE,
        re.compile(
            r"failed to load model|error loading model|llama_model_load: error"
            r"|unknown model architecture|architectures? .*(?:is|are) not supported"
            r"|gguf_init_from_\w+: .*(?:failed|invalid)|invalid magic|not a valid GGUF"
            r"|SafetensorError|HeaderTooLarge|MetadataIncompleteBuffer"
            r"|wrong number of tensors|tensor '?[\w.]+'? has wrong shape",
            re.IGNORECASE,
        ),
    ),
    (
        RuntimeErrorCode.RUNTIME_ERROR,
        re.compile(
            r"^\s*(?:[\w]+\.)*[A-Z]\w*(?:Error|Exception)(?::|$)"
            r"|terminate called after throwing|Traceback \(most recent call last\)"
        ),
    ),
)
TAIL_LINES = 200  # how far back a failure's explanation is looked for


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineFailure:
    """Why an engine stopped: the code users act on and a one-line message that quotes the
    engine (`line`, empty when it said nothing useful)."""

    code: RuntimeErrorCode
    message: str
    line: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class LogAnalysis:
    """What the logs API reports next to the lines (informational; it never changes status).

    `patterns_detected` has one key per error code; `failure_lines` one entry per matching
    line: {"line_number" (1-based in the lines given), "pattern", "line"}.
    """

    patterns_detected: dict[str, bool]
    failure_lines: list[dict[str, str]]


def is_ready(url: str, *, timeout_s: float = 1.0) -> bool:
    """True when `url` (http) answers 200. One plain HTTP/1.1 GET, no proxy (engines listen
    on this host), no redirect followed: it runs every few milliseconds while a request
    waits for the engine, and urllib's opener, built for each call, took longer than the
    request itself."""
    parts = urlsplit(url)
    try:
        if parts.scheme != "http" or parts.hostname is None:
            return False
        connection = HTTPConnection(parts.hostname, parts.port or 80, timeout=timeout_s)
        try:
            target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            connection.request("GET", target)
            return connection.getresponse().status == 200
        finally:
            connection.close()
    except (HTTPException, OSError, ValueError):
        return False


def _code_of(line: str) -> RuntimeErrorCode | None:
    for code, pattern in _PATTERNS:
        if pattern.search(line):
            return code
    return None


def exit_text(exit_code: int | None) -> str:
    """ "exit code 3", "killed by SIGKILL", or "exit code unknown" (an adopted engine)."""
    if exit_code is None:
        return "exit code unknown"
    if exit_code < 0:
        try:
            return f"killed by {signal.Signals(-exit_code).name}"
        except ValueError:
            return f"killed by signal {-exit_code}"
    return f"exit code {exit_code}"


def classify_exit(exit_code: int | None, lines: Sequence[str]) -> EngineFailure:
    """The failure an engine's exit means, from its exit code and the last lines it wrote.

    A recognised line decides the code (OOM, CUDA_ERROR, MUST_REDOWNLOAD,
    MODEL_LOADING_FAILURE, RUNTIME_ERROR for an uncaught exception); otherwise it is
    CONTAINER_EXITED with the last thing the engine said.
    """
    tail = [line.rstrip() for line in lines[-TAIL_LINES:] if line.strip()]
    for code, pattern in _PATTERNS:
        matches = [line for line in tail if pattern.search(line)]
        if matches:
            # The last match is the innermost explanation (the exception line that ends a
            # traceback, not the frame that printed the traceback header).
            line = _best_line(code, matches)
            return EngineFailure(
                code=code, message=f"{line.strip()} ({exit_text(exit_code)})", line=line
            )
    if tail:
        last = tail[-1].strip()
        return EngineFailure(
            code=RuntimeErrorCode.CONTAINER_EXITED,
            message=f"engine exited ({exit_text(exit_code)}); last line: {last}",
            line=last,
        )
    return EngineFailure(
        code=RuntimeErrorCode.CONTAINER_EXITED,
        message=f"engine exited ({exit_text(exit_code)}) without writing anything",
    )


def _best_line(code: RuntimeErrorCode, matches: list[str]) -> str:
    if code is RuntimeErrorCode.RUNTIME_ERROR:
        explained = [m for m in matches if "Traceback (most recent call last)" not in m]
        return (explained or matches)[-1]
    return matches[-1]


def analyze_log(lines: Sequence[str]) -> LogAnalysis:
    """Which failure patterns occur in `lines`, and the lines that show them."""
    detected = {code.value: False for code, _ in _PATTERNS}
    failure_lines: list[dict[str, str]] = []
    for number, line in enumerate(lines, start=1):
        code = _code_of(line)
        if code is None:
            continue
        detected[code.value] = True
        failure_lines.append(
            {"line_number": str(number), "pattern": code.value, "line": line.rstrip()}
        )
    return LogAnalysis(patterns_detected=detected, failure_lines=failure_lines)
