"""The errors stragglar raises on purpose, each with its exit code."""

from __future__ import annotations

from stragglar.errors import IncorrectError, InputError, RunError, StragglarError


def test_each_error_kind_has_its_exit_code() -> None:
    assert [e.exit_code for e in (StragglarError(), InputError(), IncorrectError(), RunError())] == [
        1,
        2,
        1,
        1,
    ]
    assert isinstance(InputError("x"), ValueError) and isinstance(RunError("x"), RuntimeError)
