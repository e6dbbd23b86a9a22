"""`cohabit serve`: the control plane — the REST API under /api and the reconciler that
places, reserves and starts deployments. Hardware comes from this machine, or from a fleet
file (`--fleet`) for a simulated inventory; with `--backend kubernetes`, from the cluster,
with ModelDeployments as the engines (kube/runtime.py). Without an API token it listens on
127.0.0.1 only and answers only loopback Host names (and those of `--allow-host`). Tokens
are best read from a file (`--token-file`) or the environment: a command line is readable
by every user of the machine, so one given there gets a warning.
SIGINT/SIGTERM stop the local engines it started, unless `--keep-engines` leaves them for
the next start to adopt. `--log-format json` writes every log line, uvicorn's too, as one JSON
object (service/telemetry/logformat.py). How uvicorn serves the app — timeouts, the
connection cap, the shutdown's deadline — is service/httpserver.py's.
"""

from __future__ import annotations

import logging
import socket
from enum import StrEnum
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cohabit.cli.commands import help_of
from cohabit.cli.output import EXIT_FAULT, err_console, fail, labelled
from cohabit.service.telemetry.logformat import SERVE_LOGGER, LogFormat, LogLevel, configure
from cohabit.units import GIB

if TYPE_CHECKING:
    from collections.abc import Callable

    from cohabit.hardware.model import Fleet
    from cohabit.runtime.interface import EngineRuntime
    from cohabit.service.settings import Settings
    from cohabit.service.telemetry.meter import Measure

DEFAULT_PORT = 8420  # service.settings.DEFAULT_PORT; repeated so other commands skip its import
LOOPBACK = "127.0.0.1"
_LOOPBACK_NAMES = {LOOPBACK, "localhost", "::1"}
_POSTGRES_SCHEMES = ("postgresql:", "postgresql+")
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a command stopped by Ctrl-C
# A token an attacker cannot guess by trying: 16 visible ASCII characters, as
# `secrets.token_urlsafe(12)` gives, are ~96 bits.
MIN_TOKEN_CHARS = 16


class BackendKind(StrEnum):
    LOCAL = "local"
    KUBERNETES = "kubernetes"


class Enforce(StrEnum):
    """What holds a local engine to its budget beyond its own flags."""

    NONE = "none"
    HAMI_CORE = "hami-core"


