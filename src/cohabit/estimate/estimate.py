"""The estimator's entry point: `estimate_model(source, ...)` → `Estimate`, the bytes one GPU
needs to serve a model with an engine and settings, with where each number came from. The CLI,
the planner's request builder and the launcher call this; `budget.py` goes the other way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any

from cohabit.estimate import engines
from cohabit.estimate.checkpoint import files_fingerprint, load_shape
from cohabit.estimate.errors import InvalidSetting, UnsupportedModel
from cohabit.estimate.kv import (
    kv_bytes_per_token,
    kv_dtype_bytes,
    linear_state_bytes,
    llamacpp_kv_bytes,
    vllm_sequence_kv_bytes,
)
from cohabit.estimate.limits import MAX_ESTIMATE_BYTES
from cohabit.estimate.quant import gguf_file_types
from cohabit.estimate.settings import EngineSettings
from cohabit.estimate.shape import DTYPE_BYTES, NO_QUANT, ModelShape, QuantSpec
from cohabit.estimate.weights import (
    WeightLayout,
    checkpoint_runtime_bytes,
    layout_from_gguf,
    weight_layout,
    weights_per_gpu,
)

ENGINES = ("vllm", "llamacpp", "mlx")
DTYPES = ("auto", "bfloat16", "float16", "float32")
QUANTIZATIONS = ("auto", "none", "awq", "gptq", "fp8", "bitsandbytes", "mxfp4")
LLAMACPP_DEFAULT_CTX = 4096  # llama-server's --ctx-size default
DEFAULT_SETTINGS = EngineSettings()
_ONLINE_QUANT = {
    "fp8": QuantSpec(method="fp8", bits=8),
    "bitsandbytes": QuantSpec(method="bitsandbytes", bits=4, group_size=64),
}


class Source(StrEnum):
    """Where a number came from: file bytes, config arithmetic, or a default we assumed."""

    EXACT = "exact"
    DERIVED = "derived"
    DEFAULT = "default"


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """Bytes one GPU needs for one deployment (all per GPU, all integers).

    `total_bytes` = weights + KV cache + activation + overhead is what placement reserves; it
    holds `concurrency` sequences of `max_model_len` tokens. `overhead_parts` names the
    overhead's pieces (non_torch, cuda_graphs, cuda_context, backend); `host_bytes` is what
    stays in host memory (llama.cpp's token embeddings and layers not offloaded).
    `engine_version` is the vLLM engine whose profile run was modelled ("v0" or "v1"), None
    for other engines. For hybrid models `kv_cache_bytes` includes each sequence's Mamba /
    linear-attention state. `files_fingerprint` identifies the local files it was read from
    (None for a Hub repo id or a shape given directly).
    """

    model: str
    engine: str
    weights_bytes: int
    kv_cache_bytes_per_token: int
    kv_cache_bytes: int
    activation_bytes: int
    overhead_bytes: int
    total_bytes: int
    tensor_parallel: int
    pipeline_parallel: int = 1
    max_model_len: int
    concurrency: int = 1
    dtype: str
    kv_cache_dtype: str
    quantization: str
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    engine_version: str | None = None
    n_gpu_layers: int | None = None
    host_bytes: int = 0
    overhead_parts: Mapping[str, int] = field(default_factory=dict)
    sources: Mapping[str, Source] = field(default_factory=dict)
    files_fingerprint: str | None = None

    def to_dict(self) -> dict[str, object]:
        """Plain JSON-ready fields: byte counts as integers, sources as strings."""
        return {
            "model": self.model,
            "engine": self.engine,
            "weights_bytes": self.weights_bytes,
            "kv_cache_bytes_per_token": self.kv_cache_bytes_per_token,
            "kv_cache_bytes": self.kv_cache_bytes,
            "activation_bytes": self.activation_bytes,
            "overhead_bytes": self.overhead_bytes,
            "total_bytes": self.total_bytes,
            "tensor_parallel": self.tensor_parallel,
            "pipeline_parallel": self.pipeline_parallel,
            "max_model_len": self.max_model_len,
            "concurrency": self.concurrency,
            "dtype": self.dtype,
            "kv_cache_dtype": self.kv_cache_dtype,
            "quantization": self.quantization,
            "max_num_seqs": self.max_num_seqs,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "engine_version": self.engine_version,
            "n_gpu_layers": self.n_gpu_layers,
            "host_bytes": self.host_bytes,
            "overhead_parts": dict(self.overhead_parts),
            "sources": {key: str(value) for key, value in self.sources.items()},
            "files_fingerprint": self.files_fingerprint,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Estimate:
        """The inverse of `to_dict` (what the store kept at admission)."""
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in names}
        values["overhead_parts"] = dict(values.get("overhead_parts") or {})
        values["sources"] = {k: Source(v) for k, v in (values.get("sources") or {}).items()}
        return cls(**values)


def _positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise InvalidSetting(f"{name} must be at least 1, got {value}")


def _runtime_dtype(shape: ModelShape, dtype: str) -> str:
    if dtype not in DTYPES:
        raise InvalidSetting(f"unknown dtype {dtype!r} (use {', '.join(DTYPES)})")
    if dtype != "auto":
        return dtype
    # vLLM and MLX serve float32 checkpoints in bfloat16.
    return "bfloat16" if shape.dtype == "float32" else shape.dtype


def _runtime_quant(shape: ModelShape, quantization: str, engine: str) -> QuantSpec:
    stored = shape.quant
    if quantization == "auto":
        if engine == "llamacpp" and stored.method != "gguf":
            if stored.is_quantized:
                raise InvalidSetting(
                    f"{shape.name}: llama.cpp serves GGUF files; this checkpoint is "
                    f"{stored.method} (give a GGUF file type such as --quantization Q4_K_M)"
                )
            return QuantSpec(
                method="gguf", gguf_type="BF16" if shape.dtype == "bfloat16" else "F16"
            )
        return stored
    upper = quantization.upper()
    if upper in gguf_file_types():
        if stored.method == "gguf" and stored.gguf_type != upper:
            raise InvalidSetting(
                f"{shape.name}: the file is {stored.gguf_type}, not {upper}; requantize it first"
            )
        return QuantSpec(method="gguf", gguf_type=upper)
    if quantization not in QUANTIZATIONS:
        known = ", ".join((*QUANTIZATIONS, *gguf_file_types()))
        raise InvalidSetting(f"unknown quantization {quantization!r} (use {known})")
    if quantization == stored.method:
        return stored
    if stored.is_quantized:
        raise InvalidSetting(
            f"{shape.name}: checkpoint is {stored.method}-quantized; "
            f"it cannot be served as {quantization}"
        )
    if quantization == "none":
        return NO_QUANT
    if quantization in _ONLINE_QUANT:
        return _ONLINE_QUANT[quantization]
    raise InvalidSetting(
        f"{shape.name}: {quantization} needs a checkpoint quantized with it; this one is not"
    )


def check_parallel(shape: ModelShape, tensor_parallel: int, pipeline_parallel: int = 1) -> None:
    """vLLM's rules: tp divides the attention heads; KV heads divide by tp or tp by them;
    pp is at most the number of layers."""
    _positive("tensor parallel size", tensor_parallel)
    _positive("pipeline parallel size", pipeline_parallel)
    if shape.num_heads % tensor_parallel:
        raise InvalidSetting(
            f"{shape.name}: tensor parallel size {tensor_parallel} does not divide its "
            f"{shape.num_heads} attention heads"
        )
    kv = shape.num_kv_heads
    if shape.mla is None and kv % tensor_parallel and tensor_parallel % kv:
        raise InvalidSetting(
            f"{shape.name}: tensor parallel size {tensor_parallel} and its {kv} KV heads do "
            "not divide one another"
        )
    if pipeline_parallel > shape.num_layers:
        raise InvalidSetting(
            f"{shape.name}: pipeline parallel size {pipeline_parallel} exceeds its "
            f"{shape.num_layers} layers"
        )


def _exact_weights(
    shape: ModelShape, quant: QuantSpec, layout: WeightLayout, act_bytes: int, per_gpu: int
) -> int | None:
    """Scale the checkpoint's exact bytes by the derived per-GPU share (tp, pp), when the file
    is what the engine will hold (same quantization)."""
    checkpoint = shape.checkpoint
    if checkpoint is None or quant != shape.quant or layout.total_bytes == 0:
        return None
    if checkpoint.tensors and checkpoint.format == "safetensors":
        runtime = checkpoint_runtime_bytes(
            shape, checkpoint.tensors, act_bytes=act_bytes, cast_floats=True
        )
    elif checkpoint.format == "safetensors" and not quant.is_quantized:
        runtime = checkpoint.total_bytes * act_bytes // DTYPE_BYTES.get(shape.dtype, act_bytes)
    else:
        runtime = checkpoint.total_bytes
    return runtime * per_gpu // layout.total_bytes


def estimate_shape(
    shape: ModelShape,
    *,
    engine: str = "vllm",
    settings: EngineSettings = DEFAULT_SETTINGS,
    device_total_bytes: int | None = None,
    device_name: str | None = None,
    engine_version: str | None = None,
) -> Estimate:
    """Estimate from an already-read ModelShape (pure; `estimate_model` reads the files).

    `engine_version` picks the vLLM engine whose profile run is modelled ("0.6.6", "V0",
    "0.11.0"; None: today's V1). Raises InvalidSetting for settings the engine would refuse.
    """
    dtype, quantization = settings.dtype, settings.quantization
    tensor_parallel, pipeline_parallel = settings.tensor_parallel, settings.pipeline_parallel
    max_model_len, max_num_seqs = settings.max_model_len, settings.max_num_seqs
    max_num_batched_tokens, kv_cache_dtype = (
        settings.max_num_batched_tokens,
        settings.kv_cache_dtype,
    )
    concurrency, n_gpu_layers = settings.concurrency, settings.n_gpu_layers
    if engine not in ENGINES:
        raise InvalidSetting(f"unknown engine {engine!r} (use {', '.join(ENGINES)})")
    check_parallel(shape, tensor_parallel, pipeline_parallel)
    if engine != "vllm" and (tensor_parallel > 1 or pipeline_parallel > 1):
        raise InvalidSetting(
            f"{engine}: tensor and pipeline parallelism are modelled for vllm only"
        )
    if max_model_len is not None and max_model_len > shape.max_model_len and engine != "llamacpp":
        raise InvalidSetting(
            f"{shape.name}: max model length {max_model_len} exceeds the model's "
            f"{shape.max_model_len} tokens"
        )
    generation = engines.vllm_generation(engine_version if engine == "vllm" else None)
    run_dtype = _runtime_dtype(shape, dtype)
    act_bytes = DTYPE_BYTES[run_dtype]
    quant = _runtime_quant(shape, quantization, engine)
    kv_bytes = kv_dtype_bytes(kv_cache_dtype, act_bytes)
    quant_name = (quant.gguf_type or "gguf") if quant.method == "gguf" else quant.method
    if engine == "llamacpp":
        return _llamacpp(
            shape,
            quant=quant,
            quant_name=str(quant_name),
            max_model_len=max_model_len,
            kv_cache_dtype=kv_cache_dtype,
            concurrency=concurrency,
            n_gpu_layers=n_gpu_layers,
            flash_attn=settings.flash_attn,
        )
    sources: dict[str, Source] = {}
    layout = weight_layout(shape, act_bytes=act_bytes, quant=quant, tensor_parallel=tensor_parallel)
    derived = weights_per_gpu(layout, pipeline_parallel=pipeline_parallel)
    exact = _exact_weights(shape, quant, layout, act_bytes, derived)
    weights = derived if exact is None else exact
    sources["weights_bytes"] = Source.DERIVED if exact is None else Source.EXACT
    length = max_model_len or shape.max_model_len
    per_token = kv_bytes_per_token(
        shape,
        dtype_bytes=kv_bytes,
        tensor_parallel=tensor_parallel,
        pipeline_parallel=pipeline_parallel,
    )
    sources["kv_cache_bytes_per_token"] = Source.DERIVED
    sources["kv_cache_bytes"] = Source.DERIVED
    sources["overhead_bytes"] = Source.DEFAULT
    if engine == "mlx":
        steps = -(-length // engines.MLX_KV_STEP) * engines.MLX_KV_STEP
        states = shape.linear_layers * linear_state_bytes(shape, act_bytes=act_bytes)
        kv_cache = concurrency * (steps * per_token + states)
        activation = engines.mlx_activation_bytes(
            shape, act_bytes=act_bytes, concurrency=concurrency
        )
        sources["activation_bytes"] = Source.DERIVED
        parts = {"runtime": engines.MLX_RUNTIME_BYTES}
        scheduler = None
    else:
        scheduler, used_default = engines.vllm_scheduler(
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
            device_total_bytes=device_total_bytes,
            device_name=device_name,
            generation=generation,
            max_model_len=length,
            multimodal=shape.vision is not None,
        )
        kv_cache = concurrency * vllm_sequence_kv_bytes(
            shape,
            per_token_bytes=per_token,
            tokens=length,
            act_bytes=act_bytes,
            tensor_parallel=tensor_parallel,
            pipeline_parallel=pipeline_parallel,
        )
        activation = engines.vllm_activation_bytes(
            shape, scheduler=scheduler, act_bytes=act_bytes, tensor_parallel=tensor_parallel
        )
        sources["activation_bytes"] = Source.DEFAULT if used_default else Source.DERIVED
        parts = {
            "non_torch": engines.vllm_non_torch_bytes(tensor_parallel),
            "cuda_graphs": engines.vllm_cuda_graph_bytes(
                shape,
                scheduler=scheduler,
                act_bytes=act_bytes,
                tensor_parallel=tensor_parallel,
                enforce_eager=settings.enforce_eager,
            ),
            "cuda_context": engines.CUDA_CONTEXT_BYTES,
        }
    overhead = sum(parts.values())
    return Estimate(
        model=shape.name,
        engine=engine,
        weights_bytes=weights,
        kv_cache_bytes_per_token=per_token,
        kv_cache_bytes=kv_cache,
        activation_bytes=activation,
        overhead_bytes=overhead,
        total_bytes=weights + kv_cache + activation + overhead,
        tensor_parallel=tensor_parallel,
        pipeline_parallel=pipeline_parallel,
        max_model_len=length,
        concurrency=concurrency,
        dtype=run_dtype,
        kv_cache_dtype=kv_cache_dtype,
        quantization=str(quant_name),
        max_num_seqs=scheduler.max_num_seqs if scheduler else None,
        max_num_batched_tokens=scheduler.max_num_batched_tokens if scheduler else None,
        engine_version=scheduler.generation if scheduler else None,
        overhead_parts=parts,
        sources=sources,
    )


def _llamacpp(
    shape: ModelShape,
    *,
    quant: QuantSpec,
    quant_name: str,
    max_model_len: int | None,
    kv_cache_dtype: str,
    concurrency: int,
    n_gpu_layers: int | None,
    flash_attn: bool,
) -> Estimate:
    """llama.cpp: offloaded layers (+ output layer when n_gpu_layers > n_layer), the KV buffer
    for n_ctx = max_model_len × concurrency (slots share one context), the compute buffer and
    the backend's context. token_embd always stays on the host."""
    sources: dict[str, Source] = {}
    checkpoint = shape.checkpoint
    if checkpoint is not None and checkpoint.format == "gguf" and checkpoint.tensors:
        layout = layout_from_gguf(shape, checkpoint.tensors)
        sources["weights_bytes"] = Source.EXACT
    else:
        layout = weight_layout(shape, act_bytes=2, quant=quant)
        sources["weights_bytes"] = Source.DERIVED
    n = shape.num_layers
    ngl = n + 1 if n_gpu_layers is None else min(n_gpu_layers, n + 1)
    on_gpu = min(ngl, n)
    output_on_gpu = ngl > n
    weights = sum(layout.layer_bytes[:on_gpu]) + layout.other_bytes
    if output_on_gpu:
        weights += layout.head_bytes
    host = layout.per_rank_bytes - weights
    if max_model_len is None:
        length = min(shape.max_model_len, LLAMACPP_DEFAULT_CTX)
        sources["kv_cache_bytes"] = Source.DEFAULT
    else:
        length = max_model_len
        sources["kv_cache_bytes"] = Source.DERIVED
    cache_type = {"auto": "f16", "fp8": "q8_0"}.get(kv_cache_dtype, kv_cache_dtype)
    if cache_type in ("float16", "bfloat16"):
        cache_type = "f16" if cache_type == "float16" else "bf16"
    n_ctx = length * concurrency
    kv_cache = llamacpp_kv_bytes(
        shape, n_ctx=n_ctx, n_layers=on_gpu, type_k=cache_type, type_v=cache_type, n_seq=concurrency
    )
    per_token = (
        llamacpp_kv_bytes(
            shape, n_ctx=256, n_layers=on_gpu, type_k=cache_type, type_v=cache_type, swa_full=True
        )
        // 256
    )
    sources["kv_cache_bytes_per_token"] = Source.DERIVED
    activation = engines.llamacpp_compute_bytes(
        shape, n_ctx=n_ctx, flash_attn=flash_attn, output_on_gpu=output_on_gpu
    )
    sources["activation_bytes"] = Source.DERIVED
    sources["overhead_bytes"] = Source.DEFAULT
    parts = {"backend": engines.LLAMACPP_BACKEND_BYTES}
    return Estimate(
        model=shape.name,
        engine="llamacpp",
        weights_bytes=weights,
        kv_cache_bytes_per_token=per_token,
        kv_cache_bytes=kv_cache,
        activation_bytes=activation,
        overhead_bytes=sum(parts.values()),
        total_bytes=weights + kv_cache + activation + sum(parts.values()),
        tensor_parallel=1,
        max_model_len=length,
        concurrency=concurrency,
        dtype="float16",
        kv_cache_dtype=kv_cache_dtype,
        quantization=quant_name,
        n_gpu_layers=ngl,
        host_bytes=host,
        overhead_parts=parts,
        sources=sources,
    )


def estimate_model(
    source: str | Path,
    *,
    engine: str = "vllm",
    settings: EngineSettings = DEFAULT_SETTINGS,
    device_total_bytes: int | None = None,
    device_name: str | None = None,
    engine_version: str | None = None,
) -> Estimate:
    """Bytes per GPU to serve `source` (config.json, model directory, .gguf, or repo id) with
    `settings` on `engine`.

    Meta-Llama-3.1-8B-Instruct, vLLM, bf16, tp 1, 16,000 tokens, H100 defaults: weights
    14.96 GiB + KV 1.95 GiB (131,072 bytes/token) + activation 4.96 GiB + overhead 0.81 GiB
    = 22.67 GiB; vLLM needed 21.83 GiB on an H100 (weights + activation + non-torch + KV).

    A local source's files are fingerprinted (`Estimate.files_fingerprint`) so that a launch
    can tell whether they changed since this estimate was made.

    Raises ModelNotFound, UnsupportedModel or InvalidSetting (all EstimateError).
    """
    shape = load_shape(source)
    estimate = estimate_shape(
        shape,
        engine=engine,
        settings=settings,
        device_total_bytes=device_total_bytes,
        device_name=device_name,
        engine_version=engine_version,
    )
    if estimate.total_bytes > MAX_ESTIMATE_BYTES or estimate.host_bytes > MAX_ESTIMATE_BYTES:
        # Every number was in range, but together they describe no real model (hidden size
        # 2^40): refuse rather than hand a 2^86-byte request to placement and the store.
        raise UnsupportedModel(
            f"{source}: the files describe a model needing {estimate.total_bytes:,} bytes per "
            "GPU, more than any device holds"
        )
    return replace(estimate, files_fingerprint=files_fingerprint(source))
