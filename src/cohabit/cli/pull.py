"""`cohabit models pull REPO[:VARIANT]` downloads a model from the Hugging Face Hub through
the server (which keeps it in its model store and registers it), with a progress bar per
file; `cohabit models variants REPO` lists a GGUF repo's variants with their sizes, what each
engine would reserve, and the one the fleet would get."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    ProgressColumn,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from cohabit.cli.output import console, fail, print_json
from cohabit.cli.remote import DEFAULT_URL, JsonOption, UrlOption, connected
from cohabit.units import format_gib

if TYPE_CHECKING:
    from cohabit.sdk import Client, DownloadStarted, DownloadStatus, VariantList


def split_ref(ref: str) -> tuple[str, str | None]:
    """`org/name:Q4_K_M` → ("org/name", "Q4_K_M"); `org/name` → ("org/name", None)."""
    repo_id, _, variant = ref.partition(":")
    if repo_id.count("/") != 1 or not all(repo_id.split("/")):
        fail(f"{ref!r}: give a Hub repo as ORG/NAME, optionally :VARIANT (e.g. :Q4_K_M)")
    return repo_id, variant or None


def variants(
    repo: Annotated[str, typer.Argument(help="A Hub repo with GGUF files, ORG/NAME.")],
    as_json: JsonOption = False,
    url: UrlOption = DEFAULT_URL,
) -> None:
    """List a GGUF repo's variants: size, estimate per engine, and the default choice."""
    repo_id, _ = split_ref(repo)
    with connected(url) as client:
        listing = client.models.variants(repo_id)
    if as_json:
        print_json(listing.model_dump(mode="json"))
        return
    _print_variants(listing)


def pull(
    ref: Annotated[str, typer.Argument(help="ORG/NAME or ORG/NAME:VARIANT (e.g. :Q4_K_M).")],
    hf_cache: Annotated[
        bool,
        typer.Option("--hf-cache", help="Into the shared Hugging Face cache, not the store."),
    ] = False,
    timeout_s: Annotated[
        float | None, typer.Option("--timeout", help="Give up after this many seconds.")
    ] = None,
    url: UrlOption = DEFAULT_URL,
) -> None:
    """Download a model from the Hub into the server's model store and register it. A GGUF
    repo without :VARIANT gets the largest variant that fits the fleet's largest free device."""
    repo_id, variant = split_ref(ref)
    with connected(url) as client:
        if variant is None:
            _show_choice(client, repo_id)
        started = client.models.download(repo_id, variant=variant, hf_cache=hf_cache)
        if started.reason and variant is None:
            console.print(f"chose {started.variant}: {started.reason}")
        for name in started.already_downloaded:
            console.print(f"{name}: already downloaded")
        if started.files:
            _follow(client, started, timeout_s)
        model = client.models.get_model(started.model_id)
    console.print(f"pulled {repo_id} → model {model.id} ({model.model_path})")


def _show_choice(client: Client, repo_id: str) -> None:
    from cohabit.sdk import ValidationError

    try:
        listing = client.models.variants(repo_id)
    except ValidationError:
        return  # not a GGUF repo: no variants to choose from
    _print_variants(listing)


def _print_variants(listing: VariantList) -> None:
    engines = sorted({engine for v in listing.variants for engine in v.estimates})
    table = Table(box=box.SIMPLE_HEAD, title=f"{listing.repo_id} @ {listing.revision or 'main'}")
    for column in ("VARIANT", "SIZE", *(f"{e.upper()} NEEDS" for e in engines), "FITS"):
        table.add_column(column)
    for v in listing.variants:
        mark = "*" if v.name == listing.chosen else ""
        needs = [format_gib(v.estimates[e]) if e in v.estimates else "-" for e in engines]
        table.add_row(v.name + mark, format_gib(v.size), *needs, "yes" if v.fits else "no")
    console.print(table)
    console.print(f"default: {listing.reason}")


def progress_columns() -> tuple[ProgressColumn, ...]:
    """A file's progress line: its name (as the Hub has it, never read as markup), bar,
    bytes, speed, time left."""
    return (
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
    )


def _follow(client: Client, started: DownloadStarted, timeout_s: float | None) -> None:
    with Progress(*progress_columns(), console=console, transient=False) as progress:
        tasks: dict[str, TaskID] = {}

        def show(statuses: list[DownloadStatus]) -> None:
            for status in statuses:
                if status.name not in tasks:
                    tasks[status.name] = progress.add_task(status.name, total=status.size)
                progress.update(tasks[status.name], completed=status.downloaded_bytes)

        client.models.wait_for_download(
            started, on_update=show, poll_interval_s=0.5, timeout_s=timeout_s
        )
