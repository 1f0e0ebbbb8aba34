"""The torch ranks' timing on a GPU, without one: a rank's time ends when its CUDA stream is done,
and a stream that never finishes is a timeout naming the rank, not a hang."""

from __future__ import annotations

import time

import pytest

torch = pytest.importorskip("torch")

from stragglar.measure.run_torch import _stream_done  # noqa: E402 - after the skip
from stragglar.runtime import RankError  # noqa: E402


class FakeEvent:
    """A CUDA event recorded on the current stream that completes at its ``after + 1``-th query
    (None: never)."""

    def __init__(self, after: int | None) -> None:
        self.after = after
        self.queries = 0
        self.recorded = False

    def record(self) -> None:
        self.recorded = True

    def query(self) -> bool:
        assert self.recorded, "queried before it was recorded"
        self.queries += 1
        return self.after is not None and self.queries > self.after


def test_a_rank_is_done_when_its_stream_has_finished(monkeypatch: pytest.MonkeyPatch) -> None:
    event = FakeEvent(after=3)
    monkeypatch.setattr(torch.cuda, "Event", lambda: event)
    before = time.perf_counter()
    done = _stream_done(0, 5.0, "running stragglar in iteration 0")
    assert event.queries == 4 and before <= done <= time.perf_counter()


def test_a_stream_that_never_finishes_is_a_timeout_naming_the_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "Event", lambda: FakeEvent(after=None))
    start = time.monotonic()
    with pytest.raises(RankError) as info:
        _stream_done(2, 0.05, "running stragglar in iteration 3")
    assert time.monotonic() - start < 5  # a generous bound: it must not hang
    assert str(info.value) == (
        "rank 2 timed out running stragglar in iteration 3: the GPU had not finished after 0.05 s"
    )
    assert (info.value.rank, info.value.reason, info.value.during) == (
        2,
        "timed out",
        "running stragglar in iteration 3",
    )
