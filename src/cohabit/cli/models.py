"""`cohabit models add PATH|REPO_ID` registers a model in the server's catalog (a .gguf file,
a checkpoint directory, or a Hugging Face repo id) with its default config; `cohabit models
ls` lists the catalog."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.table import Table

from cohabit.cli import pull
from cohabit.cli.commands import Group, help_of
from cohabit.cli.output import console, print_json
from cohabit.cli.remote import DEFAULT_URL, SHORT_ID, JsonOption, UrlOption, connected
from cohabit.units import GIB, MIB, format_gib

if TYPE_CHECKING:
    from cohabit.sdk import Model

models_app = typer.Typer(
    cls=Group,
    help=help_of("models"),
    no_args_is_help=True,
    add_completion=False,
)


def register(app: typer.Typer) -> None:
    """Add the command group to the app."""
    models_app.command("pull")(pull.pull)
    models_app.command("variants")(pull.variants)
    app.add_typer(models_app, name="models")


@models_app.command("add")
def add(
    source: Annotated[
        str, typer.Argument(help="A .gguf file, a checkpoint directory, or a repo id.")
    ],
    name: Annotated[str | None, typer.Option("--name", help="Name in the catalog.")] = None,
    as_json: JsonOption = False,
    url: UrlOption = DEFAULT_URL,
) -> None:
    """Register a model; its default config is made from its metadata."""
    with connected(url) as client:
        model = client.models.add_model(source, name=name)
    if as_json:
        print_json(model.model_dump(mode="json"))
        return
    console.print(
        f"added {model.name} {model.id} ({model.format}; default config {_config(model)})"
    )


@models_app.command("ls")
def ls(as_json: JsonOption = False, url: UrlOption = DEFAULT_URL) -> None:
    """List the catalog's models."""
    with connected(url) as client:
        models = client.models.list_models()
    if as_json:
        print_json([model.model_dump(mode="json") for model in models])
        return
    if not models:
        console.print("no models (add one with `cohabit models add PATH|REPO_ID`)")
        return
    table = Table(box=box.SIMPLE_HEAD)
    for column in ("ID", "NAME", "SOURCE", "FORMAT", "SIZE", "DEFAULT CONFIG"):
        table.add_column(column, overflow="fold")
    for model in models:
        table.add_row(
            str(model.id)[:SHORT_ID], model.name, model.repo_modelId or model.model_path or "-",
            model.format or "-", _size(model), _config(model),
        )  # fmt: skip
    console.print(table)


def _size(model: Model) -> str:
    size_bytes = sum(f.size for f in model.m_files if f.size)
    if not size_bytes:
        return "-"
    return format_gib(size_bytes) if size_bytes >= GIB else f"{size_bytes / MIB:.1f} MiB"


def _config(model: Model) -> str:
    config: dict[str, Any] = model.default_config or {}
    return " ".join(f"{key}={value}" for key, value in config.items()) or "-"
