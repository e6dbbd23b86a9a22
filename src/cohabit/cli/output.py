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
from typing import TYPE_CHECKING, Any, NoReturn

import typer

from cohabit.cli.table import PIPED_WIDTH

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

EXIT_OK = 0
EXIT_FAULT = 1
EXIT_BAD_INPUT = 2
EXIT_NO_FIT = 3
EXIT_UNREACHABLE = 4
EXIT_GAVE_UP = 5

PLAIN: dict[str, Any] = {"highlight": False, "markup": False, "emoji": False}


def __getattr__(name: str) -> Console:
    """`console` (stdout) and `err_console` (stderr), made on first use: rich loads only for
    a command that prints with it (`ps` prints its table without it, cli/table.py)."""
    if name not in ("console", "err_console"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _console(name)


def _console(name: str) -> Console:
    if name not in globals():  # made once; later uses find them as plain attributes
        from rich.console import Console

        out = Console(**PLAIN)
        if not out.is_terminal:  # give tables room in logs and CI (cli/table.py)
            out = Console(**PLAIN, width=max(out.width, PIPED_WIDTH))
        globals().update(console=out, err_console=Console(stderr=True, **PLAIN))
    made: Console = globals()[name]
    return made


def fail(message: str, *, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print one line naming what is wrong, and exit with `code`."""
    _console("err_console").print(labelled("error:", message), soft_wrap=True)
    raise typer.Exit(code)


def labelled(label: str, message: str, *, style: str = "bold red") -> Text:
    """`label` styled, then `message` as it is."""
    from rich.text import Text

    return Text.assemble((label, style), " ", message)


def print_json(data: Any) -> None:
    """Machine output: exactly the document, indented, nothing else on stdout."""
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
