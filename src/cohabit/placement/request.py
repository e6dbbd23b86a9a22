"""PlacementRequest: what one deployment asks of the fleet (bytes per shard, TP, vendor,
minimum accelerator version, engine). Built by the CLI, the control plane and the operator."""

from __future__ import annotations

from dataclasses import dataclass

from cohabit.hardware.model import Vendor, version_key
from cohabit.placement.errors import InvalidRequest

# Which devices each engine can run on. llama.cpp runs on every vendor and on the CPU.
ENGINE_VENDORS: dict[str, frozenset[Vendor]] = {
    "vllm": frozenset({Vendor.NVIDIA, Vendor.AMD}),
    "mlx": frozenset({Vendor.APPLE}),
    "llamacpp": frozenset(Vendor),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class PlacementRequest:
    """One deployment to place.

    `vram_bytes` is the budget per shard: a tensor-parallel request of N reserves it on each
    of N devices of one node.
    """

    name: str
    vram_bytes: int
    tensor_parallel: int = 1
    vendor: Vendor | None = None
    min_accel_version: str | None = None
    engine: str | None = None

    def __post_init__(self) -> None:
        if not self.name:
            raise InvalidRequest("request: 'name' must not be empty")
        if self.vram_bytes <= 0:
            raise InvalidRequest(f"request {self.name!r}: 'vram' must be greater than zero")
        if self.tensor_parallel < 1:
            raise InvalidRequest(
                f"request {self.name!r}: 'tensor_parallel' must be at least 1, "
                f"got {self.tensor_parallel}"
            )
        if self.engine is not None and self.engine not in ENGINE_VENDORS:
            raise InvalidRequest(
                f"request {self.name!r}: unknown engine {self.engine!r} "
                f"(known: {', '.join(sorted(ENGINE_VENDORS))})"
            )
        if self.min_accel_version is not None and not version_key(self.min_accel_version):
            raise InvalidRequest(
                f"request {self.name!r}: 'min_accel_version' {self.min_accel_version!r} "
                "is not a version such as 12.1"
            )

    @property
    def total_bytes(self) -> int:
        """Bytes over all shards."""
        return self.vram_bytes * self.tensor_parallel

    def eligible_vendors(self) -> frozenset[Vendor]:
        """Vendors whose devices may hold this request: the asked vendor, within what the
        engine runs on."""
        vendors = ENGINE_VENDORS.get(self.engine or "", frozenset(Vendor))
        if self.vendor is not None:
            vendors = vendors & {self.vendor}
        return vendors
