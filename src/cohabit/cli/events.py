"""`cohabit events ID`: a deployment's timeline — requested, placed where and why, reserved,
started, healthy, failed with its code, stopped — one line per step, oldest first;
`--follow` keeps printing new steps until the deployment ends, then exits 0."""

from __future__ import annotations

import json
from datetime import UTC
from typing import TYPE_CHECKING

import typer
from rich import box
from rich.table import Table

from cohabit.cli.commands import help_of
from cohabit.cli.output import console, print_json
from cohabit.cli.remote import (
    DEFAULT_URL,
    FOLLOW_INTERVAL_S,
    DeploymentArgument,
    FollowOption,
    JsonOption,
    UrlOption,
    connected,
    deployment_or_fail,
    print_followed,
)

if TYPE_CHECKING:
    from cohabit.sdk import Client, DeploymentEvent

KIND_WIDTH = 11  # the longest kind word ("over_budget") and a space


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("events", help=help_of("events"))(events)


def events(
    deployment: DeploymentArgument,
    follow: FollowOption = False,
    as_json: JsonOption = False,
    url: UrlOption = DEFAULT_URL,
) -> None:
    with connected(url) as client:
        found = deployment_or_fail(client, deployment)
        if not follow:
            timeline = _all(client, str(found.id))
            if as_json:
                print_json([event.model_dump(mode="json") for event in timeline])
            else:
                _table(timeline)
            return

        def show(event: DeploymentEvent) -> None:
            if as_json:
                document = {"deployment_id": str(found.id)} | event.model_dump(mode="json")
                typer.echo(json.dumps(document))
            else:
                console.print(_line(event), soft_wrap=True)

        stream = client.serving.stream_deployment_events(found.id, poll_interval=FOLLOW_INTERVAL_S)
        print_followed(stream, show)


def _all(client: Client, deployment_id: str) -> list[DeploymentEvent]:
    """Every event, page by page."""
    timeline: list[DeploymentEvent] = []
    after = 0
    while True:
        page = client.serving.get_deployment_events(deployment_id, after=after)
        timeline += page.events
        if not page.events:
            return timeline
        after = page.cursor


def _moment(event: DeploymentEvent) -> str:
    return event.at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")


def _line(event: DeploymentEvent) -> str:
    return f"{_moment(event)}  {event.kind:<{KIND_WIDTH}} {event.message}"


def _table(timeline: list[DeploymentEvent]) -> None:
    if not timeline:
        console.print("no events")
        return
    table = Table(box=box.SIMPLE_HEAD)
    for column in ("TIME (UTC)", "KIND", "MESSAGE"):
        table.add_column(column, overflow="fold")
    for event in timeline:
        table.add_row(_moment(event), event.kind, event.message)
    console.print(table)
