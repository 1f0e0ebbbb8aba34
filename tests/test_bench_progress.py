"""Long benchmarks say what they are at on a terminal (benchmarks/options.py's ``each`` and
``note``, which keep a pipe quiet): round_table.py ran half a minute with nothing shown, and
bench_msccl / bench_mscclpp nothing while a large N ran."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TypeVar

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
T = TypeVar("T")


def recording(labels: list[str]) -> Callable[[Sequence[T], Callable[[T], str]], Iterator[T]]:
    """A stand-in for ``each`` that keeps each item's label."""

    def each(items: Sequence[T], label: Callable[[T], str]) -> Iterator[T]:
        for item in items:
            labels.append(label(item))
            yield item

    return each


def test_round_table_shows_each_size_and_each_table(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import round_table

    labels: list[str] = []
    notes: list[str] = []
    monkeypatch.setattr(round_table, "each", recording(labels))
    monkeypatch.setattr(round_table, "note", notes.append)
    monkeypatch.setattr(round_table, "SIZES", (4, 5))
    monkeypatch.setattr(round_table, "CHUNKED_SIZES", (4,))
    assert round_table.main([]) == 0
    assert labels == ["StragglAR at N = 4", "StragglAR at N = 5", "chunked StragglAR at N = 4"]
    assert notes[0].startswith("StragglAR: 2 sizes") and notes[1].startswith("chunked StragglAR: 1 sizes")
    assert "| 5 | " in capsys.readouterr().out


@pytest.mark.parametrize("name", ["bench_msccl", "bench_mscclpp"])
def test_the_export_benchmarks_show_each_size(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    bench = __import__(name)
    labels: list[str] = []
    monkeypatch.setattr(bench, "each", recording(labels))
    monkeypatch.setattr(sys, "argv", [f"{name}.py", "--gpus", "4", "6", "--repeats", "1"])
    bench.main()
    assert labels == ["N = 4: export and prove", "N = 6: export and prove"]
