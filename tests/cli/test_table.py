"""The plain-text table `cohabit ps` prints (cli/table.py): cut to the width it is given, the
cuttable columns first and the widest of them first, each cell on one line ending in "…";
whole when asked; wide characters counted as two columns; control characters never printed;
colour only where asked."""

from __future__ import annotations

import io

import pytest

from cohabit.cli.table import Styled, Table, cell_width, prints_colour, terminal_width


def table() -> Table:
    made = Table(("ID", "MODEL", "WHERE", "STATUS"), cuttable=frozenset({"MODEL", "WHERE"}))
    made.add_row("6c8fae52", "qwen2.5-0.5b-instruct-q4_k_m", "node-a gpu 0", "DEPLOYED")
    made.add_row("0e4c0d0e", "tiny", "node-b gpu 1 mig 1g.10gb", "QUEUED")
    return made


def test_it_fits_whole_when_there_is_room() -> None:
    lines = table().lines(200)
    assert lines[0].split() == ["ID", "MODEL", "WHERE", "STATUS"]
    assert set(lines[1].strip()) == {"─"}
    assert lines[2].split() == ["6c8fae52", "qwen2.5-0.5b-instruct-q4_k_m", "node-a", "gpu", "0",
                                "DEPLOYED"]  # fmt: skip
    assert all("…" not in line for line in lines)
    assert table().lines(None) == lines


@pytest.mark.parametrize("width", [70, 60, 50, 40])
def test_a_narrow_width_cuts_the_widest_cuttable_column_first(width: int) -> None:
    whole = table().lines(None)
    lines = table().lines(width)
    assert max(len(line) for line in lines) <= width
    assert len(lines) == len(whole)  # one line per row, never folded
    for line in lines[2:]:
        assert line.split()[0] in ("6c8fae52", "0e4c0d0e")  # ids whole
        assert line.split()[-1] in ("DEPLOYED", "QUEUED")  # statuses whole
    assert lines[2].split()[1].endswith("…")  # the widest cuttable cell, cut first


def test_the_widest_goes_first_then_both_level() -> None:
    whole = table()._widths(None)
    assert whole == [8, 28, 24, 8]
    assert table()._widths(sum(whole) + 6 + 2 - 4) == [8, 24, 24, 8]
    assert table()._widths(sum(whole) + 6 + 2 - 10) == [8, 21, 21, 8]


def test_cuttable_columns_go_to_their_header_then_below_it_then_the_others() -> None:
    assert table()._widths(40) == [8, 8, 8, 8]  # the cuttable ones, levelled
    assert table()._widths(30) == [8, 3, 3, 8]  # below their headers' 5
    assert table()._widths(20) == [5, 1, 1, 5]  # only then the id and the status
    lines = table().lines(30)
    assert lines[0] == " ID        MO…  WH…  STATUS"
    assert max(len(line) for line in lines) <= 30


def test_wide_characters_take_two_columns() -> None:
    assert cell_width("模型") == 4
    assert cell_width("e\u0301") == 1  # a combining accent takes none
    made = Table(("NAME", "X"), cuttable=frozenset({"NAME"}))
    made.add_row("模型模型模型", "y")
    (row,) = made.lines(12)[2:]
    assert cell_width(row) <= 12 and row.split()[0].endswith("…")


def test_control_characters_never_print() -> None:
    made = Table(("NAME",))
    made.add_row("evil\x1b[2Jname\nnext\x07")
    made.add_row(Styled("x\x1b]0;title\x07", "bold red"))
    lines = made.lines(None, colour=False)
    assert lines[2] == " evil[2Jname next"
    assert "\x1b" not in "".join(lines) and "\x07" not in "".join(lines)


def test_styled_cells_are_coloured_only_when_asked() -> None:
    made = Table(("A", "B"))
    made.add_row(Styled("! over", "bold red"), "b")
    plain = made.lines(None)[2]
    coloured = made.lines(None, colour=True)[2]
    assert "\x1b" not in plain
    assert coloured == plain.replace("! over", "\x1b[1;31m! over\x1b[0m")


def test_a_caption_is_centred_under_the_table() -> None:
    made = table()
    made.caption = "/v1: by model"
    lines = made.lines(None)
    assert lines[-2] == ""
    assert lines[-1].strip() == "/v1: by model"
    rule = len(lines[1].strip())
    assert abs(len(lines[-1]) - len(lines[-1].lstrip()) - 1 - (rule - 13) // 2) <= 1


def test_a_pipe_gets_at_least_120_columns_and_no_colour(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    pipe = io.StringIO()
    assert terminal_width(pipe) == 120
    assert prints_colour(pipe) is False


def test_a_row_must_match_the_columns() -> None:
    with pytest.raises(ValueError, match="3 cells for 4 columns"):
        table().add_row("a", "b", "c")
