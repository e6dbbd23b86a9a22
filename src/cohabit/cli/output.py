"""How every command speaks: JSON on stdout for scripts, rich text for people, and one
clear line on stderr with a documented exit code for anything that went wrong. The consoles
read no markup and no emoji codes: names, messages and paths come from users and servers, and
`[/]` or `:x:` in one must print as itself; styles are given as `Text` styles.

Exit codes (docs/cli.md): 0 done; 1 unexpected fault; 2 bad input (file, option, model);
3 a deployment did not fit or failed; 4 server unreachable; 5 gave up waiting.
"""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.text import Text

EXIT_OK = 0
EXIT_FAULT = 1
EXIT_BAD_INPUT = 2
EXIT_NO_FIT = 3
EXIT_UNREACHABLE = 4
EXIT_GAVE_UP = 5

PLAIN: dict[str, Any] = {"highlight": False, "markup": False, "emoji": False}
# Piped output is read in logs and CI, not an 80-column terminal: give tables room there.
console = Console(**PLAIN)
if not console.is_terminal:
    console = Console(**PLAIN, width=max(console.width, 120))
err_console = Console(stderr=True, **PLAIN)


def fail(message: str, *, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print one line naming what is wrong, and exit with `code`."""
    err_console.print(labelled("error:", message), soft_wrap=True)
    raise typer.Exit(code)


def labelled(label: str, message: str, *, style: str = "bold red") -> Text:
    """`label` styled, then `message` as it is."""
    return Text.assemble((label, style), " ", message)


class Cuttable:
    """A table cell on one line, cut with "…" to the room it is given. It measures as able to
    shrink to one character, so a table short of room takes it from cells like this one —
    the longest first — before it cuts an id or a status."""

    def __init__(self, value: str | Text) -> None:
        text = value.copy() if isinstance(value, Text) else Text(value)
        text.no_wrap, text.overflow = True, "ellipsis"
        self.text = text

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.text

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement(1, max(1, self.text.cell_len))


def print_whole(renderable: RenderableType) -> None:
    """Print at the width `renderable` takes with nothing cut, past the terminal's if need be:
    the terminal then wraps a long line, and a pipe gets it whole."""
    unbounded = console.options.update_width(1_000_000)
    width = console.measure(renderable, options=unbounded).maximum
    if width <= console.width:
        console.print(renderable)
    else:
        Console(file=console.file, width=width, **PLAIN).print(renderable)


def print_json(data: Any) -> None:
    """Machine output: exactly the document, indented, nothing else on stdout."""
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
