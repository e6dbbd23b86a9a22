"""Estimator accuracy: estimates against what engines printed on real GPUs.

Reads tests/fixtures/estimate/vram_measurements.jsonl (copied from shared/data) plus the llm-d
H100 profiling table, estimates each case from a stored config, and prints a markdown table
(docs/estimator.md shows it) and a summary. `--json` prints the rows as JSON instead.

    .venv/bin/python benchmarks/estimator_accuracy.py
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cohabit.estimate import estimate_model
from cohabit.units import GIB, MIB

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures" / "estimate"
CONFIGS = FIXTURES / "configs"
LLMD = "llm-d empirical-vllm-memory-results (H100, vLLM v0.11)"


@dataclass(frozen=True, slots=True, kw_only=True)
class Case:
    """One measured deployment: which stored config, which estimator settings, and the
    engine's printed figures (GiB; `kv_per_token` in bytes, None where the log did not say)."""

    id: str
    config: str
    settings: dict[str, Any]
    weights_gib: float | None
    activation_gib: float | None = None
    non_torch_gib: float | None = None
    kv_per_token: float | None = None
    gpu_gib: float | None = None
    quantized: bool = False
    note: str = ""
    engine: str = "vllm"
    compute_gib: float | None = None  # llama.cpp compute buffer


# Settings for each record of vram_measurements.jsonl, read from its fields.
RECORD_SETTINGS: dict[str, tuple[str, dict[str, Any], str]] = {
    "gt007": (
        "qwen2.5-7b-instruct",
        {"max_model_len": 4096, "device_total_bytes": int(79.3 * GIB)},
        "GPU name unknown: vLLM's large-GPU defaults assumed",
    ),
    "gt011": (
        "llama-3.2-3b-instruct",
        {
            "max_model_len": 10000,
            "quantization": "Q8_0",
            "enforce_eager": True,
            "device_name": "RTX 4070 Laptop",
        },
        "GGUF Q8_0 in vLLM",
    ),
    "gt022": ("mistral-small-3.2-24b-instruct", {"max_model_len": 16000}, "VLM"),
    "gt029": (
        "llama-3-8b",
        {"engine": "llamacpp", "quantization": "Q4_K_M", "max_model_len": 512},
        "llama.cpp Q4_K_M",
    ),
    "gt031": ("trilm-3.9b", {"engine": "llamacpp", "max_model_len": 512}, "llama.cpp f16"),
    "gt034": (
        "deepseek-v2.5",
        {
            "max_model_len": 8192,
            "tensor_parallel": 8,
            "pipeline_parallel": 2,
            "enforce_eager": True,
            "device_name": "A100",
        },
        "MLA, tp 8 × pp 2, V0",
    ),
    "gt039": (
        "llama-3.1-8b-instruct",
        {"max_model_len": 29000, "max_num_batched_tokens": 29000, "device_name": "RTX 3090"},
        "V0, 29k-token profile batch",
    ),
    "gt046": (
        "llama-3.1-405b-instruct-fp8",
        {"tensor_parallel": 8, "max_model_len": 8192},
        "weights only",
    ),
    "gt048": (
        "llama-3.2-11b-vision",
        {"max_model_len": 65536, "max_num_seqs": 128, "enforce_eager": True},
        "V0 mllama: cross-attention image profiling not modelled",
    ),
    "gt049": ("gpt-oss-20b", {"max_model_len": 131072}, "weights + KV only"),
}

