"""The errors stragglar raises on purpose, each with its exit code."""

from __future__ import annotations

from stragglar.errors import (
    SHOWN_CHARACTERS,
    IncorrectError,
    InputError,
    RunError,
    StragglarError,
    printable,
    quoted,
    shown,
)


def test_each_error_kind_has_its_exit_code() -> None:
    assert [e.exit_code for e in (StragglarError(), InputError(), IncorrectError(), RunError())] == [
        1,
        2,
        1,
        1,
    ]
    assert isinstance(InputError("x"), ValueError) and isinstance(RunError("x"), RuntimeError)


def test_what_a_message_echoes_is_escaped_and_bounded() -> None:
    assert shown("late\x00\x1b[2J\n\u202e") == "late\\x00\\x1b[2J\\n\\u202e"
    assert shown("x" * 100_000) == "x" * SHOWN_CHARACTERS + "... (100,000 characters)"
    assert quoted("64XB") == "'64XB'" and shown("stragglar") == "stragglar"
    assert printable("row 1\nrow\x072 \U0001f600") == "row 1\nrow\\x072 \U0001f600"  # lines kept
