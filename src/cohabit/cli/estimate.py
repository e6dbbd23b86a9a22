"""`cohabit estimate MODEL`: how many bytes one GPU needs to serve a model, with a breakdown.

Thin edge over `cohabit.estimate.estimate_model`; estimator faults become one line, exit 2.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table
from rich.text import Text

from cohabit.cli.commands import help_of
from cohabit.cli.output import console, fail, print_json
from cohabit.units import SizeError, format_gib, parse_size

if TYPE_CHECKING:
    from cohabit.estimate import Estimate


def _render(est: Estimate) -> None:
    table = Table(title=f"{est.model} on {est.engine}, per GPU", title_justify="left")
    table.add_column("part")
    table.add_column("size", justify="right")
    table.add_column("source")
    rows = [
        ("weights", est.weights_bytes, "weights_bytes"),
        ("KV cache", est.kv_cache_bytes, "kv_cache_bytes"),
        ("activation peak", est.activation_bytes, "activation_bytes"),
        ("overhead", est.overhead_bytes, "overhead_bytes"),
    ]
    for label, size, key in rows:
        table.add_row(label, format_gib(size, digits=2), str(est.sources.get(key, "")))
    for name, size in est.overhead_parts.items():
        table.add_row(f"  {name.replace('_', ' ')}", format_gib(size, digits=2), "")
    table.add_row(
        Text("total", style="bold"), Text(format_gib(est.total_bytes, digits=2), style="bold"), ""
    )
    console.print(table)
    settings = [
        f"KV {est.kv_cache_bytes_per_token:,} bytes/token",
        f"max model len {est.max_model_len:,}",
        f"concurrency {est.concurrency}",
        f"tp {est.tensor_parallel}",
        f"dtype {est.dtype}",
        f"quantization {est.quantization}",
    ]
    if est.engine_version is not None:
        settings.append(f"vLLM {est.engine_version.upper()} engine")
    if est.max_num_seqs is not None:
        settings.append(f"max num seqs {est.max_num_seqs}")
        settings.append(f"max batched tokens {est.max_num_batched_tokens}")
    if est.n_gpu_layers is not None:
        settings.append(f"n_gpu_layers {est.n_gpu_layers}")
    if est.host_bytes:
        settings.append(f"host memory {format_gib(est.host_bytes, digits=2)}")
    console.print(", ".join(settings))


def register(app: typer.Typer) -> None:
    """Add the command to the app."""

    @app.command("estimate", help=help_of("estimate"))
    def estimate(
        model: Annotated[
            str, typer.Argument(help="config.json, model directory, .gguf or repo id.")
        ],
        engine: Annotated[str, typer.Option(help="vllm, llamacpp or mlx.")] = "vllm",
        dtype: Annotated[str, typer.Option(help="auto, bfloat16, float16 or float32.")] = "auto",
        quantization: Annotated[
            str,
            typer.Option(help="auto, none, awq, gptq, fp8, bitsandbytes, mxfp4, or a GGUF type."),
        ] = "auto",
        tp: Annotated[int, typer.Option("--tp", help="Tensor-parallel size.")] = 1,
        pp: Annotated[int, typer.Option("--pp", help="Pipeline-parallel size.")] = 1,
        max_model_len: Annotated[int | None, typer.Option(help="Context length in tokens.")] = None,
        max_num_seqs: Annotated[int | None, typer.Option(help="vLLM max_num_seqs.")] = None,
        max_num_batched_tokens: Annotated[
            int | None, typer.Option(help="vLLM max_num_batched_tokens.")
        ] = None,
        kv_cache_dtype: Annotated[str, typer.Option(help="auto or fp8.")] = "auto",
        enforce_eager: Annotated[bool, typer.Option(help="vLLM without CUDA graphs.")] = False,
        concurrency: Annotated[
            int, typer.Option(help="Full-length sequences the KV cache must hold.")
        ] = 1,
        device_memory: Annotated[
            str | None, typer.Option(help="GPU memory, e.g. 80GiB (picks vLLM's defaults).")
        ] = None,
        device_name: Annotated[str | None, typer.Option(help="GPU name, e.g. 'A100'.")] = None,
        n_gpu_layers: Annotated[int | None, typer.Option(help="llama.cpp layers on GPU.")] = None,
        engine_version: Annotated[
            str | None,
            typer.Option(help="vLLM release or engine whose profile run to model: 0.6.6, V0, V1."),
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="Print JSON (bytes).")] = False,
    ) -> None:
        # The estimator (numpy, gguf) loads when it runs, not for `cohabit estimate --help`.
        from cohabit.estimate import EngineSettings, EstimateError, estimate_model

        try:
            device_bytes = (
                None
                if device_memory is None
                else parse_size(device_memory, field="--device-memory")
            )
            settings = EngineSettings(
                dtype=dtype,
                quantization=quantization,
                tensor_parallel=tp,
                pipeline_parallel=pp,
                max_model_len=max_model_len,
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
                kv_cache_dtype=kv_cache_dtype,
                enforce_eager=enforce_eager,
                concurrency=concurrency,
                n_gpu_layers=n_gpu_layers,
            )
            est = estimate_model(
                model,
                engine=engine,
                settings=settings,
                device_total_bytes=device_bytes,
                device_name=device_name,
                engine_version=engine_version,
            )
        except (EstimateError, SizeError) as err:
            fail(str(err))
        if as_json:
            print_json(est.to_dict())
        else:
            _render(est)
