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
