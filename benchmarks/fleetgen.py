"""Random but realistic fleets and request mixes for the placement benchmarks (seeded)."""

from __future__ import annotations

import random

from cohabit.hardware.model import Fleet, Gpu, Node, Partition, Vendor
from cohabit.placement.request import PlacementRequest
from cohabit.units import GIB

CARDS = [
    (Vendor.NVIDIA, "Tesla T4", 16, "12.4"),
    (Vendor.NVIDIA, "NVIDIA L4", 24, "12.4"),
    (Vendor.NVIDIA, "NVIDIA A100-SXM4-40GB", 40, "12.2"),
    (Vendor.NVIDIA, "NVIDIA L40S", 48, "12.8"),
    (Vendor.NVIDIA, "NVIDIA H100 80GB HBM3", 80, "12.10"),
    (Vendor.AMD, "AMD Instinct MI210", 64, "6.2"),
]
MIG_LAYOUT = [("3g.40gb", 40), ("2g.20gb", 20), ("1g.10gb", 10), ("1g.10gb", 10)]


def random_fleet(nodes: int, gpus_per_node: int, *, seed: int = 7) -> Fleet:
    """`nodes` nodes of one card type each; one node in ten has its H100s in MIG mode."""
    rng = random.Random(seed)
    built = []
    for n in range(nodes):
        vendor, product, memory_gib, version = rng.choice(CARDS)
        mig = vendor is Vendor.NVIDIA and memory_gib == 80 and rng.random() < 0.3
        gpus = tuple(
            Gpu(
                index=i,
                vendor=vendor,
                product=product,
                memory_bytes=memory_gib * GIB,
                accel_version=version,
                partitions=tuple(Partition(profile=p, memory_bytes=m * GIB) for p, m in MIG_LAYOUT)
                if mig
                else (),
            )
            for i in range(gpus_per_node)
        )
        built.append(Node(name=f"node-{n:05d}", gpus=gpus))
    return Fleet(nodes=tuple(built))


def random_requests(count: int, *, seed: int = 11) -> list[PlacementRequest]:
    """Mostly 1-GPU models of 2–40 GiB, one in twenty tensor-parallel, some pinned to a
    vendor or a minimum CUDA version."""
    rng = random.Random(seed)
    requests = []
    for i in range(count):
        size_gib = min(40.0, max(1.5, rng.lognormvariate(2.0, 0.7)))
        tp = rng.choice([2, 2, 4, 8]) if rng.random() < 0.05 else 1
        roll = rng.random()
        requests.append(
            PlacementRequest(
                name=f"model-{i:06d}",
                vram_bytes=int(size_gib * GIB),
                tensor_parallel=tp,
                vendor=Vendor.NVIDIA if roll < 0.3 else None,
                min_accel_version="12.4" if 0.3 <= roll < 0.4 else None,
                engine="vllm" if 0.4 <= roll < 0.6 else None,
            )
        )
    return requests
