"""`cohabit plan FLEET REQUESTS`: where would these models land? A dry run of placement on a
fleet file, online (one at a time, in file order) or as a batch (place the most)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from cohabit.cli.output import console, fail
from cohabit.cli.requestfile import load_requests
from cohabit.hardware.fleetfile import load_fleet
from cohabit.hardware.slots import Slot
from cohabit.hardware.usage import UsageFileError, usage_from_json
from cohabit.placement.batch import plan_batch
from cohabit.placement.planner import Decision, Placement, plan_online
from cohabit.placement.reasons import NoFit
from cohabit.placement.scoring import Policy
from cohabit.placement.state import FleetState, Measurement
from cohabit.units import SizeError, format_gib, parse_size
from cohabit.yamlfile import FileProblem, load_mapping

BAR_WIDTH = 16
# Past this many requests the table lists only what did not fit; --json always has all.
TABLE_ROWS = 200


def register(app: typer.Typer) -> None:
    app.command("plan")(plan_command)


def plan_command(
    fleet: Path = typer.Argument(..., help="Fleet file (YAML): nodes, GPUs, partitions, pools."),
    requests: Path = typer.Argument(..., help="Request file (YAML): name, vram per shard, …"),
    policy: Policy = typer.Option(Policy.BINPACK, "--policy", help="Scoring: binpack or spread."),
    batch: bool = typer.Option(
        False, "--batch", help="Place the most requests (then bytes) instead of file order."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    measured: Path | None = typer.Option(
        None,
        "--measured",
        help="A recorded measurement (YAML/JSON `devices:` with node, gpu_index, "
        "partition_index, total, used, free, cohabit): memory held outside cohabit is "
        "not counted on.",
    ),
    headroom: str = typer.Option(
        "1GiB", "--headroom", help="With --measured: memory kept free beside what is free."
    ),
) -> None:
    """Show where each request would land on FLEET, or why it cannot fit. Deploys nothing."""
    try:
        fleet_model = load_fleet(fleet)
        wanted = load_requests(requests)
        measurement = None if measured is None else load_measurement(measured, headroom)
    except FileProblem as exc:
        fail(str(exc))
    state = FleetState(fleet=fleet_model, measurement=measurement)
    planner = plan_batch if batch else plan_online
    decisions = planner(state, wanted, policy=policy)
    if as_json:
        write_plan_json(plan_document(decisions))
        return
    _print_report(state, decisions, batch=batch, policy=policy)


def load_measurement(path: Path, headroom: str) -> Measurement:
    """A recorded measurement file as placement input. Raises FileProblem naming what is
    wrong."""
    try:
        headroom_bytes = parse_size(headroom, field="--headroom")
        devices, cohabit = usage_from_json(load_mapping(path, what="measurement"))
    except (UsageFileError, SizeError) as exc:
        raise FileProblem(f"{path}: {exc}") from None
    return Measurement.of(devices, cohabit, headroom_bytes=headroom_bytes)


def plan_document(decisions: list[Decision]) -> dict[str, Any]:
    """The `--json` document: one entry per request, in file order, and a summary."""
    entries: list[dict[str, Any]] = []
    for decision in decisions:
        if isinstance(decision, Placement):
            entries.append({"name": decision.name, "placed": True, **decision.fields()})
        else:
            entries.append(
                {
                    "name": decision.name,
                    "placed": False,
                    "reason": decision.reason.value,
                    "message": decision.message,
                    "details": decision.details(),
                }
            )
    placed = sum(1 for d in decisions if d.placed)
    return {"placements": entries, "summary": {"placed": placed, "failed": len(decisions) - placed}}


def write_plan_json(document: dict[str, Any]) -> None:
    """The `--json` document on stdout, one placement per line. json's C encoder writes only
    unindented JSON and its Python indenter took longer than planning 12,000 requests, so the
    outer levels are laid out here and each entry is encoded whole."""
    entries = ",\n".join("    " + json.dumps(entry) for entry in document["placements"])
    sys.stdout.write(
        '{\n  "placements": [\n'
        + entries
        + ('\n  ],\n  "summary": ' if entries else '],\n  "summary": ')
        + json.dumps(document["summary"])
        + "\n}\n"
    )


def _print_report(
    state: FleetState, decisions: list[Decision], *, batch: bool, policy: Policy
) -> None:
    placed = [d for d in decisions if isinstance(d, Placement)]
    failed = [d for d in decisions if isinstance(d, NoFit)]
    mode = "batch" if batch else f"online, {policy.value}"
    table = Table(title=f"Placement plan ({mode})", title_justify="left")
    for column in ("request", "budget", "where", "class"):
        table.add_column(column, no_wrap=column != "class")
    shown = decisions if len(decisions) <= TABLE_ROWS else failed[:TABLE_ROWS]
    for decision in shown:
        if isinstance(decision, Placement):
            table.add_row(
                decision.name,
                format_gib(decision.allocated_bytes),
                _where(decision),
                f"{decision.hardware_class.value} · {decision.sharing_class}",
            )
        else:
            table.add_row(
                decision.name,
                format_gib(decision.requested_bytes),
                Text("no fit", style="bold red"),
                Text(decision.reason.value, style="red"),
            )
    console.print(table)
    if len(decisions) > TABLE_ROWS:
        console.print(f"({len(decisions)} requests: table lists the ones that did not fit)")
    _print_devices(state.with_reservations(r for p in placed for r in p.reservations()))
    for decision in failed[:TABLE_ROWS]:
        console.print(Text(f"{decision.name}: {decision.message}", style="red"))
        console.print(f"  fix: {decision.hint}")
    console.print(f"[bold]{len(placed)} placed, {len(failed)} did not fit[/]")


def _where(placement: Placement) -> str:
    slot = placement.first
    if len(placement.allocations) > 1:
        gpus = ",".join(str(i) for i in placement.gpu_indices)
        return f"{placement.node} gpus {gpus}"
    return slot.location


def _print_devices(state: FleetState) -> None:
    used = state.used_bytes()
    table = Table(title="Devices", title_justify="left")
    for column in ("device", "reserved / capacity", "", "class"):
        table.add_column(column, no_wrap=column != "class")
    rows = state.slots if len(state.slots) <= TABLE_ROWS else ()
    for slot in rows:
        reserved = used.get(slot.key, 0)
        table.add_row(
            slot.location,
            f"{format_gib(reserved)} / {format_gib(slot.capacity_bytes)}",
            _bar(slot, reserved),
            f"{slot.hardware_class.value} · {slot.sharing_class}",
        )
    if rows:
        console.print(table)
    else:
        total = sum(s.capacity_bytes for s in state.slots)
        reserved_all = sum(min(used.get(s.key, 0), s.capacity_bytes) for s in state.slots)
        console.print(
            f"{len(state.slots)} devices: {format_gib(reserved_all)} reserved "
            f"of {format_gib(total)}"
        )


def _bar(slot: Slot, reserved: int) -> Text:
    capacity = max(slot.capacity_bytes, 1)
    filled = min(BAR_WIDTH, round(BAR_WIDTH * reserved / capacity))
    bar = Text("█" * filled, style="magenta")
    bar.append("░" * (BAR_WIDTH - filled), style="green")
    return bar
