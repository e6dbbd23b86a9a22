"""`cohabit ps`: the server's deployments — model, status (UNLOADED: scaled to zero, loaded
by its next request), its copies (serving / running), where each landed (node, GPU,
partition or pool), its hardware and sharing class, its budget, when it was last used, and
how to reach it (or, while it loads, the phase its load is in and for how long; its place in
the queue; the error code that stopped it). One line per deployment: what does not fit the
terminal is cut with "…", and --wide (or --json) shows every value whole, the full endpoint
URL among them. Ended ones only with --all; one line per copy under each with --verbose.

It reads the list as the JSON it is (`listing`), through the SDK's wire alone
(`remote.reading`): the command answers before the SDK's models would have loaded."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cohabit.cli.commands import help_of
from cohabit.cli.listing import Listed, ListedCopy, listed
from cohabit.cli.output import print_json
from cohabit.cli.remote import (
    DEFAULT_URL,
    SHORT_ID,
    JsonOption,
    UrlOption,
    budget,
    reading,
    unreadable,
    where,
    where_text,
)
from cohabit.cli.table import Cell, Styled, Table, print_table
from cohabit.sdk import calls
from cohabit.sdk.http import endpoint_url, origin_of, unparsed
from cohabit.sdk.paging import every
from cohabit.units import format_age, format_gib

if TYPE_CHECKING:
    from cohabit.sdk import Deployment

# Statuses with a route that answers: serving, or loaded by the request itself.
ROUTABLE = frozenset({"DEPLOYED", "UNLOADED"})


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("ps", help=help_of("ps"))(ps)


def ps(
    show_all: Annotated[
        bool, typer.Option("--all", "-a", help="Also list stopped deployments.")
    ] = False,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose", "-v", help="One line per copy with a started engine, under each."
        ),
    ] = False,
    wide: Annotated[
        bool,
        typer.Option(
            "--wide", "-w", help="Every value whole, full endpoints too, however wide the lines."
        ),
    ] = False,
    as_json: JsonOption = False,
    url: UrlOption = DEFAULT_URL,
) -> None:
    with reading(url) as session:
        records = list(every(session, lambda page: unparsed(calls.deployments(None, page))))
    try:
        deployments = [listed(record) for record in records]
    except (KeyError, TypeError, ValueError) as err:
        unreadable(err)
    shown = [d for d in deployments if show_all or d.status.upper() != "STOPPED"]
    endpoints = {
        d.id: endpoint_url(session.base_url, d) if d.status.upper() in ROUTABLE else None
        for d in shown
    }
    if as_json:
        print_json([d.record | {"endpoint": endpoints[d.id]} for d in shown])
        return
    if not shown:
        hidden = len(deployments) - len(shown)
        typer.echo(f"no deployments{f' ({hidden} stopped: --all)' if hidden else ''}")
        return
    # One line per row: short of room, the names, places, classes and endpoints are cut
    # with "…" (the widest first), never folded over lines; ids and statuses are cut last.
    table = Table(COLUMNS, cuttable=CUTTABLE)
    now = datetime.now(UTC)
    for d in shown:
        classes = f"{d.hardware_class}/{d.sharing_class}" if d.hardware_class else "-"
        reach = endpoints[d.id]
        if reach is not None and d.m_name and not wide:
            reach = SERVED  # by the MODEL name, at the URL under the table
        last = reach or loading(d) or queued(d) or d.last_error_code or ""
        table.add_row(
            str(d.id)[:SHORT_ID], d.m_name or str(d.m_id), d.status, copies(d), where(d),
            classes, _memory(d), last_used(d, now), last,
        )  # fmt: skip
        if verbose:
            for instance in sorted(d.instances, key=_copy_index):
                table.add_row(*copy_line(instance))
    if not wide and any(endpoints.values()):
        table.caption = (
            f'{SERVED}: {origin_of(session.base_url)}/v1 with "model": MODEL; '
            "--wide shows full endpoints"
        )
    print_table(table, whole=wide)


COLUMNS = (
    "ID", "MODEL", "STATUS", "COPIES", "WHERE", "CLASS", "MEMORY", "LAST USED",
    "ENDPOINT / ERROR",
)  # fmt: skip
CUTTABLE = frozenset({"MODEL", "WHERE", "CLASS", "ENDPOINT / ERROR"})
# The server's OpenAI-compatible /v1 routes a request to a deployment by its model's name.
SERVED = "/v1"


def loading(deployment: Listed) -> str | None:
    """ "loading: weights_load 1.2 s": while its engine loads, the phase it is in and how long
    that has lasted, as the server answered (docs/api.md, `loading`)."""
    now = deployment.loading
    if not now or not isinstance(now.get("phase"), str):
        return None
    elapsed = now.get("elapsed_s")
    took = f" {elapsed:.1f} s" if isinstance(elapsed, int | float) else ""
    return f"loading: {now['phase']}{took}"


def queued(deployment: Listed) -> str | None:
    """ "queued #2": its place in the queue while it waits for room (QUEUED)."""
    if deployment.status.upper() != "QUEUED":
        return None
    position = deployment.queue_position
    return "queued" if position is None else f"queued #{position}"


def copies(deployment: Deployment | Listed) -> str:
    """ "2/2": its copies that serve over its copies now; "-" once it has ended (or from a
    server that does not count copies)."""
    if not deployment.is_active or deployment.copies is None:
        return "-"
    return f"{deployment.ready_copies or 0}/{deployment.copies}"


def copy_line(instance: ListedCopy) -> tuple[str, ...]:
    """A copy's line under its deployment: its index, status, place, pid and engine URL."""
    extra = instance.extra_details
    pid = f"pid {instance.container_id}" if instance.container_id else ""
    engine = extra.get("base_url")
    return (
        f"  copy {_copy_index(instance)}",
        pid,
        str(extra.get("copy_status", instance.status)),
        "",
        where_text(instance.host_name, extra.get("gpu_indices") or [], extra.get("partition")),
        "",
        _copy_memory(extra),
        "",
        f"{engine}/v1" if engine else "",
    )


def _copy_index(instance: ListedCopy) -> int:
    """Which copy of its deployment it is (0: the deployment's own engine)."""
    return int(instance.extra_details.get("copy_index", 0))


def last_used(deployment: Listed, now: datetime) -> str:
    """How long ago it last served a request ("-" before its first)."""
    if deployment.last_used_at is None:
        return "-"
    return f"{format_age((now - deployment.last_used_at).total_seconds())} ago"


def _memory(deployment: Deployment | Listed) -> Cell:
    """The budget, with the engine's measured memory before it ("0.4 / 1.0 GiB") once the
    meter sampled it; red and marked "!" while the engine is over its budget."""
    held = budget(deployment)
    used = deployment.memory_used_bytes
    if used is None:
        return held
    memory = (deployment.health_details or {}).get("memory") or {}
    text = f"{format_gib(used)} / {held}"
    if memory.get("over_budget"):
        return Styled(f"! {text} over budget", "bold red")
    return text


def _copy_memory(extra: dict[str, Any]) -> str:
    """A copy's budget, with its measured memory before it once the meter sampled it."""
    allocated, used = extra.get("allocated_bytes"), extra.get("memory_used_bytes")
    held = format_gib(allocated) if isinstance(allocated, int) else "-"
    return f"{format_gib(used)} / {held}" if isinstance(used, int) else held