def register(app: typer.Typer) -> None:
    """Add the command to the app."""
    app.command("serve", help=help_of("serve"))(serve)


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
        typer.Option(
            help="Admin bearer token (better: --token-file or COHABIT_API_TOKEN, which `ps` "
            "does not show); every API call must send it or a named token from "
            "`cohabit tokens create`."
        ),
    ] = None,
    token_file: Annotated[
        Path | None,
        typer.Option("--token-file", help="Read the admin bearer token from this file."),
    ] = None,
    metrics_token: Annotated[
        str | None,
        typer.Option(
            "--metrics-token",
            help="Bearer token good for /metrics only, for a Prometheus scraper "
            "(better: --metrics-token-file or COHABIT_METRICS_TOKEN).",
        ),
    ] = None,
    metrics_token_file: Annotated[
        Path | None,
        typer.Option("--metrics-token-file", help="Read the metrics token from this file."),
    ] = None,
    allow_host: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-host",
            help="Without a token, answer this Host name too, beside 127.0.0.1, localhost and "
            "[::1] (repeatable; or COHABIT_ALLOWED_HOSTS, comma-separated).",
        ),
    ] = None,
    backend: Annotated[
        BackendKind,
        typer.Option(
            help="local: engines on this machine; kubernetes: the cluster's nodes and "
            "ModelDeployments (needs COHABIT_DATABASE_URL on PostgreSQL)."
        ),
    ] = BackendKind.LOCAL,
    startup_timeout: Annotated[
        float | None,
        typer.Option(
            "--startup-timeout",
            min=1,
            help="Seconds an engine may take to answer before STARTUP_TIMEOUT "
            "(or COHABIT_STARTUP_TIMEOUT_S; default: per engine).",
        ),
    ] = None,
    vllm_kv_cache_bytes: Annotated[
        bool,
        typer.Option(
            "--vllm-kv-cache-bytes",
            help="Size vLLM's KV cache in bytes (--kv-cache-memory-bytes) instead of "
            "--gpu-memory-utilization, unless a model config sets kv_sizing.",
        ),
    ] = False,
    enforce: Annotated[
        Enforce,
        typer.Option(
            help="hami-core: preload HAMi-core's libvgpu.so into vLLM and llama.cpp engines "
            "on NVIDIA GPUs, so a CUDA allocation past the budget fails (docs/runtime.md).",
        ),
    ] = Enforce.NONE,
    keep_engines: Annotated[
        bool,
        typer.Option(
            "--keep-engines",
            help="On exit leave local engines running; the next start adopts them "
            "(default: stop them).",
        ),
    ] = False,
    meter_interval: Annotated[
        float | None,
        typer.Option(
            "--meter-interval",
            min=0,
            help="Seconds between samples of each engine's and device's real memory "
            "(default 5; 0: off).",
        ),
    ] = None,
    memory_headroom: Annotated[
        str | None,
        typer.Option(
            "--memory-headroom",
            help="Memory kept free beside what devices report free when placing (default 1GiB).",
        ),
    ] = None,
    over_budget_tolerance: Annotated[
        float | None,
        typer.Option(
            "--over-budget-tolerance",
            min=0,
            help="How far above its budget an engine may go before it is over, as a "
            "fraction (default 0.1).",
        ),
    ] = None,
    retention_days: Annotated[
        float | None,
        typer.Option(
            "--retention-days",
            min=0,
            help="Purge ended deployments, with their logs, this many days after they ended "
            "(or COHABIT_RETENTION_DAYS; default 7; 0 keeps them).",
        ),
    ] = None,
    scale_per_copy: Annotated[
        int | None,
        typer.Option(
            "--scale-per-copy",
            min=1,
            help="Autoscaling: requests in flight per serving copy above which a copy is "
            "added (default 4; docs/copies.md).",
        ),
    ] = None,
    scale_window: Annotated[
        float | None,
        typer.Option(
            "--scale-window",
            min=0,
            help="Autoscaling: seconds the load must stay above (or below) before a copy is "
            "added (or stopped) (default 30).",
        ),
    ] = None,
    scale_cooldown: Annotated[
        float | None,
        typer.Option(
            "--scale-cooldown",
            min=0,
            help="Autoscaling: seconds after a decision before the next one (default 60).",
        ),
    ] = None,
    log_format: Annotated[
        LogFormat,
        typer.Option("--log-format", help="text, or json: one JSON object per line on stderr."),
    ] = LogFormat.TEXT,
    log_level: Annotated[
        LogLevel,
        typer.Option("--log-level", help="Least severe log records written (info: access log)."),
    ] = LogLevel.WARNING,
) -> None:
    configure(log_format, log_level)
    notice = _notices(log_format)
    warn = _warnings(log_format)
    token = _secret(token, token_file, flag="--token", env="COHABIT_API_TOKEN", warn=warn)
    metrics_token = _secret(
        metrics_token,
        metrics_token_file,
        flag="--metrics-token",
        env="COHABIT_METRICS_TOKEN",
        warn=warn,
    )
    # The server stack (FastAPI, SQLAlchemy, uvicorn) loads here, not when `cohabit plan` runs.
    import uvicorn
    from pydantic import ValidationError

    from cohabit.service.app import Backend, create_app, open_database
    from cohabit.service.errors import RuntimeUnavailable
    from cohabit.service.httpserver import raise_open_files_limit, server_options
    from cohabit.service.runtimes import build_runtime
    from cohabit.service.settings import Settings
    from cohabit.service.telemetry.meter import measure_here
    from cohabit.store.errors import DatabaseUnavailable

    try:
        settings = Settings.from_env(
            data_dir=data_dir,
            port=port,
            token=token,
            metrics_token=metrics_token,
            allowed_hosts=tuple(allow_host) if allow_host else None,
            fleet_file=fleet,
            startup_timeout_s=startup_timeout,
            retention_days=retention_days,
            meter_interval_s=meter_interval,
            memory_headroom_bytes=memory_headroom,
            over_budget_tolerance_fraction=over_budget_tolerance,
            scale_per_copy=scale_per_copy,
            scale_window_s=scale_window,
            scale_cooldown_s=scale_cooldown,
        )
    except ValidationError as err:
        problem = err.errors()[0]
        message = problem["msg"].removeprefix("Value error, ")
        fail(f"setting {'.'.join(map(str, problem['loc']))}: {message}")
    settings = settings.model_copy(
        update={
            "host": host or LOOPBACK,
            "vllm_kv_cache_bytes": vllm_kv_cache_bytes,
            "hard_limit_library": _hard_limit(enforce, backend),
        }
    )
    for flag, value in (("--token", settings.token), ("--metrics-token", settings.metrics_token)):
        if value is not None and len(value) < MIN_TOKEN_CHARS:
            fail(
                f"{flag}: the token has {len(value)} characters; give at least "
                f"{MIN_TOKEN_CHARS} (python -c 'import secrets; print(secrets.token_urlsafe())')"
            )
    _check_address_free(settings.host, settings.port)
    if not settings.token:
        if settings.host not in _LOOPBACK_NAMES:
            fail(f"--host {host} needs an API token: set --token or COHABIT_API_TOKEN")
        notice(
            "no API token set: listening on 127.0.0.1 only, answering loopback Host names "
            "(set --token or COHABIT_API_TOKEN to accept other hosts)"
        )
    fleet_source: Callable[[], Fleet] | None = None
    measure: Measure = measure_here
    stop_engines: Callable[[], None] | None = None  # pods on Kubernetes always stay
    budget_unit_bytes = 1
    if backend is BackendKind.KUBERNETES:
        if fleet is not None:
            fail("--fleet and --backend kubernetes do not mix: the cluster is the fleet")
        runtime, fleet_source, hardware, measure = _kubernetes(settings)
        budget_unit_bytes = GIB
    else:
        hardware = _fleet(fleet)
    try:
        open_database(settings, hardware).dispose()
        if fleet_source is None:
            local = build_runtime(settings)
            runtime = local
            stop_engines = None if keep_engines else local.stop_all
    except DatabaseUnavailable as err:
        fail(str(err))
    except RuntimeUnavailable as err:
        fail(str(err), code=EXIT_FAULT)
    except OSError as err:
        fail(f"data directory {settings.data_dir}: {err.strerror or err}")
    source = "the cluster" if fleet_source is not None else fleet or "this machine"
    notice(
        f"cohabit API on http://{settings.host}:{settings.port}/api "
        f"({len(hardware.nodes)} node(s) from {source})"
    )
    app = create_app(
        settings,
        Backend(
            runtime=runtime,
            fleet=hardware,
            fleet_source=fleet_source,
            budget_unit_bytes=budget_unit_bytes,
            stop_engines=stop_engines,
            measure=measure,
            rediscover=fleet_source or partial(_rediscover, fleet),
        ),
        freeze_startup=True,
    )
    try:
        uvicorn.run(
            app,
            host=settings.host,
            port=settings.port,
            log_config=None,  # configured above, for uvicorn's loggers too
            log_level=log_level.value,
            **server_options(settings, open_files=raise_open_files_limit()),
        )
    except KeyboardInterrupt:
        # uvicorn shuts down cleanly (engines stopped or kept) and then re-raises the SIGINT
        # it caught; exit as an interrupted command does, without Click's "Aborted!".
        notice("stopped")
        raise typer.Exit(EXIT_INTERRUPTED) from None


