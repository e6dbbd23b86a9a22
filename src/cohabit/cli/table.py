"""A plain-text table for people: a header, a rule under it, one line per row, a caption,
cells two spaces apart. A table too wide for the terminal is cut to fit, one line per row:
its cuttable columns (names, places, URLs) first, the widest first, each cell cut with "…",
down to their header's width and then below it; only then the others.

It imports no rich: `cohabit ps` prints its table with it and answers before rich's table
alone would have loaded (docs/cli.md). Text from users and servers prints as itself, its
control characters (a terminal escape among them) dropped; a cell may be styled, in colour
only on a terminal that takes it.
"""

from __future__ import annotations

import os
import shutil
import sys
import unicodedata
from collections.abc import Sequence
from typing import TextIO

ELLIPSIS = "…"
GAP = "  "  # between two columns
EDGE = " "  # before the first column and after the last
RULE = "─"
PIPED_WIDTH = 120  # piped output is read in logs and CI, not an 80-column terminal
# ANSI SGR codes of the styles cells use.
STYLES = {"bold red": "1;31"}


class Styled:
    """A cell's text in a style (one of STYLES). (Plain classes here, not dataclasses: making
    one costs a command's start-up a millisecond.)"""

    __slots__ = ("style", "text")

    def __init__(self, text: str, style: str) -> None:
        self.text, self.style = text, style

    def __str__(self) -> str:
        return self.text


Cell = str | Styled


class Table:
    __slots__ = ("caption", "columns", "cuttable", "rows")

    def __init__(self, columns: Sequence[str], *, cuttable: frozenset[str] = frozenset()) -> None:
        self.columns = columns
        self.cuttable = cuttable  # columns cut first, when the terminal is narrow
        self.rows: list[list[Cell]] = []
        self.caption = ""

    def add_row(self, *cells: Cell) -> None:
        if len(cells) != len(self.columns):
            raise ValueError(f"{len(cells)} cells for {len(self.columns)} columns")
        self.rows.append([_printable(cell) for cell in cells])

    def lines(self, width: int | None, *, colour: bool = False) -> list[str]:
        """The table's lines in at most `width` columns (None: as wide as it is)."""
        widths = self._widths(width)
        total = sum(widths) + len(GAP) * (len(widths) - 1)
        out = [_line(self.columns, widths, colour=False), EDGE + RULE * total]
        out += [_line(row, widths, colour=colour) for row in self.rows]
        if self.caption:
            out += ["", (EDGE + _cut(self.caption, total).center(total)).rstrip()]
        return out

    def _widths(self, width: int | None) -> list[int]:
        natural = [
            max([cell_width(name), *(cell_width(str(row[i])) for row in self.rows)])
            for i, name in enumerate(self.columns)
        ]
        if width is None:
            return natural
        excess = sum(natural) + len(GAP) * (len(natural) - 1) + 2 * len(EDGE) - width
        headers = [cell_width(name) for name in self.columns]
        ones = [1] * len(natural)
        first = [i for i, name in enumerate(self.columns) if name in self.cuttable]
        rest = [i for i in range(len(self.columns)) if i not in first]
        # The cuttable columns down to their header's width, then further (their header cut
        # too); only then the others.
        for group, floors in ((first, headers), (first, ones), (rest, ones)):
            excess = _narrow(natural, floors, group, excess)
        return natural


def print_table(table: Table, *, whole: bool = False) -> None:
    """`table` on stdout: cut to the terminal's width, or `whole`."""
    width = None if whole else terminal_width()
    sys.stdout.write("\n".join(table.lines(width, colour=prints_colour())) + "\n")


def terminal_width(stream: TextIO | None = None) -> int:
    """The columns a table may take on `stream` (stdout): the terminal's (or $COLUMNS), at
    least PIPED_WIDTH when it is not a terminal."""
    stream = stream or sys.stdout
    width = shutil.get_terminal_size().columns
    return width if stream.isatty() else max(width, PIPED_WIDTH)


def prints_colour(stream: TextIO | None = None) -> bool:
    """Whether `stream` is a terminal that takes colour (not NO_COLOR, not TERM=dumb)."""
    stream = stream or sys.stdout
    if "NO_COLOR" in os.environ or os.environ.get("TERM") == "dumb":
        return False
    return stream.isatty()


def cell_width(text: str) -> int:
    """The columns `text` takes on a terminal: two for a wide character, none for a
    combining one."""
    if text.isascii():
        return len(text)
    return sum(_char_width(char) for char in text)


def _char_width(char: str) -> int:
    if unicodedata.combining(char):
        return 0
    return 2 if unicodedata.east_asian_width(char) in "WF" else 1


def _narrow(widths: list[int], floors: list[int], group: list[int], excess: int) -> int:
    """Take up to `excess` columns from the `group`'s widths, the widest first, none below
    its floor; what is left of `excess`."""
    while excess > 0:
        shrinkable = [i for i in group if widths[i] > floors[i]]
        if not shrinkable:
            return excess
        widest = max(widths[i] for i in shrinkable)
        tied = [i for i in shrinkable if widths[i] == widest]
        below = max([floors[i] for i in tied] + [widths[i] for i in shrinkable if i not in tied])
        # Level the widest down to the next width (or their floor), a column at a time.
        step = min(widest - below, -(-excess // len(tied)))
        for i in tied:
            if excess <= 0:
                break
            take = min(step, excess, widths[i] - floors[i])
            widths[i] -= take
            excess -= take
    return excess


def _line(cells: Sequence[Cell], widths: Sequence[int], *, colour: bool) -> str:
    shown = []
    for cell, width in zip(cells, widths, strict=True):
        text = _cut(str(cell), width)
        padded = text + " " * (width - cell_width(text))
        if colour and isinstance(cell, Styled):
            padded = f"\x1b[{STYLES[cell.style]}m{text}\x1b[0m" + padded[len(text) :]
        shown.append(padded)
    return (EDGE + GAP.join(shown)).rstrip()


def _cut(text: str, width: int) -> str:
    """`text` in at most `width` columns, cut with "…" when it is longer."""
    if cell_width(text) <= width:
        return text
    kept, used = [], 0
    for char in text:
        used += _char_width(char)
        if used > width - 1:
            break
        kept.append(char)
    return "".join(kept) + ELLIPSIS


def _printable(cell: Cell) -> Cell:
    """The cell with its control characters dropped (tabs and line breaks as spaces)."""
    text = str(cell)
    if text.isprintable():
        return cell
    clean = "".join(
        " " if char in "\t\n\r" else char
        for char in text
        if char in "\t\n\r" or unicodedata.category(char) != "Cc"
    )
    return Styled(clean, cell.style) if isinstance(cell, Styled) else clean
