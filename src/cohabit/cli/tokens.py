"""`cohabit tokens create NAME [--role user|admin] [--ttl SECONDS]`, `cohabit tokens ls`,
`cohabit tokens revoke ID|NAME`: the server's named API tokens, through the SDK. Needs an
admin token (the server's `--token`, or a named admin token) in COHABIT_API_TOKEN."""

from __future__ import annotations

import sys
from typing import Annotated

import typer
from rich import box
from rich.table import Table

from cohabit.cli.commands import Group, help_of
from cohabit.cli.output import console, err_console, print_json
from cohabit.cli.remote import DEFAULT_URL, SHORT_ID, JsonOption, UrlOption, connected

tokens_app = typer.Typer(
    cls=Group,
    help=help_of("tokens"),
    no_args_is_help=True,
    add_completion=False,
)


ROLE_HELP = "user: read and chat; admin: also deploy, stop, delete and manage tokens."


def register(app: typer.Typer) -> None:
    """Add the command group to the app."""
    app.add_typer(tokens_app, name="tokens")


@tokens_app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="A name to know the token by.")],
    role: Annotated[str, typer.Option("--role", help=ROLE_HELP)] = "user",
    ttl: Annotated[
        int | None, typer.Option("--ttl", min=1, help="Seconds until it expires (default never).")
    ] = None,
    as_json: JsonOption = False,
    url: UrlOption = DEFAULT_URL,
) -> None:
    """Make a named token and print it once: the server keeps only its digest."""
    with connected(url) as client:
        created = client.auth.create_token(name, role=role, ttl_s=ttl)
    if as_json:
        print_json(created.model_dump(mode="json"))
        return
    sys.stdout.write(created.token + "\n")  # alone and unstyled: scripts capture it
    expires = (
        f", expires {created.pat.expires_at:%Y-%m-%d %H:%M} UTC" if created.pat.expires_at else ""
    )
    err_console.print(
        f"token {created.pat.name!r} ({created.pat.role}{expires}), id {created.pat.id}: "
        "store it now, it is not shown again"
    )


@tokens_app.command("ls")
def ls(as_json: JsonOption = False, url: UrlOption = DEFAULT_URL) -> None:
    """List the named tokens (never their secrets), revoked ones included."""
    with connected(url) as client:
        found = client.auth.list_tokens()
    if as_json:
        print_json([token.model_dump(mode="json") for token in found])
        return
    if not found:
        console.print("no named tokens (make one with `cohabit tokens create NAME`)")
        return
    table = Table(box=box.SIMPLE_HEAD)
    for column in ("ID", "NAME", "ROLE", "CREATED BY", "CREATED", "EXPIRES", "STATE"):
        table.add_column(column, overflow="fold")
    for token in found:
        table.add_row(
            str(token.id)[:SHORT_ID], token.name, token.role, token.owner_id,
            f"{token.created_at:%Y-%m-%d %H:%M}",
            f"{token.expires_at:%Y-%m-%d %H:%M}" if token.expires_at else "never",
            "revoked" if token.revoked else "live",
        )  # fmt: skip
    console.print(table)


@tokens_app.command("revoke")
def revoke(
    ref: Annotated[str, typer.Argument(help="The token's id, or its name.")],
    as_json: JsonOption = False,
    url: UrlOption = DEFAULT_URL,
) -> None:
    """Revoke a token: every call that sends it is refused from now on."""
    with connected(url) as client:
        token_id = client.auth.revoke_token(ref)
    if as_json:
        print_json({"revoked": token_id})
        return
    console.print(f"revoked {token_id}")