def _check_address_free(host: str, port: int) -> None:
    """Exit 2 naming the address when it cannot be listened on (another server holds it),
    before the database is opened or an engine adopted. uvicorn would find out only after the
    app's startup, and exit 3 (uvicorn/main.py STARTUP_FAILURE), which means "the deployment
    failed" here. The socket is bound as uvicorn binds it (uvicorn/config.py bind_socket:
    SO_REUSEADDR, an IPv6 family for a host with ':') and closed again."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind((host, port))
    except OSError as err:
        shown = f"[{host}]" if ":" in host else host
        fail(f"cannot listen on {shown}:{port}: {err.strerror or err}")


def _notices(log_format: LogFormat) -> Callable[[str], None]:
    """How the server's own notices are written: on the console as text, as log records
    (shown at any level) in JSON."""
    if log_format is LogFormat.JSON:
        return logging.getLogger(SERVE_LOGGER).info
    return err_console.print


def _warnings(log_format: LogFormat) -> Callable[[str], None]:
    """How the server warns before it runs: one line on stderr, as text or a JSON record."""
    if log_format is LogFormat.JSON:
        return logging.getLogger(SERVE_LOGGER).warning

    def warn(message: str) -> None:
        err_console.print(labelled("warning:", message, style="bold yellow"), soft_wrap=True)

    return warn


def _secret(
    given: str | None,
    path: Path | None,
    *,
    flag: str,
    env: str,
    warn: Callable[[str], None],
) -> str | None:
    """A secret option's value: read from its file (surrounding whitespace, the final newline
    included, dropped), or taken from the command line with a warning, since every user of
    the machine can read a command line (ps, /proc/PID/cmdline). None when neither is given:
    the variable `env` then applies."""
    if given is not None and path is not None:
        fail(f"{flag} and {flag}-file: give one of them")
    if given is not None:
        warn(
            f"{flag} on the command line is visible to every user of this machine (ps); "
            f"give it in {flag}-file or {env} instead"
        )
        return given
    if path is None:
        return None
    try:
        value = path.read_text(encoding="utf-8").strip()
    except OSError as err:
        fail(f"{flag}-file {path}: {err.strerror or err}")
    except UnicodeDecodeError:
        fail(f"{flag}-file {path}: not a token (the file is not text)")
    if not value:
        fail(f"{flag}-file {path} is empty")
    return value


def _hard_limit(enforce: Enforce, backend: BackendKind) -> str | None:
    """HAMi-core's library for `--enforce hami-core`, or exit saying why it cannot be used."""
    if enforce is Enforce.NONE:
        return None
    if backend is BackendKind.KUBERNETES:
        fail("--enforce hami-core is for local engines; on Kubernetes set the chart's value")
    from cohabit.runtime.spawner import HAMI_CORE_PATHS, hami_core_library

    library = hami_core_library()
    if library is None:
        fail(
            f"--enforce hami-core: HAMi-core's libvgpu.so is not at {' or '.join(HAMI_CORE_PATHS)}"
        )
    return library


