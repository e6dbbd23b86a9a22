"""What preparing a ResourceClaim on this node means, as pure values: the claim's devices of
driver `gpu.cohabit.dev` mapped onto the node's hardware, and the CDI spec that hands them to
the container. `plugin.py` reads the claim, writes the spec and answers the kubelet.

A claim that cannot be prepared here (another uid, another node, a device the node does not
have) is an `Unpreparable` value whose reason the kubelet shows on the pod; it is not a fault.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cohabit.hardware.model import Node, Vendor
from cohabit.hardware.slots import SlotKind
from cohabit.kube import dra
from cohabit.kube.deviceplugin.plugin import DEVICE_ENV
from cohabit.kube.resources import VISIBLE_DEVICES

# CDI spec version 0.5.0: the oldest that allows a device name starting with a digit, as
# ours do (a claim uid), and all that env edits need; the oldest that fits is what the most
# container runtimes accept (docs/kubernetes.md, "The CDI spec of a claim").
CDI_VERSION = "0.5.0"
# "<vendor prefix>/<name>" (the same section): one kind for every claim's spec, the device
# names within it distinct because each starts with the claim's uid.
CDI_KIND = f"{dra.DRIVER}/claim"
# The memory the claim holds on a device, one key per device (as DEVICE_ENV is), so a
# container given several devices keeps each one's; the value is whole bytes.
MEMORY_ENV = "COHABIT_MEMORY_LIMIT_BYTES_{device}"


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeDevice:
    """One device of the node's pool as `dra.node_slices` publishes it. `selector` is what a
    vendor runtime is pointed at (the GPU's or partition's UUID, else the GPU's index; a
    unified pool's GPU; None for a partition with no UUID of its own); `capacity_bytes` is
    what a claim taking the device whole holds."""

    name: str
    vendor: Vendor
    selector: str | None
    capacity_bytes: int


def node_devices(node: Node) -> dict[str, NodeDevice]:
    """The node's devices by their published name (`dra.published_slots`)."""
    devices: dict[str, NodeDevice] = {}
    for name, slot in dra.published_slots(node).items():
        selector = slot.device_uuid
        if slot.kind is SlotKind.POOL:
            selector = slot.gpu_uuid
        elif slot.kind is SlotKind.GPU and selector is None:
            selector = str(slot.gpu_index)
        devices[name] = NodeDevice(
            name=name, vendor=slot.vendor, selector=selector, capacity_bytes=slot.capacity_bytes
        )
    return devices


@dataclass(frozen=True, slots=True, kw_only=True)
class PreparedDevice:
    """One allocated device as the kubelet is told of it and the container is given it."""

    request: str
    pool: str
    device: NodeDevice
    share_id: str | None
    memory_bytes: int

    @property
    def env_suffix(self) -> str:
        """ "gpu-1-part-2" -> "GPU_1_PART_2": distinct per device, as env names allow."""
        return self.device.name.upper().replace("-", "_")


@dataclass(frozen=True, slots=True, kw_only=True)
class PreparedClaim:
    """A claim's devices on this node, and their CDI spec (`cdi_spec()`)."""

    uid: str
    devices: tuple[PreparedDevice, ...]

    def cdi_name(self, device: PreparedDevice) -> str:
        """The CDI device name: the claim's uid and the device, unique on the node."""
        return f"{self.uid}-{device.device.name}"

    def cdi_id(self, device: PreparedDevice) -> str:
        """The fully qualified CDI device the kubelet passes to the runtime."""
        return f"{CDI_KIND}={self.cdi_name(device)}"

    def cdi_spec(self) -> dict[str, Any]:
        """The CDI spec (docs/kubernetes.md, "The CDI spec of a claim"): per device,
        `COHABIT_VISIBLE_DEVICE_<device>` and the memory held on it; for the whole claim,
        the vendor runtime's variable naming all its devices. That one is at spec level,
        applied whenever any of the claim's devices is: the runtime reads one value, so
        per-device values would leave a tensor-parallel container one GPU (the container's
        env keeps the last)."""
        devices = []
        runtime: dict[str, list[str]] = {}
        for prepared in self.devices:
            device = prepared.device
            env = []
            if device.selector is not None:
                env.append(f"{DEVICE_ENV.format(index=prepared.env_suffix)}={device.selector}")
                names = VISIBLE_DEVICES.get(device.vendor)
                if names is not None:
                    runtime.setdefault(names[0], []).append(device.selector)
            env.append(f"{MEMORY_ENV.format(device=prepared.env_suffix)}={prepared.memory_bytes}")
            devices.append({"name": self.cdi_name(prepared), "containerEdits": {"env": env}})
        spec: dict[str, Any] = {"cdiVersion": CDI_VERSION, "kind": CDI_KIND, "devices": devices}
        if runtime:
            shared = [f"{name}={','.join(selectors)}" for name, selectors in runtime.items()]
            spec["containerEdits"] = {"env": shared}
        return spec


@dataclass(frozen=True, slots=True, kw_only=True)
class Unpreparable:
    """Why a claim cannot be prepared here; the kubelet retries and shows the reason."""

    reason: str


def prepare_claim(
    claim: Mapping[str, Any] | None,
    *,
    namespace: str,
    name: str,
    uid: str,
    node_name: str,
    devices: Mapping[str, NodeDevice],
) -> PreparedClaim | Unpreparable:
    """The claim the kubelet named (`claim` as the API server returns it, None when it is not
    there) prepared for `node_name`, whose devices are `devices`. Only this node's pool is
    prepared: a claim's devices of this driver are all on the node it was allocated for."""
    where = f"ResourceClaim {namespace}/{name}"
    if claim is None:
        return Unpreparable(reason=f"{where} not found")
    found_uid = (claim.get("metadata") or {}).get("uid")
    if found_uid != uid:
        return Unpreparable(
            reason=f"{where} has uid {found_uid}, the kubelet asked for {uid} "
            "(deleted and created again?)"
        )
    allocated = dra.allocated(claim)
    if not allocated:
        return Unpreparable(reason=f"{where} has no {dra.DRIVER} device allocated")
    here = [device for device in allocated if device.node == node_name]
    if not here:
        pools = sorted({device.node for device in allocated})
        return Unpreparable(
            reason=f"{where} is allocated on {', '.join(pools)}, not on this node {node_name}"
        )
    prepared = []
    for device in here:
        known = devices.get(device.device)
        if known is None:
            return Unpreparable(
                reason=f"{where}: node {node_name} has no device {device.device} "
                "(its hardware changed since the slices were published?)"
            )
        prepared.append(
            PreparedDevice(
                request=device.request,
                pool=device.node,
                device=known,
                share_id=device.share_id,
                memory_bytes=(
                    known.capacity_bytes if device.memory_bytes is None else device.memory_bytes
                ),
            )
        )
    return PreparedClaim(uid=uid, devices=tuple(prepared))
