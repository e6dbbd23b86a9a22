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
from cohabit.estimate.settings import EngineSettings
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


# For each record of vram_measurements.jsonl: the stored config that describes its model, any
# setting the record's fields do not carry (the GGUF file type, a GPU only named in prose), and
# a note. Everything else (engine version, lengths, scheduler limits, tp, pp, eager, GPU) is
# read from the record by `_record_settings`, so a new record needs one line here.
RECORD_SETTINGS: dict[str, tuple[str, dict[str, Any], str]] = {
    "gt007": ("qwen2.5-7b-instruct", {}, "GPU unknown: vLLM's large-GPU defaults assumed"),
    "gt011": ("llama-3.2-3b-instruct", {"quantization": "Q8_0"}, "GGUF Q8_0 in vLLM V0"),
    "gt022": ("mistral-small-3.2-24b-instruct", {}, "VLM, V1 encoder budget"),
    "gt029": ("llama-3-8b", {"quantization": "Q4_K_M"}, "llama.cpp Q4_K_M"),
    "gt031": ("trilm-3.9b", {}, "llama.cpp f16"),
    "gt034": ("deepseek-v2.5", {"device_name": "A100"}, "MLA, tp 8 × pp 2, V0"),
    "gt039": ("llama-3.1-8b-instruct", {}, "V0, 29k-token profile batch"),
    "gt046": ("llama-3.1-405b-instruct-fp8", {"max_model_len": 8192}, "weights only"),
    "gt048": ("llama-3.2-11b-vision", {}, "V0 mllama: 128 dummy images × 4 tiles"),
    "gt049": ("gpt-oss-20b", {}, "weights + KV only"),
}

# record field → estimate_model keyword, for the vLLM records
_RECORD_FIELDS = {
    "engine_version": "engine_version",
    "max_model_len": "max_model_len",
    "max_num_seqs": "max_num_seqs",
    "max_num_batched_tokens": "max_num_batched_tokens",
    "tensor_parallel_size": "tensor_parallel",
    "pipeline_parallel_size": "pipeline_parallel",
    "enforce_eager": "enforce_eager",
}


def _record_settings(record: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """estimate_model keywords from a record's fields (plus `extra`, which wins)."""
    settings: dict[str, Any] = {}
    if record["engine"] == "vllm":
        for field, keyword in _RECORD_FIELDS.items():
            if record.get(field) is not None:
                settings[keyword] = record[field]
        kv_dtype = str(record.get("kv_cache_dtype") or "auto")
        if kv_dtype.startswith("fp8"):
            settings["kv_cache_dtype"] = "fp8"
        gpu = record.get("gpu_total_memory_gib")
        if gpu:
            settings["device_total_bytes"] = int(gpu * GIB)
        if record.get("gpu_name"):
            settings["device_name"] = record["gpu_name"]
    else:
        settings["engine"] = "llamacpp"
        if record.get("n_ctx"):
            settings["max_model_len"] = record["n_ctx"]
        if record.get("flash_attn"):
            settings["flash_attn"] = True
    settings.update(extra)
    return settings


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
    config, extra, note = RECORD_SETTINGS[record["id"]]
    settings = _record_settings(record, extra)
    gpu = record.get("gpu_total_memory_gib")
    kv_per_token = record.get("derived_kv_bytes_per_token_per_gpu")
    if kv_per_token is None and record.get("kv_cache_tokens") and record["id"] != "gt034":
        kv_per_token = record["kv_cache_gib"] * GIB / record["kv_cache_tokens"]
    if record["engine"] != "vllm":
        return Case(
            id=record["id"],
            config=config,
            settings=settings,
            engine=settings["engine"],
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
    context = ("engine", "device_total_bytes", "device_name", "engine_version")
    settings = EngineSettings(**{k: v for k, v in case.settings.items() if k not in context})
    est = estimate_model(
        CONFIGS / f"{case.config}.json",
        settings=settings,
        **{k: v for k, v in case.settings.items() if k in context},
    )
    row: dict[str, Any] = {"id": case.id, "model": case.config, "note": case.note}
    row["weights_est_gib"] = est.weights_bytes / GIB
    row["weights_gib"] = case.weights_gib
    if case.weights_gib:
        row["weights_err"] = est.weights_bytes / GIB / case.weights_gib - 1
        row["weights_tol"] = 0.08 if case.quantized else 0.03
    row["act_est_gib"] = est.activation_bytes / GIB
    row["act_gib"] = case.activation_gib if case.engine == "vllm" else case.compute_gib
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
        "| activation est / measured GiB "
        "| total est / needed GiB | total ÷ needed | peer w×1.2+2 ÷ needed | note |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        lines.append(
            f"| {r['id']} | {r['model']} "
            f"| {r['weights_est_gib']:.2f} / {_num(r['weights_gib'], '.2f')} "
            f"| {_pct(r.get('weights_err'))} "
            f"| {r['kv_est']:,} / {_num(r['kv_measured'], ',.0f')} | {_pct(r.get('kv_err'))} "
            f"| {r['act_est_gib']:.2f} / {_num(r['act_gib'], '.2f')} "
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
