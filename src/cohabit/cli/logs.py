"""`cohabit logs ID`: the engine log of a deployment (its last lines; `--copy N`: of its copy
N's engine); `--follow` keeps printing new lines until the deployment ends or Ctrl-C."""

from __future__ import annotations

import json
from typing import Annotated

import typer

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


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("logs", help=help_of("logs"))(logs)


def logs(
    deployment: DeploymentArgument,
    follow: FollowOption = False,
    copy: Annotated[
        int, typer.Option("--copy", min=0, help="Which copy's engine (0: the deployment's own).")
    ] = 0,
    as_json: JsonOption = False,
    url: UrlOption = DEFAULT_URL,
) -> None:
    with connected(url) as client:
        found = deployment_or_fail(client, deployment)
        if not follow:
            answer = client.serving.get_deployment_logs(found.id, copy=copy)
            if as_json:
                print_json(answer.model_dump(mode="json"))
            else:
                for line in answer.logs:
                    console.print(line, soft_wrap=True)
            return

        def show(line: str) -> None:
            if as_json:
                typer.echo(json.dumps({"deployment_id": str(found.id), "line": line}))
            else:
                console.print(line, soft_wrap=True)

        stream = client.serving.stream_deployment_logs(
            found.id, poll_interval=FOLLOW_INTERVAL_S, max_empty_polls=None, copy=copy
        )
        print_followed(stream, show)