def _rediscover(path: Path | None) -> Fleet:
    """The fleet read again as at start (this machine, or the `--fleet` file); its faults
    are raised, not turned into an exit: a running server keeps the fleet it has."""
    from cohabit.hardware.discover import discover_local_fleet
    from cohabit.hardware.fleetfile import load_fleet

    return discover_local_fleet() if path is None else load_fleet(path)


def _fleet(path: Path | None) -> Fleet:
    from cohabit.hardware.errors import HardwareError
    from cohabit.hardware.fleetfile import FileProblem

    try:
        return _rediscover(path)
    except FileProblem as err:
        fail(str(err))
    except HardwareError as err:
        fail(f"hardware discovery failed: {err} (give a fleet file with --fleet)", code=EXIT_FAULT)


def _kubernetes(
    settings: Settings,
) -> tuple[EngineRuntime, Callable[[], Fleet], Fleet, Measure]:
    """ModelDeployments as the runtime, the cluster as the fleet and the node agents' memory
    reports as the meter's measure; the store must be PostgreSQL (several API replicas, and
    a pod's disk does not last)."""
    url = settings.database_url or ""
    if not url.startswith(_POSTGRES_SCHEMES):
        fail(
            "--backend kubernetes stores deployments in PostgreSQL: set COHABIT_DATABASE_URL "
            "to a postgresql+psycopg://… URL"
        )
    from cohabit.kube.errors import ClusterError
    from cohabit.kube.runtime import BackendSettings, connect, kubernetes_backend

    backend = BackendSettings.from_env()
    try:
        wired = kubernetes_backend(
            connect(node_selector=backend.node_selector),
            backend,
            startup_timeout_s=settings.startup_timeout_s,
        )
        hardware = wired.fleet_source()  # fail now, not on the first deployment
    except ClusterError as err:
        fail(f"Kubernetes: {err}", code=EXIT_FAULT)
    return wired.runtime, wired.fleet_source, hardware, wired.measure
