"""How every command speaks: JSON on stdout for scripts, rich text for people, and one
clear line on stderr with a documented exit code for anything that went wrong.

Exit codes (docs/cli.md): 0 done; 1 unexpected fault; 2 bad input (file, option, model);
3 a deployment did not fit or failed; 4 server unreachable; 5 gave up waiting.
"""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console

EXIT_OK = 0
EXIT_FAULT = 1
EXIT_BAD_INPUT = 2
EXIT_NO_FIT = 3
EXIT_UNREACHABLE = 4
EXIT_GAVE_UP = 5

# Piped output is read in logs and CI, not an 80-column terminal: give tables room there.
console = Console(highlight=False)
if not console.is_terminal:
    console = Console(highlight=False, width=max(console.width, 120))
err_console = Console(stderr=True, highlight=False)


def fail(message: str, *, code: int = EXIT_BAD_INPUT) -> NoReturn:
    """Print one line naming what is wrong, and exit with `code`."""
    err_console.print(f"[bold red]error:[/] {message}", soft_wrap=True, markup=True)
    raise typer.Exit(code)


def print_json(data: Any) -> None:
    """Machine output: exactly the document, indented, nothing else on stdout."""
    sys.stdout.write(json.dumps(data, indent=2) + "\n")
