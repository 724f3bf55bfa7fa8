"""cache_tools.render.table: one table renderer; fitted to a terminal's width when given one."""

from __future__ import annotations

import pytest

from cache_tools.render import table

HEADERS = ["phase", "class", "requests", "ms", ""]
ROWS = [["prefill", "extend_int_classes_with_a_long_name", 16, 7150, "█" * 20],
        ["decode", "d", 2, 3, "█"]]


def test_without_a_width_every_column_is_kept():
    lines = table(HEADERS, ROWS, align="llrrl").splitlines()
    assert lines[0].split() == ["phase", "class", "requests", "ms"]
    assert lines[2] == ("prefill  extend_int_classes_with_a_long_name        16  7,150  "
                        + "█" * 20)


def test_columns_are_dropped_in_the_order_given_then_text_is_cut():
    dropped = table(HEADERS, ROWS, align="llrrl", width=60, drop=(4,)).splitlines()
    assert dropped[0].split() == ["phase", "class", "requests", "ms"]
    assert max(map(len, dropped)) <= 60 and "█" not in "".join(dropped)
    cut = table(HEADERS, ROWS, align="llrrl", width=30, drop=(4, 0)).splitlines()
    assert cut == ["class          requests  ms",
                   "-------------  --------  -----",
                   "extend_int_c…        16  7,150",
                   "d                     2      3"]


@pytest.mark.parametrize("width", [10, 20, 45, 80])
def test_a_table_never_cuts_below_eight_characters_nor_numbers(width):
    text = table(HEADERS, ROWS, align="llrrl", width=width, drop=(4, 0))
    assert "7,150" in text and "16" in text
    name = next(cell for cell in text.splitlines()[2].split() if cell.startswith("extend_"))
    assert len(name) >= 8
    assert len(text.splitlines()[2]) <= max(width, 8 + 2 + 8 + 2 + 5)


def test_lines_wraps_sentences_and_keeps_tables():
    from cache_tools.render import lines

    tab = table(["a", "b"], [["x" * 50, "y" * 50]])
    text = lines(["word " * 30, tab, "short"], 40).splitlines()
    assert all(len(x) <= 40 for x in text[:4]) and text[1].startswith("    ")
    assert tab in lines(["word " * 30, tab, "short"], 40) and text[-1] == "short"
    assert lines(["word " * 30], None) == "word " * 30
