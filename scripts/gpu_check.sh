#!/usr/bin/env bash
# Real-GPU checks on an NVIDIA machine (not part of CI), in two steps.
#
# 1. Discovery against nvidia-smi: runs `cohabit gpus --json`, prints it, and compares it with
#    nvidia-smi: same GPUs (by UUID, with their PCI bus id), memory within 1% (unified-memory GPUs such as GB10: the
#    pool against MemTotal), same MIG mode, and the same MIG instances (UUID and profile, from
#    `nvidia-smi -L`).
# 2. Engines on the GPU: `pytest -m gpu tests/gpu` — real llama.cpp CUDA servers started by
#    `cohabit serve`, checked with NVML's per-process figures: two engines on one GPU each
#    within budget, an engine on the card chosen by UUID, and (when MIG is on) one on a MIG
#    slice. Needs a CUDA build of `llama-server` on PATH and the dev dependencies in PYTHON.
#
# Exit 0 when everything agrees and passes; 1 with one MISMATCH line per difference or when a
# GPU test fails; 2 when it cannot run.
#
# Usage: scripts/gpu_check.sh            (from the repository root; PYTHON=... to choose)
set -euo pipefail

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
if [[ ! -x "$PYTHON" ]]; then
    PYTHON="$(command -v python3 || true)"
fi
if [[ -z "$PYTHON" ]]; then
    echo "gpu_check: no python found (set PYTHON=...)" >&2
    exit 2
fi
if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "gpu_check: nvidia-smi not found: this check needs a machine with an NVIDIA GPU" >&2
    exit 2
fi

workdir="$(mktemp -d)"
trap 'rm -rf "$workdir"' EXIT

if ! "$PYTHON" -m cohabit gpus --json >"$workdir/discovered.json" 2>"$workdir/discover.err"; then
    echo "gpu_check: cohabit gpus --json failed:" >&2
    cat "$workdir/discover.err" >&2
    exit 1
fi
echo "== cohabit gpus --json"
cat "$workdir/discovered.json"

nvidia-smi --query-gpu=index,uuid,name,memory.total,mig.mode.current,pci.bus_id \
    --format=csv,noheader,nounits >"$workdir/smi.csv"
nvidia-smi -L >"$workdir/smi-list.txt"
echo "== nvidia-smi --query-gpu=index,uuid,name,memory.total,mig.mode.current,pci.bus_id"
cat "$workdir/smi.csv"
echo "== nvidia-smi -L"
cat "$workdir/smi-list.txt"

"$PYTHON" - "$workdir" <<'PY'
import csv
import json
import re
import sys
from pathlib import Path

MIB = 1 << 20
workdir = Path(sys.argv[1])
document = json.loads((workdir / "discovered.json").read_text())
node = document["nodes"][0]
gpus = {gpu["uuid"]: gpu for gpu in node["gpus"] if gpu["vendor"] == "nvidia"}
problems: list[str] = []

rows = [
    [cell.strip() for cell in row]
    for row in csv.reader((workdir / "smi.csv").read_text().splitlines())
    if row
]
if not rows:
    print("gpu_check: nvidia-smi lists no GPU; nothing to check", file=sys.stderr)
    sys.exit(2)
left_out = " ".join(n["message"] for n in node["notices"] if "left out" in n["message"])


def meminfo_total() -> int | None:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None


def close(a: int, b: int) -> bool:
    return abs(a - b) <= 0.01 * max(a, b)


for index, uuid, name, memory, mig, bus_id in rows:
    gpu = gpus.pop(uuid, None)
    if gpu is None:
        if mig == "Enabled" and f"GPU {index} " in left_out:
            print(f"note: GPU {index} has MIG on and no instances; discovery left it out")
            continue
        problems.append(f"GPU {index} {uuid} ({name}) is missing from discovery")
        continue
    if str(gpu["index"]) != index:
        problems.append(f"{uuid}: index {gpu['index']} != nvidia-smi {index}")
    if memory.isdigit():
        expected = int(memory) * MIB
        got = gpu["memory_bytes"]
        if got is None or not close(got, expected):
            problems.append(f"GPU {index}: memory {got} bytes != nvidia-smi {expected} (>1%)")
    else:  # [N/A]: a unified-memory GPU (GB10); the node's pool must be the host memory
        pool, host = node["unified_memory_bytes"], meminfo_total()
        if gpu["memory_bytes"] is not None or pool is None:
            problems.append(f"GPU {index}: nvidia-smi has no memory size but discovery is not unified")
        elif host is not None and not close(pool, host):
            problems.append(f"GPU {index}: unified pool {pool} != MemTotal {host} (>1%)")
    if (gpu.get("pci_bus_id") or "").upper() != bus_id.upper():
        problems.append(f"GPU {index}: pci_bus_id {gpu.get('pci_bus_id')} != nvidia-smi {bus_id}")
    expected_mig = {"Enabled": True, "Disabled": False}.get(mig)
    if gpu["mig_enabled"] != expected_mig:
        problems.append(f"GPU {index}: mig_enabled {gpu['mig_enabled']} != nvidia-smi {mig!r}")

for uuid, gpu in gpus.items():
    problems.append(f"discovery has GPU {gpu['index']} {uuid} that nvidia-smi does not list")

# MIG instances: `nvidia-smi -L` lines "  MIG 3g.40gb     Device  0: (UUID: MIG-...)".
listed: dict[str, str] = {}
for line in (workdir / "smi-list.txt").read_text().splitlines():
    match = re.search(r"MIG\s+(\S+)\s+Device\s+\d+:\s+\(UUID:\s+(MIG-[^)\s]+)\)", line)
    if match:
        listed[match.group(2)] = match.group(1)
found = {
    part["uuid"]: part["profile"]
    for gpu in node["gpus"]
    for part in gpu["partitions"]
    if part["uuid"]
}
if set(found) != set(listed):
    problems.append(f"MIG instances differ: discovery {sorted(found)} vs nvidia-smi {sorted(listed)}")
for uuid, profile in listed.items():
    if uuid in found and found[uuid] != profile:
        problems.append(f"{uuid}: profile {found[uuid]} != nvidia-smi {profile}")

for slot in document["slots"]:
    if not {"hardware_class", "sharing_class", "total_bytes", "capacity_bytes"} <= set(slot):
        problems.append(f"{slot.get('location')}: slot lacks its classes or sizes")

if problems:
    for problem in problems:
        print(f"MISMATCH: {problem}", file=sys.stderr)
    print(f"gpu_check: FAILED ({len(problems)} mismatches)", file=sys.stderr)
    sys.exit(1)
print(f"gpu_check: OK — {len(rows)} GPU(s), {len(listed)} MIG instance(s) agree with nvidia-smi")
PY

markers="gpu and not gpu_mig"
if grep -q "Enabled" <(cut -d, -f5 "$workdir/smi.csv"); then
    markers="gpu"
fi
echo "== pytest -m '$markers' tests/gpu"
"$PYTHON" -m pytest tests/gpu -m "$markers" -v -s -p no:cacheprovider
