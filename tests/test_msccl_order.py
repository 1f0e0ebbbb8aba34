"""Vector clocks of the MSCCL executor model: what a join learns, snapshots that stay as taken,
and the GPUs a run that follows messages tracks at once."""

from __future__ import annotations

from stragglar.msccl.prover.order import CELLS, KEPT, Clocks, batches


def test_within_gpus_tracks_a_tbs_own_gpu_and_sends_nothing() -> None:
    clocks = Clocks.within_gpus([0, 0, 1], [0, 1, 0])
    assert not clocks.exact and not clocks.messages
    assert [len(c) for c in clocks.clock] == [2, 2, 1]
    clocks.join(1, clocks.snapshot(0, 3))  # tb 1 waited for tb 0's third tick
    assert clocks.known(1, 0, 2) and not clocks.known(1, 0, 3)


def test_a_snapshot_stays_what_its_tb_knew() -> None:
    """Taking one copies nothing, so a later join must not change it."""
    clocks = Clocks.through_gpus([0, 0, 1], {0})
    assert clocks.exact and clocks.messages and not clocks.tracks(2)
    sent = clocks.snapshot(2, 5)  # GPU 1's tb knows nothing of GPU 0 yet
    clocks.join(2, clocks.snapshot(0, 4))
    clocks.join(1, sent)
    assert not clocks.known(1, 0, 0)
    clocks.join(1, clocks.snapshot(2, 6))  # now through GPU 1: tb 0's first 4 ticks
    assert clocks.known(1, 0, 3) and not clocks.known(1, 0, 4)


def test_a_join_that_learns_nothing_keeps_the_clock() -> None:
    clocks = Clocks.through_gpus([0, 0], {0})
    clocks.join(1, clocks.snapshot(0, 2))
    before = clocks.clock[1]
    clocks.join(1, clocks.snapshot(0, 1))
    assert clocks.clock[1] is before


def test_batches_keep_the_clocks_within_the_budget() -> None:
    total = 13_450  # thread blocks of StragglAR's file at N = 128
    sizes = [254, *[105] * 127]
    groups = batches(range(128), sizes, total)
    assert sorted(g for group in groups for g in group) == list(range(128))
    assert all(sum(sizes[g] for g in group) * total * KEPT <= CELLS for group in groups)
    assert len(groups) < 10
    assert batches([0], [10**6], 10**6) == [{0}]  # one GPU however large
