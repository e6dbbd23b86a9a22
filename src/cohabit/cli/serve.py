"""`cohabit serve`: the control plane — the REST API under /api and the reconciler that
places, reserves and starts deployments. Hardware comes from this machine, or from a fleet
file (`--fleet`) for a simulated inventory. Without an API token it listens on 127.0.0.1 only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cohabit.cli.output import EXIT_FAULT, err_console, fail
from cohabit.hardware.discover import discover_local_fleet
from cohabit.hardware.errors import HardwareError
from cohabit.hardware.fleetfile import FileProblem, load_fleet
from cohabit.hardware.model import Fleet

DEFAULT_PORT = 8420  # service.settings.DEFAULT_PORT; repeated so other commands skip its import
LOOPBACK = "127.0.0.1"
_LOOPBACK_NAMES = {LOOPBACK, "localhost", "::1"}


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("serve")(serve)


def serve(
    host: Annotated[
        str | None, typer.Option(help="Address to listen on (other than 127.0.0.1 needs a token).")
    ] = None,
    port: Annotated[int, typer.Option(min=1, max=65535, help="Port to listen on.")] = DEFAULT_PORT,
    data_dir: Annotated[
        Path | None,
        typer.Option(help="Database and engine logs (default ~/.local/share/cohabit)."),
    ] = None,
    fleet: Annotated[
        Path | None, typer.Option("--fleet", help="Serve this fleet file instead of this machine.")
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(help="Bearer token every API call must send (or COHABIT_API_TOKEN)."),
    ] = None,
) -> None:
    """Run the control plane: REST API under /api, deployments placed and started."""
    # The server stack (FastAPI, SQLAlchemy, uvicorn) loads here, not when `cohabit plan` runs.
    import uvicorn
    from pydantic import ValidationError

    from cohabit.service.app import create_app, open_database
    from cohabit.service.errors import RuntimeUnavailable
    from cohabit.service.runtimes import build_runtime
    from cohabit.service.settings import Settings
    from cohabit.store.errors import DatabaseUnavailable

    try:
        settings = Settings.from_env(data_dir=data_dir, port=port, token=token, fleet_file=fleet)
    except ValidationError as err:
        problem = err.errors()[0]
        fail(f"setting {'.'.join(map(str, problem['loc']))}: {problem['msg']}")
    settings = settings.model_copy(update={"host": host or LOOPBACK})
    if not settings.token:
        if settings.host not in _LOOPBACK_NAMES:
            fail(f"--host {host} needs an API token: set --token or COHABIT_API_TOKEN")
        err_console.print(
            "no API token set: listening on 127.0.0.1 only "
            "(set --token or COHABIT_API_TOKEN to accept other hosts)"
        )
    hardware = _fleet(fleet)
    try:
        open_database(settings, hardware).dispose()
        runtime = build_runtime(settings)
    except DatabaseUnavailable as err:
        fail(str(err))
    except RuntimeUnavailable as err:
        fail(str(err), code=EXIT_FAULT)
    except OSError as err:
        fail(f"data directory {settings.data_dir}: {err.strerror or err}")
    err_console.print(
        f"cohabit API on http://{settings.host}:{settings.port}/api "
        f"({len(hardware.nodes)} node(s) from {fleet or 'this machine'})"
    )
    uvicorn.run(
        create_app(settings, runtime=runtime, fleet=hardware),
        host=settings.host,
        port=settings.port,
        log_level="warning",
    )


def _fleet(path: Path | None) -> Fleet:
    try:
        return discover_local_fleet() if path is None else load_fleet(path)
    except FileProblem as err:
        fail(str(err))
    except HardwareError as err:
        fail(f"hardware discovery failed: {err} (give a fleet file with --fleet)", code=EXIT_FAULT)
