"""The late-rank probe's rows: what each rank shares per step, and what every rank reads of them."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

from stragglar.ddp.probe import SLOTS, decode, encode


def test_probe_rows_carry_waits_and_the_fastest_ranks_timings() -> None:
    rows = [
        encode(
            0.040, [("allreduce", 1000, 0, 0.010), ("stragglar", 2000, 16, 0.030), ("stragglar", 8, 0, 1.0)]
        ),
        encode(0.0, [("allreduce", 1000, 0, 0.004), ("stragglar", 2000, 16, None), ("stragglar", 8, 0, 2.0)]),
        encode(
            0.041, [("allreduce", 1000, 0, 0.009), ("allreduce", 2000, 0, 0.020), ("stragglar", 8, 9, 0.5)]
        ),
    ]
    figures = decode(rows)
    assert figures is not None
    late, samples = figures
    assert late.index(max(late)) == 1 and math.isclose(max(late), 0.040)
    # rank 1's second timing is not known yet; rank 2 ran its second and third buckets otherwise
    assert samples == [
        ("allreduce", 1000, 0, 0.004),
        ("stragglar", 2000, 16, 0.030),
        ("stragglar", 8, 0, 1.0),
    ]
    assert decode([encode(None, []), encode(0.1, [])]) is None  # the first gather: no waits yet
    many = encode(0.0, [("allreduce", size, 0, 0.001) for size in range(1, 20)])
    assert many == encode(0.0, [("allreduce", size, 0, 0.001) for size in range(1, SLOTS + 1)])


def closing_rank(rank: int, n: int) -> tuple[float, bool, bool]:
    """Three steps of the probe, then a callback on the last gather that keeps gloo's thread busy
    0.3 s after its Future completed (a thread descheduled there), then ``close``: how long it
    took, whether gloo's thread still held the gather's callback after it, and whether the probe
    still holds the gather's work (whose end in gloo's thread would take the GIL)."""
    import time

    from stragglar.ddp.probe import LateRankProbe

    probe = LateRankProbe(n, 4, 10.0)
    for _ in range(3):
        probe.step()
    assert probe._pending is not None
    done, _, _, (work, callback) = probe._pending
    done.add_done_callback(lambda _: time.sleep(0.3))
    done.wait()
    begun = time.monotonic()
    probe.close(5.0)
    return time.monotonic() - begun, callback() is not None, probe._closed is work


def test_close_waits_until_gloo_s_thread_let_go_of_the_last_gather() -> None:
    """At exit (a script that never destroys its groups), a gloo thread still waiting for the GIL
    to let go of the gather's Python objects when finalization begins aborts the process; close
    returned once the Future completed, with the callback still held, and left the work's end to
    gloo's thread."""
    from stragglar.measure.launch import launch

    for took, alive, kept in launch(closing_rank, 2, timeout=60):
        assert not alive and kept
        assert took < 4.0
