"""A rank's heartbeat: nothing outside a launched rank, at most one beat per 0.2 s inside one."""

from __future__ import annotations

import multiprocessing
import time

import pytest

from stragglar.runtime import liveness as beats


def test_outside_a_launched_rank_a_heartbeat_sends_nothing() -> None:
    assert beats._pipe is None  # nothing in the test process connected one
    beats.heartbeat()


def test_a_connected_rank_beats_at_most_every_fifth_of_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    received, sent = multiprocessing.Pipe(duplex=False)
    monkeypatch.setattr(beats, "_pipe", None)  # restored after the test: the process is no rank
    monkeypatch.setattr(beats, "_last", 0.0)
    beats.connect_launcher(sent)
    for _ in range(5):
        beats.heartbeat()
    assert received.recv() == ("beat", None) and not received.poll(0.05)
    time.sleep(0.2)
    beats.heartbeat()
    beats.send_to_launcher(sent, ("ok", 7))
    assert [received.recv(), received.recv()] == [("beat", None), ("ok", 7)]
    sent.close()
    received.close()
