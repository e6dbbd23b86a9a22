"""Entry point of the `cohabit` command: builds the typer app from one module per command."""

from __future__ import annotations

import typer

from cohabit import __version__
from cohabit.cli import (
    chat,
    deploy,
    estimate,
    events,
    gpus,
    logs,
    models,
    plan,
    ps,
    serve,
    stop,
    tokens,
)


def build_app() -> typer.Typer:
    app = typer.Typer(
        name="cohabit",
        help="Place many LLMs on shared GPUs: estimate, plan, reserve, serve.",
        no_args_is_help=True,
        add_completion=False,
        pretty_exceptions_enable=False,
    )

    @app.callback(invoke_without_command=True)
    def _root(
        version: bool = typer.Option(False, "--version", help="Print the version and exit."),
    ) -> None:
        if version:
            typer.echo(__version__)
            raise typer.Exit(0)

    for command in (
        plan,
        estimate,
        gpus,
        serve,
        models,
        deploy,
        ps,
        logs,
        events,
        stop,
        chat,
        tokens,
    ):
        command.register(app)
    return app


def main() -> None:
    build_app()()
