"""stragglar.model.predict: a comparison any schedule would refuse is refused before the first is made."""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner

from stragglar.cli import cli
from stragglar.errors import InputError
from stragglar.model import predict


def test_a_chunk_count_over_the_limits_is_refused_before_any_schedule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It was refused only after Ring, RHD, Direct and StragglAR at N = 2048 were made (33 s)."""

    def made(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a schedule was made first: {args}")

    monkeypatch.setattr(predict, "synthesize", made)
    with pytest.raises(InputError, match="2048 ranks x 65536 chunks: stragglar handles at most 4,194,304"):
        predict.compare_generated(2048, 2**30, 0.0, chunks=65536)
    with pytest.raises(InputError, match="StragglAR needs at least N - 1 = 2047 chunks, got 2000"):
        predict.compare_generated(2048, 2**30, 0.0, chunks=2000)


def test_cost_refuses_too_many_cells_at_once() -> None:
    began = time.perf_counter()
    result = CliRunner().invoke(cli, ["cost", "--gpus", "2048", "--chunks", "65536"])
    assert time.perf_counter() - began < 10.0  # a guard against the old 33 s of work, not a speed target
    assert result.exit_code == 2
    assert result.stderr == (
        "Error: 2048 ranks x 65536 chunks: stragglar handles at most 4,194,304 (rank, chunk) cells\n"
    )
