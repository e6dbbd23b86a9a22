"""`cohabit gpus`: what this machine (or a fleet file) has, slot by slot, with the hardware
and sharing class placement will use, and `--export` to write it as a fleet file."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich import box
from rich.table import Table

from cohabit.cli.commands import help_of
from cohabit.cli.output import EXIT_FAULT, console, fail, print_json
from cohabit.units import format_gib

if TYPE_CHECKING:
    from cohabit.hardware.model import Fleet, Gpu, Node
    from cohabit.hardware.slots import Slot, SlotKey


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("gpus", help=help_of("gpus"))(gpus)


def gpus(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    fleet_file: Path | None = typer.Option(
        None, "--fleet", help="Show a fleet file's nodes instead of this machine."
    ),
    export: Path | None = typer.Option(
        None, "--export", help="Also write what is shown as a fleet file (for `cohabit plan`)."
    ),
    url: str | None = typer.Option(
        None,
        "--url",
        help="Show what a running `cohabit serve` places on, with the budgets reserved there "
        "(API root, e.g. http://127.0.0.1:8420/api; token from COHABIT_API_TOKEN).",
    ),
) -> None:
    # Discovery (NVML, amdsmi) and the fleet file's parser load here, not for `--help`.
    from cohabit.hardware.discover import discover_local_fleet
    from cohabit.hardware.errors import HardwareError
    from cohabit.hardware.fleetfile import FileProblem, dump_fleet, load_fleet

    if url is not None:
        if fleet_file is not None or export is not None:
            fail("--url shows a server's hardware; it does not mix with --fleet or --export")
        _show_server(url, as_json=as_json)
        return
    live = fleet_file is None
    try:
        fleet = discover_local_fleet() if fleet_file is None else load_fleet(fleet_file)
    except FileProblem as exc:
        fail(str(exc))
    except HardwareError as exc:
        fail(f"hardware discovery failed: {exc}", code=EXIT_FAULT)
    if export is not None:
        try:
            export.write_text(dump_fleet(fleet), encoding="utf-8")
        except OSError as exc:
            fail(f"{export}: cannot write fleet file: {exc.strerror}")
    document = gpus_document(fleet, live=live)
    if as_json:
        print_json(document)
    else:
        _print_table(fleet, document)
        if export is not None:
            console.print(f"wrote {export}")


def gpus_document(
    fleet: Fleet, *, live: bool, reserved: Mapping[SlotKey, int] | None = None
) -> dict[str, Any]:
    """The `--json` document: the nodes as discovered and one entry per slot.

    `reserved` is the seam for the control plane: bytes reserved per `Slot.key` (none yet).
    Free is capacity minus reserved, and, for a live machine, no more than the driver's
    free memory (NVML free bytes for a GPU, MemAvailable for a pool).
    """
    from cohabit.hardware.slots import slots_of

    reserved = reserved or {}
    nodes = {node.name: node for node in fleet.nodes}
    return {
        "source": "discovered" if live else "fleet_file",
        "topology": fleet.topology.value,
        "fractional": fleet.fractional,
        "nodes": [_node_json(node) for node in fleet.nodes],
        "slots": [
            _slot_json(slot, nodes[slot.node], reserved.get(slot.key, 0), live=live)
            for slot in slots_of(fleet)
        ],
    }


def _slot_json(slot: Slot, node: Node, reserved_bytes: int, *, live: bool) -> dict[str, Any]:
    free_bytes = max(0, slot.capacity_bytes - reserved_bytes)
    live_free = _live_free(slot, node) if live else None
    if live_free is not None:
        free_bytes = min(free_bytes, live_free)
    return {
        "node": slot.node,
        "kind": slot.kind.value,
        "location": slot.location,
        "gpu_index": slot.gpu_index,
        "partition_index": slot.partition_index,
        "partition_profile": slot.partition_profile,
        "vendor": slot.vendor.value,
        "product": slot.product,
        "accel_version": slot.accel_version,
        "gpu_uuid": slot.gpu_uuid,
        "device_uuid": slot.device_uuid,
        "pci_bus_id": slot.pci_bus_id,
        "hardware_class": slot.hardware_class.value,
        "sharing_class": slot.sharing_class,
        "total_bytes": slot.total_bytes,
        "capacity_bytes": slot.capacity_bytes,
        "reserved_bytes": reserved_bytes,
        "free_bytes": free_bytes,
        "exclusive": slot.exclusive,
        "schedulable": slot.schedulable,
        "unschedulable_reason": slot.unschedulable_reason,
        "notices": [code.value for code in slot.notices],
    }


def _live_free(slot: Slot, node: Node) -> int | None:
    from cohabit.hardware.slots import SlotKind

    if slot.kind is SlotKind.POOL:
        return node.free_memory_bytes
    if slot.kind is SlotKind.GPU:
        gpu = next((g for g in node.gpus if g.index == slot.gpu_index), None)
        return gpu.free_bytes if gpu else None
    return None  # NVML has no per-MIG free figure here; the partition's capacity stands


def _node_json(node: Node) -> dict[str, Any]:
    return {
        "name": node.name,
        "os": node.os,
        "unified_memory_bytes": node.unified_memory_bytes,
        "memory_bytes": node.memory_bytes,
        "os_reserve_bytes": node.os_reserve_bytes,
        "free_memory_bytes": node.free_memory_bytes,
        "sharing_strategy": node.sharing_strategy.value if node.sharing_strategy else None,
        "sharing_replicas": node.sharing_replicas,
        "sharing_configured": node.sharing_configured,
        "schedulable": node.schedulable,
        "unschedulable_reason": node.unschedulable_reason,
        "notices": [{"code": n.code.value, "message": n.message} for n in node.notices],
        "gpus": [_gpu_json(gpu) for gpu in node.gpus],
    }


def _gpu_json(gpu: Gpu) -> dict[str, Any]:
    return {
        "index": gpu.index,
        "vendor": gpu.vendor.value,
        "product": gpu.product,
        "uuid": gpu.uuid,
        "pci_bus_id": gpu.pci_bus_id,
        "memory_bytes": gpu.memory_bytes,
        "free_bytes": gpu.free_bytes,
        "accel_version": gpu.accel_version,
        "driver_version": gpu.driver_version,
        "compute_capability": gpu.compute_capability,
        "mig_enabled": gpu.mig_enabled,
        "partitions": [
            {"profile": p.profile, "memory_bytes": p.memory_bytes, "uuid": p.uuid}
            for p in gpu.partitions
        ],
        "processes": [{"pid": p.pid, "used_bytes": p.used_bytes} for p in gpu.processes],
    }


def _show_server(url: str, *, as_json: bool) -> None:
    """The server's own view (`GET /cluster/hardware`): the same rows, with reservations."""
    from cohabit.cli.remote import connected

    with connected(url) as client:
        # The fleet's nodes: hardware entries an admin registered are never placed on.
        nodes = [node for node in client.cluster.hardware() if not node.registered]
    if as_json:
        print_json(
            {"source": "server", "url": url, "nodes": [n.model_dump(mode="json") for n in nodes]}
        )
        return
    rows = [{"node": node.name, **slot.model_dump()} for node in nodes for slot in node.slots]
    topology = nodes[0].topology if nodes and nodes[0].topology else "unknown topology"
    console.print(_table(f"server {url} · {topology}", rows))
    for node in nodes:
        if not node.schedulable:
            console.print(f"{node.name}: no placements")


