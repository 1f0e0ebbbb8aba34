"""Ranks in words, as the messages of the runtime, the DDP and FSDP hooks and the launcher say
them: what a caller passes for none is one line of ours."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from stragglar.errors import ArgumentError, InputError
from stragglar.runtime import ranks_in_words


def test_ranks_are_said_in_runs_and_none_as_no_rank() -> None:
    """An empty group was "ranks ", a sentence without its subject; numpy's ranks read as ints."""
    assert ranks_in_words({3, 1, 2, 0, 7}) == "ranks 0-3, 7"
    assert ranks_in_words([np.int64(4)]) == "rank 4"
    assert ranks_in_words(set()) == "no rank"
    assert ranks_in_words(range(0, 20, 2), limit=1) == "ranks 0 and 9 more"


@pytest.mark.parametrize(
    ("ranks", "limit", "error", "message"),
    [
        (None, 8, ArgumentError, "ranks must be an iterable of ranks, got None"),  # was a TypeError
        ("5", 8, ArgumentError, "ranks must be an iterable of ranks, got '5'"),  # was 'rank 5'
        ([0, "1"], 8, ArgumentError, r"each rank must be an integer, got '1' \(str\)"),  # was a TypeError
        ([0, 1.5], 8, ArgumentError, r"each rank must be an integer, got 1.5 \(float\)"),
        ([-1, 0], 8, InputError, "each rank must be at least 0, got -1"),
        ([0, 2, 4], 0, InputError, "limit must be at least 1, got 0"),  # was "ranks  and 3 more"
    ],
)
def test_ranks_that_are_none_are_refused_in_one_line(
    ranks: Any, limit: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=f"^{message}$"):
        ranks_in_words(ranks, limit=limit)
