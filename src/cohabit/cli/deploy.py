"""`cohabit deploy MODEL`: deploy a catalog model (by id, repo id, name or path — a path not yet
in the catalog is added first) and watch it go DEPLOYING → INITIALIZING → DEPLOYED on a live
status line; on failure print the code, the message and the documented fix, and exit 3.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer
from rich.text import Text

from cohabit.cli.commands import help_of
from cohabit.cli.output import EXIT_NO_FIT, console, err_console, fail, labelled, print_json
from cohabit.cli.remote import (
    DEFAULT_URL,
    JsonOption,
    UrlOption,
    budget,
    connected,
    deployment_json,
    where,
)
from cohabit.units import format_gib, parse_size

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, RenderResult
    from rich.live import Live

    from cohabit.sdk import Client, Deployment, DeploymentFailedError, Model, ModelConfig

POLL_INTERVAL_S = 0.5


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("deploy", help=help_of("deploy"))(deploy)


def deploy(
    model: Annotated[str, typer.Argument(help="Model id, repo id, name, or a local path.")],
    config: Annotated[
        str | None, typer.Option("--config", help="Config id or name (default: the default).")
    ] = None,
    engine: Annotated[
        str | None, typer.Option("--engine", help="llamacpp, vllm or mlx (default: the config's).")
    ] = None,
    max_model_len: Annotated[
        int | None,
        typer.Option("--max-model-len", min=1, help="Context length (makes a config saying so)."),
    ] = None,
    vram: Annotated[
        str | None,
        typer.Option("--vram", help="Reserve this per device instead of the estimate, e.g. 6GiB."),
    ] = None,
    force_cpu: Annotated[bool, typer.Option("--cpu", help="Place on a CPU memory pool.")] = False,
    copies: Annotated[
        int | None,
        typer.Option("--copies", help="Copies to start (0 with --min-copies 0: load on demand)."),
    ] = None,
    min_copies: Annotated[
        int | None,
        typer.Option("--min-copies", help="0: unload when idle, load on the next request."),
    ] = None,
    max_copies: Annotated[int | None, typer.Option("--max-copies", help="At most.")] = None,
    keep_alive_s: Annotated[
        int | None,
        typer.Option(
            "--keep-alive", help="Idle seconds before unloading (min copies 0); -1: never."
        ),
    ] = None,
    priority: Annotated[
        int | None, typer.Option("--priority", help="-1000 to 1000 (default 0).")
    ] = None,
    queue: Annotated[
        bool, typer.Option("--queue", help="Wait for room instead of failing.")
    ] = False,
    duration_min: Annotated[
        int | None, typer.Option("--duration", help="Stop it after this many minutes.")
    ] = None,
    no_wait: Annotated[
        bool, typer.Option("--no-wait", help="Print the id once accepted; do not watch.")
    ] = False,
    timeout_s: Annotated[
        float, typer.Option("--timeout", min=1, help="Seconds to wait for DEPLOYED.")
    ] = 600,
    as_json: JsonOption = False,
    url: UrlOption = DEFAULT_URL,
) -> None:
    from cohabit.sdk import DeploymentFailedError
    from cohabit.sdk.http import endpoint_url

    # Bounds are the server's to check: a bad value comes back as one line naming it.
    body: dict[str, Any] = {
        "engine_name": engine,
        "force_cpu": force_cpu or None,
        "starting_copies": copies,
        "min_copies": min_copies,
        "max_copies": max_copies,
        "keep_alive": keep_alive_s,
        "priority": priority,
        "queue": queue or None,
        "duration": duration_min,
    }
    if vram is not None:
        try:
            body["vram_allocation"] = parse_size(vram, field="--vram")
        except ValueError as err:
            fail(str(err))
    with connected(url) as client:
        chosen = _model(client, model)
        chosen_config = _config(client, chosen, config, max_model_len)
        line = StatusLine(chosen.name, live=not as_json and err_console.is_terminal)
        try:
            deployment_id = client.serving.deploy_model(
                chosen.id,
                m_config_id=chosen_config.id,
                wait=False,
                **{key: value for key, value in body.items() if value is not None},
            )
            if no_wait:
                _accepted(str(deployment_id), as_json=as_json)
                return
            line.accepted(str(deployment_id))
            with line.showing(as_json=as_json):
                ready = client.serving.wait_deployment_ready(
                    deployment_id,
                    timeout_seconds=timeout_s,
                    poll_interval_seconds=POLL_INTERVAL_S,
                    on_update=line.update,
                )
        except DeploymentFailedError as failed:
            _failed(failed, as_json=as_json)
        endpoint = endpoint_url(client.base_url, ready)
        if as_json:
            print_json(deployment_json(ready, endpoint))
        else:
            _deployed(ready, endpoint, elapsed_s=line.elapsed_s())


def _model(client: Client, ref: str) -> Model:
    """The catalog's model; a path that is not in it yet is added."""
    try:
        return client.models.find_model(ref)
    except ValueError:
        if not Path(ref).expanduser().exists():
            raise
    added = client.models.add_model(ref)
    err_console.print(f"added {ref} to the catalog as {added.name} ({added.id})")
    return added