def _print_table(fleet: Fleet, document: Mapping[str, Any]) -> None:
    title = f"{document['source'].replace('_', ' ')} · {fleet.topology.value}"
    console.print(_table(title, document["slots"]))
    for node in fleet.nodes:
        if not node.schedulable:
            console.print(f"{node.name}: no placements — {node.unschedulable_reason}")
        for notice in node.notices:
            console.print(f"{node.name}: {notice.code.value}: {notice.message}")
        for gpu in node.gpus:
            for process in gpu.processes:
                used = "?" if process.used_bytes is None else format_gib(process.used_bytes)
                console.print(f"{node.name} gpu {gpu.index}: pid {process.pid} uses {used}")


def _table(title: str, rows: list[dict[str, Any]]) -> Table:
    """One row per slot: where, classes, and total / capacity / free / reserved bytes."""
    table = Table(title=title, box=box.SIMPLE_HEAD)
    for column in ("node", "where", "vendor", "product"):
        table.add_column(column)
    for column in ("hardware class", "sharing class"):
        table.add_column(column, no_wrap=True)
    for column in ("total", "capacity", "free", "reserved"):
        table.add_column(column, justify="right")
    for row in rows:
        where = row["location"].removeprefix(f"{row['node']} ")
        table.add_row(
            row["node"],
            where,
            row["vendor"],
            row["product"],
            row["hardware_class"],
            row["sharing_class"],
            format_gib(row["total_bytes"]),
            format_gib(row["capacity_bytes"]),
            format_gib(row["free_bytes"]),
            format_gib(row["reserved_bytes"]),
        )
    if not console.is_terminal:
        # Piped output is not squeezed into 80 columns: classes stay whole and greppable.
        console.width = max(console.width, 200)
    return table
