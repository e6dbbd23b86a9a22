"""GGUF variants: quantization names read from file names as llama.cpp writes them, split
files grouped, and the default choice — the largest variant that fits the largest free
device — on a 7B-shaped repo (Q4_K_M, Q8_0, F16 headers declaring full-size tensors, served by
the Hub stand-in: recorded answers of the real Hub API) and fleets where only some fit."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from cohabit.hardware.model import Fleet, Gpu, Node, Vendor
from cohabit.hub.variants import Variant, choose, first_file, quantization_of, variants_of
from cohabit.units import GIB
from tests.hub.repos import BIG_REPO
from tests.hub.standin import StandInHub
from tests.service.scripted_runtime import ScriptedRuntime
from tests.service.server import serving, settings_for


@pytest.mark.parametrize(
    ("name", "quant"),
    [
        ("qwen2.5-7b-instruct-q4_k_m.gguf", "Q4_K_M"),
        ("Meta-Llama-3.1-8B-Instruct-Q8_0.gguf", "Q8_0"),
        ("gemma-2-9b-it-IQ4_XS.gguf", "IQ4_XS"),
        ("Qwen3-8B-BF16.gguf", "BF16"),
        ("model.f16.gguf", "F16"),
        ("Q6_K/Llama-3.3-70B-Instruct-Q6_K-00001-of-00002.gguf", "Q6_K"),
        ("gpt-oss-20b-MXFP4.gguf", "MXFP4"),
        ("README.md", None),
        ("model.gguf", None),
    ],
)
def test_quantization_is_read_from_the_file_name(name: str, quant: str | None) -> None:
    assert quantization_of(name) == quant


def test_split_files_make_one_variant_and_projectors_none() -> None:
    found = variants_of(
        {
            "m-Q8_0-00002-of-00002.gguf": 3 * GIB,
            "m-Q8_0-00001-of-00002.gguf": 4 * GIB,
            "m-Q4_K_M.gguf": 4 * GIB,
            "mmproj-m-F16.gguf": GIB,
        }
    )
    assert [(v.name, v.size_bytes) for v in found] == [("Q4_K_M", 4 * GIB), ("Q8_0", 7 * GIB)]
    assert first_file(found[1]) == "m-Q8_0-00001-of-00002.gguf"


# Sizes of Qwen/Qwen2.5-7B-Instruct-GGUF's single-file variants as the Hub lists them.
QWEN = [
    Variant(name="Q4_K_M", files=("q4_k_m.gguf",), size_bytes=4_683_073_184),
    Variant(name="Q8_0", files=("q8_0.gguf",), size_bytes=8_098_525_888),
    Variant(name="F16", files=("fp16.gguf",), size_bytes=15_237_853_440),
]


@pytest.mark.parametrize(
    ("free_bytes", "chosen", "fits"),
    [
        (24 * GIB, "F16", True),
        (12 * GIB, "Q8_0", True),
        (6 * GIB, "Q4_K_M", True),
        (GIB, "Q4_K_M", False),
    ],
)
def test_the_largest_variant_that_fits_is_chosen(free_bytes: int, chosen: str, fits: bool) -> None:
    needed = {v.name: v.size_bytes + GIB for v in QWEN}
    choice = choose(QWEN, needed, largest_free_bytes=free_bytes, where="node-a gpu 0")
    assert (choice.variant.name, choice.fits) == (chosen, fits)
    assert "node-a gpu 0" in choice.reason and chosen in choice.reason


def _fleet(*gpu_gib: int) -> Fleet:
    gpus = tuple(
        Gpu(
            index=i,
            vendor=Vendor.NVIDIA,
            product="L4",
            memory_bytes=g * GIB,
            accel_version="12.4",
            uuid=f"GPU-{i}",
        )
        for i, g in enumerate(gpu_gib)
    )
    return Fleet(nodes=(Node(name="node-a", gpus=gpus),))


@pytest.mark.parametrize(
    ("gpus_gib", "chosen", "fitting"),
    [
        ((16, 24), "F16", {"Q4_K_M", "Q8_0", "F16"}),
        ((6, 10), "Q8_0", {"Q4_K_M", "Q8_0"}),
        ((5,), "Q4_K_M", {"Q4_K_M"}),
        ((4,), "Q4_K_M", set()),
    ],
)
def test_a_fleet_where_only_some_fit_gets_the_largest_that_does(
    hub: StandInHub,
    tmp_path: Path,
    database_url: str,
    gpus_gib: tuple[int, ...],
    chosen: str,
    fitting: set[str],
) -> None:
    settings = settings_for(tmp_path, database_url)
    with (
        serving(settings, ScriptedRuntime(), fleet=_fleet(*gpus_gib)) as api,
        httpx.Client(base_url=api, timeout=120) as client,
    ):
        listing = client.get("/models/variants/", params={"repo_id": BIG_REPO}).json()
        rows = {v["name"]: v for v in listing["variants"]}
        assert list(rows) == ["Q4_K_M", "Q8_0", "F16"]  # smallest first
        assert all(set(v["estimates"]) == {"llamacpp", "vllm"} for v in rows.values())
        # each engine needs more than the file: its KV cache and runtime come on top
        assert all(v["estimates"]["llamacpp"] > v["size"] for v in rows.values())
        assert {name for name, v in rows.items() if v["fits"]} == fitting
        assert listing["chosen"] == chosen
        largest = max(gpus_gib)
        assert listing["largest_free_bytes"] == largest * GIB
        assert f"gpu {gpus_gib.index(largest)}" in listing["reason"]

        for name in hub.repos[BIG_REPO].files:  # the download queued below is stopped early
            hub.throttle[name] = 1024 * 1024
        started = client.post("/models/download/", json={"model": BIG_REPO, "hub": "HubsHf"})
        # the choice is what a download without a variant would fetch (not waited for here)
        assert started.status_code == 202, started.text
        assert started.json()["variant"] == chosen