LLMD_CASES = [
    Case(
        id="llmd-oss20",
        config="gpt-oss-20b",
        settings={"max_model_len": 16000},
        weights_gib=13.47,
        activation_gib=7.38,
        non_torch_gib=0.13,
        gpu_gib=79.18,
        quantized=True,
        note=LLMD,
    ),
    Case(
        id="llmd-oss120",
        config="gpt-oss-120b",
        settings={"max_model_len": 16000},
        weights_gib=64.38,
        activation_gib=7.38,
        non_torch_gib=0.13,
        gpu_gib=79.18,
        quantized=True,
        note=LLMD,
    ),
    Case(
        id="llmd-l70fp8",
        config="llama-3.3-70b-instruct-fp8-dynamic",
        settings={"max_model_len": 16000, "tensor_parallel": 2},
        weights_gib=33.88,
        activation_gib=4.84,
        non_torch_gib=0.55,
        gpu_gib=79.18,
        quantized=True,
        note=LLMD,
    ),
    Case(
        id="llmd-l8",
        config="llama-3.1-8b-instruct",
        settings={"max_model_len": 16000},
        weights_gib=14.99,
        activation_gib=4.76,
        non_torch_gib=0.13,
        gpu_gib=79.18,
        note=LLMD,
    ),
    Case(
        id="llmd-q06",
        config="qwen3-0.6b",
        settings={"max_model_len": 16000},
        weights_gib=1.12,
        activation_gib=5.56,
        non_torch_gib=0.13,
        gpu_gib=79.18,
        note=LLMD,
    ),
    Case(
        id="llmd-q32",
        config="qwen3-32b",
        settings={"max_model_len": 16000},
        weights_gib=61.03,
        activation_gib=5.64,
        non_torch_gib=0.14,
        gpu_gib=79.18,
        note=LLMD,
    ),
    Case(
        id="llmd-q32tp2",
        config="qwen3-32b",
        settings={"max_model_len": 16000, "tensor_parallel": 2},
        weights_gib=30.59,
        activation_gib=5.64,
        non_torch_gib=0.54,
        gpu_gib=79.18,
        note=LLMD,
    ),
]


def _record_case(record: dict[str, Any]) -> Case:
    config, settings, note = RECORD_SETTINGS[record["id"]]
    settings = dict(settings)
    gpu = record.get("gpu_total_memory_gib")
    if gpu and "device_total_bytes" not in settings:
        settings["device_total_bytes"] = int(gpu * GIB)
    if record.get("gpu_name") and "device_name" not in settings:
        settings["device_name"] = record["gpu_name"]
    kv_per_token = record.get("derived_kv_bytes_per_token_per_gpu")
    if kv_per_token is None and record.get("kv_cache_tokens") and record["id"] != "gt034":
        kv_per_token = record["kv_cache_gib"] * GIB / record["kv_cache_tokens"]
    if record["engine"] != "vllm":
        return Case(
            id=record["id"],
            config=config,
            settings=settings,
            engine="llamacpp",
            weights_gib=record["model_buffer_gpu_mib"] * MIB / GIB,
            kv_per_token=record["kv_buffer_gpu_mib"] * MIB / record["n_ctx"],
            compute_gib=record["compute_buffer_gpu_mib"] * MIB / GIB,
            gpu_gib=gpu,
            quantized="Q4" in str(record.get("quantization")),
            note=note,
        )
    return Case(
        id=record["id"],
        config=config,
        settings=settings,
        weights_gib=record.get("weights_gib"),
        activation_gib=record.get("activation_peak_gib"),
        non_torch_gib=record.get("non_torch_gib"),
        kv_per_token=kv_per_token,
        gpu_gib=gpu,
        quantized=bool(record.get("quantization")),
        note=note,
    )


def load_cases() -> list[Case]:
    lines = (FIXTURES / "vram_measurements.jsonl").read_text().splitlines()
    return [_record_case(json.loads(line)) for line in lines if line.strip()] + LLMD_CASES


