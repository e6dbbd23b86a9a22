"""What the commands that talk to a server share: the `--url` option (or COHABIT_BASE_URL), the
token (COHABIT_API_TOKEN), finding a deployment by id, id prefix or model, and the SDK's
faults as one line and a documented exit code. The server is reached only through the SDK:
its `Client` (`connected`), or its wire alone for a command that reads the server's JSON as it
is and must start at once (`reading`: `ps`).

Exit codes beyond output.py's (docs/cli.md): 4 the server could not be reached; 5 gave up
waiting (the deployment goes on).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer

from cohabit.cli.output import (
    EXIT_BAD_INPUT,
    EXIT_FAULT,
    EXIT_GAVE_UP,
    EXIT_NO_FIT,
    EXIT_UNREACHABLE,
    fail,
)
from cohabit.sdk.http import DEFAULT_BASE_URL

if TYPE_CHECKING:
    from cohabit.cli.listing import Listed
    from cohabit.sdk import Client, Deployment
    from cohabit.sdk.http import HttpSession

DEFAULT_URL = DEFAULT_BASE_URL  # the SDK's, where --url and COHABIT_BASE_URL are not given
SHORT_ID = 8  # characters of a deployment id tables show; commands accept any unique prefix

UrlOption = Annotated[
    str,
    typer.Option(
        "--url",
        envvar="COHABIT_BASE_URL",
        help="API root of the cohabit server (token from COHABIT_API_TOKEN).",
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of text.")]
DeploymentArgument = Annotated[str, typer.Argument(help="Deployment id (or a unique prefix).")]
FollowOption = Annotated[
    bool, typer.Option("--follow", "-f", help="Keep printing what is new until it ends.")
]
FOLLOW_INTERVAL_S = 1.0  # how often --follow asks the server again

T = TypeVar("T")


@contextmanager
def connected(url: str) -> Iterator[Client]:
    """A client for `url`; any SDK fault inside becomes one line and its exit code."""
    # The SDK's client (httpx, pydantic) loads here, not when the command line starts.
    import pydantic

    from cohabit import sdk

    try:
        client = sdk.Client(base_url=url)
    except ValueError as err:
        fail(f"--url: {err}")
    with _faults_as_exits():
        try:
            with client:
                yield client
        except pydantic.ValidationError as err:  # before _faults_as_exits' ValueError: it is one
            unreadable(err)


@contextmanager
def reading(url: str) -> Iterator[HttpSession]:
    """The SDK's wire alone, for a command that reads the server's JSON as it is: no
    pydantic, and no httpx where a plain socket reaches the server (`sdk.http.lean_session`).
    Any SDK fault inside becomes one line and its exit code."""
    from cohabit.sdk.http import lean_session

    try:
        session = lean_session(url)
    except ValueError as err:
        fail(f"--url: {err}")
    with _faults_as_exits():
        try:
            yield session
        finally:
            session.close()


def unreadable(err: Exception) -> NoReturn:
    fail(f"the server's answer is not what this client reads: {err}", code=EXIT_FAULT)


@contextmanager
def _faults_as_exits() -> Iterator[None]:
    from cohabit.sdk import errors

    try:
        yield
    except errors.ServerUnreachable as err:
        fail(
            f"{err} (is `cohabit serve` running? point --url or COHABIT_BASE_URL at it)",
            code=EXIT_UNREACHABLE,
        )
    except errors.DeploymentFailedError as err:
        fail(f"{err}", code=EXIT_NO_FIT)
    except errors.DownloadFailedError as err:
        fail(str(err), code=EXIT_FAULT)
    except (
        errors.AuthenticationError,
        errors.PermissionDeniedError,
        errors.NotFoundError,
        errors.ValidationError,
        errors.ConflictError,
    ) as err:
        fail(str(err), code=EXIT_BAD_INPUT)
    except errors.APIError as err:
        fail(f"the server failed: {err}", code=EXIT_FAULT)
    except TimeoutError as err:
        fail(str(err), code=EXIT_GAVE_UP)
    except ValueError as err:  # the SDK's "no such model / config" and bad arguments
        fail(str(err), code=EXIT_BAD_INPUT)


def find_deployment(client: Client, ref: str) -> Deployment | None:
    """A deployment by full id (asked of the server by itself) or unique id prefix (among
    every deployment, page by page); None when nothing matches."""
    from cohabit.sdk import NotFoundError

    if len(ref) == 36:
        try:
            return client.serving.get_deployment(ref)
        except NotFoundError:
            return None
    prefix = ref.lower()
    matches = [d for d in client.serving.iter_deployments() if str(d.id).startswith(prefix)]
    if len(matches) > 1:
        fail(f"{ref!r} starts {len(matches)} deployment ids: give more of it")
    return matches[0] if matches else None


def deployment_or_fail(client: Client, ref: str) -> Deployment:
    found = find_deployment(client, ref) if ref else None
    if found is None:
        fail(f"no deployment {ref!r} (`cohabit ps --all` lists them)")
    return found


def where(deployment: Deployment | Listed) -> str:
    """`node-a gpu 0`, `node-a gpus 0,1`, `node-a gpu 0 mig 2g.20gb`, `box pool`."""
    indices = deployment.gpu_indices or (
        [] if deployment.gpu_index is None else [deployment.gpu_index]
    )
    return where_text(deployment.node_name, indices, deployment.partition)


def where_text(node: str | None, gpu_indices: Sequence[int], partition: str | None) -> str:
    """A place in words (see `where`); "-" before placement."""
    if node is None:
        return "-"
    if not gpu_indices:
        return f"{node} pool"
    label = "gpu" if len(gpu_indices) == 1 else "gpus"
    text = f"{node} {label} {','.join(map(str, gpu_indices))}"
    return f"{text} {partition}" if partition else text


def budget(deployment: Deployment | Listed) -> str:
    from cohabit.units import format_gib

    if deployment.allocated_bytes:
        return format_gib(deployment.allocated_bytes)
    if deployment.allocated_capacity_gb is not None:
        return f"{deployment.allocated_capacity_gb} GiB"
    return "-"


def deployment_json(deployment: Deployment, endpoint: str | None) -> dict[str, Any]:
    document: dict[str, Any] = deployment.model_dump(mode="json")
    document["endpoint"] = endpoint
    return document


def print_followed(items: Iterable[T], show: Callable[[T], object]) -> None:
    """Show each item as a followed stream yields it; Ctrl-C ends the command (exit 0)."""
    try:
        for item in items:
            show(item)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
