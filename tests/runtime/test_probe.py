"""Failure classification from an exit code and the log's tail, with lines recorded from
real vLLM, PyTorch, llama.cpp, llama-cpp-python and MLX logs (no GPU needed to read them)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from cohabit.runtime.interface import RuntimeErrorCode
from cohabit.runtime.probe import analyze_log, classify_exit, exit_text, is_ready

Code = RuntimeErrorCode
OOM, CUDA, LOADING = Code.OOM, Code.CUDA_ERROR, Code.MODEL_LOADING_FAILURE
TORCH_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
    "capacity of 79.19 GiB of which 1.06 GiB is free."
)
VLLM_KV = (
    "ValueError: To serve at least one request with the models's max seq len (131072), (16.00 "
    "GiB KV cache is needed, which is larger than the available KV cache memory (3.28 GiB)."
)
VLLM_FREE = (
    "ValueError: Free memory on device (5.1/79.19 GiB) on startup is less than desired GPU "
    "memory utilization (0.9, 71.27 GiB)."
)
LLAMA_CUDA_OOM = (
    "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 8192.00 MiB on device 0: "
    "cudaMalloc failed: out of memory"
)
METAL_OOM = (
    "[METAL] Command buffer execution failed: Insufficient Memory "
    "(00000008:kIOGPUCommandBufferCallbackErrorOutOfMemory)"
)
HIP_OOM = "RuntimeError: HIP out of memory. Tried to allocate 1.50 GiB"
CUDA_DRIVER = (
    "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA "
    "GPU and installed a driver"
)
CUDA_ILLEGAL = "RuntimeError: CUDA error: an illegal memory access was encountered"
ARCH = (
    "ValueError: Model architectures ['FooForCausalLM'] are not supported for now. Supported "
    "architectures: ['LlamaForCausalLM']"
)
LLAMA_LOAD = (
    "llama_model_load: error loading model: tensor 'blk.0.attn_q.weight' data is not within "
    "the file bounds"
)
LLAMA_ALLOC = "llama_model_load: error loading model: unable to allocate CUDA0 buffer"
PY_LOAD = "ValueError: Failed to load model from file: /models/tiny.gguf"
MISSING = "ValueError: Model path does not exist: /models/tiny.gguf"
BAD_HEADER = "safetensors_rust.SafetensorError: Error while deserializing header: HeaderTooLarge"
KEY_ERROR = "KeyError: 'rope_scaling'"
TRACEBACK = ("Traceback (most recent call last):", '  File "x.py", line 1', KEY_ERROR)
BAD_FLAG = "x: error: unrecognized arguments: --bogus"


@pytest.mark.parametrize(
    ("exit_code", "lines", "code", "line"),
    [
        pytest.param(1, ("INFO", *TRACEBACK[:2], TORCH_OOM), OOM, TORCH_OOM, id="torch-oom"),
        pytest.param(1, (VLLM_KV,), OOM, VLLM_KV, id="vllm-kv-too-small"),
        pytest.param(1, (VLLM_FREE,), OOM, VLLM_FREE, id="vllm-free-memory"),
        pytest.param(1, (LLAMA_CUDA_OOM, LLAMA_ALLOC, PY_LOAD), OOM, LLAMA_ALLOC, id="llama-oom"),
        pytest.param(-6, (METAL_OOM,), OOM, METAL_OOM, id="metal-oom"),
        pytest.param(1, (HIP_OOM,), OOM, HIP_OOM, id="hip-oom"),
        pytest.param(1, (CUDA_DRIVER,), CUDA, CUDA_DRIVER, id="no-driver"),
        pytest.param(1, (CUDA_ILLEGAL,), CUDA, CUDA_ILLEGAL, id="illegal-access"),
        pytest.param(1, (MISSING,), Code.MUST_REDOWNLOAD, MISSING, id="path-missing"),
        pytest.param(1, (ARCH,), LOADING, ARCH, id="unsupported-architecture"),
        pytest.param(1, (LLAMA_LOAD, PY_LOAD), LOADING, PY_LOAD, id="bad-gguf"),
        pytest.param(1, (BAD_HEADER,), LOADING, BAD_HEADER, id="bad-safetensors"),
        pytest.param(1, TRACEBACK, Code.RUNTIME_ERROR, KEY_ERROR, id="exception"),
    ],
)  # fmt: skip
def test_classify_exit(exit_code: int, lines: tuple[str, ...], code: Code, line: str) -> None:
    failure = classify_exit(exit_code, lines)
    assert failure.code is code
    assert failure.line == line
    assert failure.message == f"{line} ({exit_text(exit_code)})"


@pytest.mark.parametrize(
    ("exit_code", "lines", "message"),
    [
        pytest.param(3, ("usage", BAD_FLAG), f"(exit code 3); last line: {BAD_FLAG}", id="last"),
        pytest.param(-9, (), "(killed by SIGKILL) without writing anything", id="killed-silently"),
        pytest.param(None, ("",), "(exit code unknown) without writing anything", id="adopted"),
        pytest.param(0, ("INFO: bye",), "(exit code 0); last line: INFO: bye", id="clean-exit"),
    ],
)  # fmt: skip
def test_anything_else_is_container_exited(
    exit_code: int | None, lines: tuple[str, ...], message: str
) -> None:
    failure = classify_exit(exit_code, lines)
    assert failure.code is Code.CONTAINER_EXITED
    assert failure.message == f"engine exited {message}"


def test_analyze_log_reports_patterns_and_lines() -> None:
    lines = ["INFO start", CUDA_ILLEGAL, "INFO retry", TORCH_OOM]
    analysis = analyze_log(lines)
    assert analysis.patterns_detected == {
        "OOM": True,
        "CUDA_ERROR": True,
        "MUST_REDOWNLOAD": False,
        "MODEL_LOADING_FAILURE": False,
        "RUNTIME_ERROR": False,
    }
    assert analysis.failure_lines == [
        {"line_number": "2", "pattern": "CUDA_ERROR", "line": CUDA_ILLEGAL},
        {"line_number": "4", "pattern": "OOM", "line": TORCH_OOM},
    ]


def test_ordinary_start_up_lines_match_nothing() -> None:
    """Lines every healthy start prints must not look like failures."""
    lines = [
        "INFO 05-12 10:41:09 [gpu_model_runner.py:1329] Model loading took 14.9889 GiB",
        "INFO 05-12 10:41:20 [kv_cache_utils.py:634] GPU KV cache size: 26,859 tokens",
        "load_tensors:   CPU_Mapped model buffer size =     0.41 MiB",
        "llama_kv_cache:        CPU KV buffer size =     0.50 MiB",
        "INFO:     Uvicorn running on http://127.0.0.1:8000 (Press CTRL+C to quit)",
    ]
    assert not any(analyze_log(lines).patterns_detected.values())


@pytest.fixture
def health_server() -> Iterator[str]:
    """A real HTTP server on 127.0.0.1: 200 on /health, 503 elsewhere."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 503)
            self.send_header("content-length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_is_ready(health_server: str) -> None:
    assert is_ready(f"{health_server}/health")
    assert not is_ready(f"{health_server}/loading")


def test_is_ready_false_when_nothing_listens() -> None:
    from cohabit.runtime.process import free_port

    assert not is_ready(f"http://127.0.0.1:{free_port()}/health", timeout_s=0.5)


def test_is_ready_goes_straight_to_the_engine(
    health_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A proxy in the environment is not used: the engine listens on this host."""
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    assert is_ready(f"{health_server}/health")
    assert not is_ready("not a url") and not is_ready(f"ftp{health_server[4:]}/health")