def evaluate(case: Case) -> dict[str, Any]:
    est = estimate_model(CONFIGS / f"{case.config}.json", **case.settings)
    row: dict[str, Any] = {"id": case.id, "model": case.config, "note": case.note}
    row["weights_est_gib"] = est.weights_bytes / GIB
    row["weights_gib"] = case.weights_gib
    if case.weights_gib:
        row["weights_err"] = est.weights_bytes / GIB / case.weights_gib - 1
        row["weights_tol"] = 0.08 if case.quantized else 0.03
    row["kv_est"] = est.kv_cache_bytes_per_token
    row["kv_measured"] = case.kv_per_token
    if case.kv_per_token:
        row["kv_err"] = est.kv_cache_bytes_per_token / case.kv_per_token - 1
    per_token = case.kv_per_token or est.kv_cache_bytes_per_token
    length = est.max_model_len
    needed = None
    if case.engine == "llamacpp" and case.weights_gib and case.compute_gib is not None:
        kv = case.kv_per_token * -(-length // 256) * 256 if case.kv_per_token else 0
        needed = case.weights_gib + kv / GIB + case.compute_gib
    elif case.weights_gib and case.activation_gib is not None and case.non_torch_gib is not None:
        # what vLLM needed: weights + activation peak + non-torch + KV for one full sequence
        needed = (
            case.weights_gib + case.activation_gib + case.non_torch_gib + per_token * length / GIB
        )
    row["total_est_gib"] = est.total_bytes / GIB
    row["needed_gib"] = needed
    if needed:
        row["total_ratio"] = est.total_bytes / GIB / needed
        row["peer_rule_ratio"] = ((case.weights_gib or 0) * 1.2 + 2) / needed  # GPUStack's rule
        if case.gpu_gib:
            row["whole_card_ratio"] = case.gpu_gib * 0.9 / needed
    return row


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:+.1f}%"


def _num(value: float | None, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def markdown(rows: list[dict[str, Any]]) -> str:
    head = (
        "| case | model | weights est / measured GiB | err | KV B/token est / measured | err "
        "| total est / needed GiB | total ÷ needed | peer w×1.2+2 ÷ needed | note |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        lines.append(
            f"| {r['id']} | {r['model']} "
            f"| {r['weights_est_gib']:.2f} / {_num(r['weights_gib'], '.2f')} "
            f"| {_pct(r.get('weights_err'))} "
            f"| {r['kv_est']:,} / {_num(r['kv_measured'], ',.0f')} | {_pct(r.get('kv_err'))} "
            f"| {r['total_est_gib']:.2f} / {_num(r['needed_gib'], '.2f')} "
            f"| {_num(r.get('total_ratio'), '.3f')} | {_num(r.get('peer_rule_ratio'), '.3f')} "
            f"| {r['note']} |"
        )
    return head + "\n".join(lines)


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    weights_ok = [abs(r["weights_err"]) <= r["weights_tol"] for r in rows if "weights_err" in r]
    kv_ok = [abs(r["kv_err"]) <= 0.005 for r in rows if "kv_err" in r]
    ratios = [r["total_ratio"] for r in rows if "total_ratio" in r]
    peers = [r["peer_rule_ratio"] for r in rows if "peer_rule_ratio" in r]
    return {
        "cases": len(rows),
        "weights_within_target": f"{sum(weights_ok)}/{len(weights_ok)}",
        "kv_per_token_within_0.5%": f"{sum(kv_ok)}/{len(kv_ok)}",
        "total_never_below_needed": f"{sum(x >= 1 for x in ratios)}/{len(ratios)}",
        "below_needed": [r["id"] for r in rows if r.get("total_ratio", 1) < 1],
        "median_total_over_needed": f"{(statistics.median(ratios) - 1) * 100:+.1f}%",
        "peer_rule_below_needed": f"{sum(x < 1 for x in peers)}/{len(peers)}",
    }


def main(argv: list[str]) -> None:
    rows = [evaluate(case) for case in load_cases()]
    if "--json" in argv:
        sys.stdout.write(json.dumps({"rows": rows, "summary": summary(rows)}, indent=2) + "\n")
        return
    sys.stdout.write(markdown(rows) + "\n\n")
    for key, value in summary(rows).items():
        sys.stdout.write(f"- {key}: {value}\n")


if __name__ == "__main__":
    main(sys.argv[1:])
