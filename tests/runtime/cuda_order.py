"""What CUDA would make of an engine's environment on a recorded machine: which cards, in
which order, `CUDA_VISIBLE_DEVICES` selects there. Used to check that the devices an engine is
given are the ones placement reserved, without a GPU.

The rules are the CUDA Programming Guide's ("CUDA Environment Variables"):
`CUDA_DEVICE_ORDER` is FASTEST_FIRST unless set to PCI_BUS_ID (ascending PCI bus id, the
order NVML and nvidia-smi use); `CUDA_VISIBLE_DEVICES` lists indices into that order or UUIDs
(a unique prefix is enough; MIG devices as ``MIG-…``), and an entry that matches nothing ends
the list. FASTEST_FIRST is CUDA's own heuristic; for the recorded machines (cards of one
architecture) it is the order of their CUDA core counts, which the snapshots record as
`nvmlDeviceGetNumGpuCores`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def visible_cards(snapshot: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """The UUIDs of the cards (or MIG devices) CUDA shows a process with `env`, in order."""
    devices = list(snapshot["devices"])
    by_bus = sorted(devices, key=lambda d: d["nvmlDeviceGetPciInfo"]["busId"])
    if env.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST") == "PCI_BUS_ID":
        order = by_bus
    else:  # a stable sort: equal cards keep their bus order
        order = sorted(by_bus, key=lambda d: -int(d["nvmlDeviceGetNumGpuCores"]))
    uuids = [str(d["nvmlDeviceGetUUID"]) for d in order]
    mig_uuids = [str(mig["nvmlDeviceGetUUID"]) for d in order for mig in d.get("mig_devices", [])]
    wanted = env.get("CUDA_VISIBLE_DEVICES")
    if wanted is None:
        return uuids
    chosen: list[str] = []
    for token in (part.strip() for part in wanted.split(",")):
        if token.isdigit():
            match = [uuids[int(token)]] if int(token) < len(uuids) else []
        else:
            match = [uuid for uuid in [*uuids, *mig_uuids] if uuid.startswith(token)]
        if len(match) != 1 or match[0] in chosen:
            break
        chosen.append(match[0])
    return chosen
