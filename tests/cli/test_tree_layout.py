"""``cli/_tree_layout.py``: the tree on a narrow terminal never breaks a word."""

from __future__ import annotations

from dsh_agent_loop.cli._tree_layout import fits, stacked_rows, wrap_words

ROW = ("main.helper-session-1", "main.helper", "12", "completed", "child")


def test_words_wrap_only_between_words() -> None:
    text = "agent main.helper · 12 events · last turn completed · child"
    for width in range(12, 70):
        lines = wrap_words(text, width)
        assert all(len(line) <= width for line in lines)
        assert " ".join(lines) == text  # nothing cut, nothing lost


def test_a_word_wider_than_the_line_splits_at_its_own_separators() -> None:
    word = "main.sub.sub.sub-session-00000007-0000-4000-8000-000000000000"
    lines = wrap_words(word, 30)
    assert "".join(lines) == word
    assert all(len(line) <= 30 for line in lines)
    assert all(line[-1] in ".-_" for line in lines[:-1])  # cut after a separator
    assert wrap_words("x" * 25, 10) == ["x" * 10, "x" * 10, "x" * 5]  # none to cut at


def test_the_table_fits_or_the_rows_stack() -> None:
    header = ("SESSION", "AGENT", "EVENTS", "LAST TURN END", "LINK")
    assert fits(header, [ROW], 80)
    assert not fits(header, [ROW], 60)
    lines = stacked_rows([(0, ROW), (3, ROW)], 40)
    assert lines[0] == ("SESSION · agent · events · last turn ·", "dim")
    text = [line for line, _ in lines]
    assert text[2:] == [
        "main.helper-session-1",
        "    agent main.helper · 12 events · last",
        "    turn completed · child",
        "      main.helper-session-1",
        "          agent main.helper · 12 events",
        "          · last turn completed · child",
    ]
    assert all(len(line) <= 40 for line in text)


def test_indentation_gives_way_and_the_level_is_named() -> None:
    long_id = "a" * 76
    (_, _), (first, style), *details = stacked_rows([(5, (long_id, "a", "1", "-", "-"))], 80)
    assert (first, style) == ("    " + long_id, "bold")  # 4 columns left of the 10 asked for
    assert " ".join(line.strip() for line, _ in details) == (
        "agent a · 1 event · no turn yet · level 5 of the tree"
    )