def _config(
    client: Client, model: Model, ref: str | None, max_model_len: int | None
) -> ModelConfig:
    from cohabit.sdk.models import default_config, find_config

    configs = client.models.get_model_configs(model.id)
    base = find_config(configs, ref) if ref else default_config(model.id, configs)
    if max_model_len is None:
        return base
    return client.models.config_with(model.id, {"max_model_len": max_model_len}, base=base)


class StatusLine:
    """A spinner, the status and the time since the deploy was accepted; redrawn by rich
    several times a second. Off a terminal, each new status is printed once instead."""

    def __init__(self, model_name: str, *, live: bool) -> None:
        self.model_name = model_name
        self.live = live
        self.status = "REQUESTED"
        self.deployment_id = ""
        self.started_s = time.monotonic()
        from rich.spinner import Spinner

        self._spinner = Spinner("dots")

    def accepted(self, deployment_id: str) -> None:
        self.deployment_id = deployment_id
        self.started_s = time.monotonic()
        if not self.live:
            err_console.print(f"deploying {self.model_name} as {deployment_id}")

    def elapsed_s(self) -> float:
        return time.monotonic() - self.started_s

    def update(self, deployment: Deployment) -> None:
        status = deployment.status.upper()
        if status != self.status and not self.live:
            err_console.print(f"{status:<13} {self.elapsed_s():6.1f} s")
        self.status = status

    def showing(self, *, as_json: bool) -> Live | _Quiet:
        if not self.live or as_json:
            return _Quiet()
        from rich.live import Live

        return Live(self, console=err_console, refresh_per_second=8, transient=True)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        # Text: a Spinner reads a str's markup, and the name is the catalog's.
        self._spinner.update(
            text=Text(
                f"{self.model_name} {self.deployment_id[:8]}  {self.status}  "
                f"{self.elapsed_s():.0f} s"
            )
        )
        yield self._spinner


class _Quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_exc: object) -> None:
        return None


def _accepted(deployment_id: str, *, as_json: bool) -> None:
    if as_json:
        print_json({"id": deployment_id, "status": "REQUESTED"})
    else:
        console.print(deployment_id)


def _deployed(deployment: Deployment, endpoint: str, *, elapsed_s: float) -> None:
    classes = f"{deployment.hardware_class or '-'} / {deployment.sharing_class or '-'}"
    requested = (
        f" (asked {format_gib(deployment.requested_bytes)})" if deployment.requested_bytes else ""
    )
    status = deployment.status.upper()
    console.print(f"{status} {deployment.m_name} {deployment.id} in {elapsed_s:.1f} s")
    if status == "UNLOADED":
        console.print("  loads     on its first request")
    console.print(f"  where     {where(deployment)}  {classes}")
    console.print(f"  budget    {budget(deployment)}{requested}")
    for notice in deployment.notices:
        console.print(f"  notice    {notice}")
    console.print(f"  endpoint  {endpoint}")


def _failed(failed: DeploymentFailedError, *, as_json: bool) -> NoReturn:
    """Exit 3 with the code, the message and the fix (one JSON document with --json)."""
    if as_json:
        print_json(
            {
                "id": failed.deployment_id,
                "status": failed.status,
                "last_error_code": failed.last_error_code,
                "last_error_message": failed.last_error_message,
                "fix": failed.fix,
                "no_fit": failed.no_fit,
            }
        )
        raise typer.Exit(EXIT_NO_FIT)
    subject = (
        f"deployment {failed.deployment_id} {failed.status}"
        if failed.deployment_id
        else "refused: it fits no device even on an empty fleet (nothing recorded)"
    )
    err_console.print(
        labelled(
            "error:",
            f"{subject}: {failed.last_error_code or 'no error code'}: {failed.last_error_message}",
        ),
        soft_wrap=True,
    )
    if failed.fix:
        err_console.print(labelled("fix:", failed.fix, style="bold"), soft_wrap=True)
    raise typer.Exit(EXIT_NO_FIT)
