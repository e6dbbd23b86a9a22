"""`cohabit stop ID|MODEL`: stop one deployment (by id or unique id prefix), or every active
deployment of a model (by id, repo id, name or path); each releases its budget."""

from __future__ import annotations

from typing import Annotated

import typer

from cohabit.cli.commands import help_of
from cohabit.cli.output import console, fail, print_json
from cohabit.cli.remote import DEFAULT_URL, JsonOption, UrlOption, connected, find_deployment


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("stop", help=help_of("stop"))(stop)


def stop(
    target: Annotated[str, typer.Argument(help="Deployment id (or prefix), or a model.")],
    as_json: JsonOption = False,
    url: UrlOption = DEFAULT_URL,
) -> None:
    with connected(url) as client:
        deployment = find_deployment(client, target)
        if deployment is not None:
            targets = [deployment]
        else:
            try:
                model = client.models.find_model(target)
            except ValueError:
                fail(f"no deployment or model {target!r} (`cohabit ps --all`, `cohabit models ls`)")
            targets = [d for d in client.serving.list_deployments(model.id) if d.is_active]
        stopped = [str(d.id) for d in targets if client.serving.stop_deployment(d.id)]
    ended = [str(d.id) for d in targets if str(d.id) not in stopped]
    if as_json:
        print_json({"stopped": stopped, "already_ended": ended})
        return
    if not targets:
        console.print(f"{target} has no active deployments")
    for deployment_id in stopped:
        console.print(f"stopped {deployment_id}")
    for deployment_id in ended:
        console.print(f"{deployment_id} had already ended")
