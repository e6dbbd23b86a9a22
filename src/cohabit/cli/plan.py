"""`cohabit plan FLEET REQUESTS`: where would these models land? A dry run of placement on a
fleet file, online (one at a time, in file order) or as a batch (place the most). With
priorities in the file, online order unloads idle lower ones as the control plane does."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from cohabit.cli import output
from cohabit.cli.output import fail
from cohabit.placement.scoring import Policy
from cohabit.units import SizeError, format_gib, parse_size

if TYPE_CHECKING:
    from rich.text import Text

    from cohabit.cli.requestfile import RequestFile
    from cohabit.hardware.slots import Slot
    from cohabit.placement.decision import Decision, Placement
    from cohabit.placement.state import FleetState, Measurement

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
    import gc

    # A plan of thousands of requests makes a few hundred thousand objects, none of them in a
    # cycle, and every pass of the cyclic collector walks them and all that the command line
    # imported: on 12,000 requests those passes took a third as long as the work itself.
    # Reference counting frees what the plan made all the same.
    collecting = gc.isenabled()
    gc.disable()
    try:
        _plan(
            fleet,
            requests,
            policy=policy,
            batch=batch,
            as_json=as_json,
            measured=measured,
            headroom=headroom,
        )
    finally:
        if collecting:
            gc.enable()


def _plan(
    fleet: Path,
    requests: Path,
    *,
    policy: Policy,
    batch: bool,
    as_json: bool,
    measured: Path | None,
    headroom: str,
) -> None:
    # The file readers and the planner load here, not for `cohabit plan --help`.
    from cohabit.cli.requestfile import load_request_file
    from cohabit.hardware.fleetfile import load_fleet
    from cohabit.placement.batch import plan_batch
    from cohabit.placement.planner import plan_online
    from cohabit.placement.state import FleetState
    from cohabit.yamlfile import FileProblem

    try:
        fleet_model = load_fleet(fleet)
        wanted = load_request_file(requests)
        measurement = None if measured is None else load_measurement(measured, headroom)
    except FileProblem as exc:
        fail(str(exc))
    if batch and wanted.ranked:
        fail(
            f"{requests}: --batch chooses what to place by itself and takes no 'priority' or "
            "'min_copies'; drop them or --batch"
        )
    state = FleetState(fleet=fleet_model, measurement=measurement)
    if wanted.ranked:
        ranked = plan_ranked(state, wanted, policy=policy)
    else:
        planner = plan_batch if batch else plan_online
        ranked = RankedPlan(decisions=planner(state, list(wanted.requests), policy=policy))
    if as_json:
        write_plan_json(plan_document(ranked.decisions, ranked.unloaded_by))
        return
    _print_report(state, ranked, batch=batch, policy=policy)


@dataclass(frozen=True, slots=True, kw_only=True)
class RankedPlan:
    """Decisions in file order; which placed request a later one unloaded (victim → by)."""

    decisions: list[Decision]
    unloaded_by: dict[str, str] = field(default_factory=dict)


def plan_ranked(state: FleetState, wanted: RequestFile, *, policy: Policy) -> RankedPlan:
    """Online order with priorities: a request that does not fit unloads the cheapest set of
    earlier placed ones it may (placement/preemption.py). Nothing serves in a plan, so every
    placed request is idle, and the earliest placed counts as the least recently used."""
    from cohabit.placement.preemption import Candidate, plan_with_preemption
    from cohabit.placement.reasons import NoFit

    decisions: list[Decision] = []
    held: list[str] = []
    unloaded_by: dict[str, str] = {}
    for request in wanted.requests:
        candidates = [
            Candidate(
                deployment=name,
                name=name,
                priority=wanted.priorities[name],
                scale_to_zero=name in wanted.scale_to_zero,
                idle_s=float(len(held) - order),
            )
            for order, name in enumerate(held)
        ]
        result = plan_with_preemption(
            state,
            request,
            priority=wanted.priorities[request.name],
            candidates=candidates,
            policy=policy,
        )
        if isinstance(result, NoFit):
            decisions.append(result)
            continue
        for victim in result.victims:
            state = state.without(victim.deployment)
            held.remove(victim.deployment)
            unloaded_by[victim.deployment] = request.name
        state = state.with_reservations(result.placement.reservations())
        held.append(request.name)
        decisions.append(result.placement)
    return RankedPlan(decisions=decisions, unloaded_by=unloaded_by)


def load_measurement(path: Path, headroom: str) -> Measurement:
    """A recorded measurement file as placement input. Raises FileProblem naming what is
    wrong."""
    from cohabit.hardware.usage import UsageFileError, usage_from_json
    from cohabit.placement.state import Measurement
    from cohabit.yamlfile import FileProblem, load_mapping

    try:
        headroom_bytes = parse_size(headroom, field="--headroom")
        devices, cohabit = usage_from_json(load_mapping(path, what="measurement"))
    except (UsageFileError, SizeError) as exc:
        raise FileProblem(f"{path}: {exc}") from None
    return Measurement.of(devices, cohabit, headroom_bytes=headroom_bytes)


def plan_document(
    decisions: list[Decision], unloaded_by: dict[str, str] | None = None
) -> dict[str, Any]:
    """The `--json` document: one entry per request, in file order, and a summary. A placed
    request a later one unloaded says by which (`unloaded_by`)."""
    from cohabit.placement.decision import Placement

    unloaded_by = unloaded_by or {}
    entries: list[dict[str, Any]] = []
    placed = 0
    for decision in decisions:
        if isinstance(decision, Placement):
            placed += 1
            entry = {"name": decision.name, "placed": True, **decision.fields()}
            if decision.name in unloaded_by:
                entry["unloaded_by"] = unloaded_by[decision.name]
            entries.append(entry)
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
    summary = {"placed": placed, "failed": len(decisions) - placed}
    if unloaded_by:
        summary["unloaded"] = len(unloaded_by)
    return {"placements": entries, "summary": summary}


def write_plan_json(document: dict[str, Any]) -> None:
    """The `--json` document on stdout, one placement per line. json's C encoder writes only
    unindented JSON and its Python indenter took longer than planning 12,000 requests, so the
    placements are encoded in one call and a line starts before each entry's `{"name": `.
    That text cannot occur inside a JSON string (its quotes would be escaped there), so a
    line break before it leaves the same JSON; entries hold no other object keyed "name"."""
    placements = json.dumps(document["placements"])[1:-1]
    sys.stdout.write(
        '{\n  "placements": ['
        + (
            "\n    " + placements.replace(', {"name": ', ',\n    {"name": ') + "\n  "
            if placements
            else ""
        )
        + '],\n  "summary": '
        + json.dumps(document["summary"])
        + "\n}\n"
    )


def _print_report(state: FleetState, ranked: RankedPlan, *, batch: bool, policy: Policy) -> None:
    # rich loads for the report only, not for a `--json` plan.
    from rich.table import Table
    from rich.text import Text

    from cohabit.placement.decision import Placement
    from cohabit.placement.reasons import NoFit

    decisions, unloaded_by = ranked.decisions, ranked.unloaded_by
    placed = [d for d in decisions if isinstance(d, Placement)]
    failed = [d for d in decisions if isinstance(d, NoFit)]
    mode = "batch" if batch else f"online, {policy.value}"
    table = Table(title=f"Placement plan ({mode})", title_justify="left")
    for column in ("request", "budget", "where", "class"):
        table.add_column(column, no_wrap=column != "class")
    shown = decisions if len(decisions) <= TABLE_ROWS else failed[:TABLE_ROWS]
    for decision in shown:
        if isinstance(decision, Placement):
            where = _where(decision)
            if decision.name in unloaded_by:
                where += f", then unloaded for {unloaded_by[decision.name]}"
            table.add_row(
                decision.name,
                format_gib(decision.allocated_bytes),
                where,
                f"{decision.hardware_class.value} · {decision.sharing_class}",
            )
        else:
            table.add_row(
                decision.name,
                format_gib(decision.requested_bytes),
                Text("no fit", style="bold red"),
                Text(decision.reason.value, style="red"),
            )
    output.console.print(table)
    if len(decisions) > TABLE_ROWS:
        output.console.print(f"({len(decisions)} requests: table lists the ones that did not fit)")
    _print_devices(
        state.with_reservations(
            r for p in placed if p.name not in unloaded_by for r in p.reservations()
        )
    )
    for decision in failed[:TABLE_ROWS]:
        output.console.print(Text(f"{decision.name}: {decision.message}", style="red"))
        output.console.print(f"  fix: {decision.hint}")
    unloaded = f", {len(unloaded_by)} unloaded for others" if unloaded_by else ""
    output.console.print(
        Text(f"{len(placed)} placed, {len(failed)} did not fit{unloaded}", style="bold")
    )


def _where(placement: Placement) -> str:
    slot = placement.first
    if len(placement.allocations) > 1:
        gpus = ",".join(str(i) for i in placement.gpu_indices)
        return f"{placement.node} gpus {gpus}"
    return slot.location


def _print_devices(state: FleetState) -> None:
    from rich.table import Table

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
        output.console.print(table)
    else:
        total = sum(s.capacity_bytes for s in state.slots)
        reserved_all = sum(min(used.get(s.key, 0), s.capacity_bytes) for s in state.slots)
        output.console.print(
            f"{len(state.slots)} devices: {format_gib(reserved_all)} reserved "
            f"of {format_gib(total)}"
        )


def _bar(slot: Slot, reserved: int) -> Text:
    from rich.text import Text

    capacity = max(slot.capacity_bytes, 1)
    filled = min(BAR_WIDTH, round(BAR_WIDTH * reserved / capacity))
    bar = Text("█" * filled, style="magenta")
    bar.append("░" * (BAR_WIDTH - filled), style="green")
    return bar
