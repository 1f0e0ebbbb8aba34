"""The SAT bounds for a straggler-aware ReduceScatter and AllGather (:mod:`stragglar.verify.shard_bound`):
unsat one round and one port chunk below the hand-derived figures, Ring's figures counted in
Ring's own schedules, the schedules z3 returns run on distinct values, and mutated models that
must give the round back."""

from __future__ import annotations

import re
from typing import Any

import pytest

from stragglar.errors import ArgumentError, InputError
from stragglar.schedule import Op, Round
from stragglar.synth.ring import ring_allgather, ring_reduce_scatter
from stragglar.units import count_of
from stragglar.verify import shard_bound as shard
from stragglar.verify.shard_bound import (
    fewest_rounds,
    port_feasible,
    ring_rounds,
    shard_bound,
    shard_feasible,
)

ELEMENTS = 3  # per chunk


def contribution(rank: int, chunk: int, element: int) -> int:
    """Distinct per rank and element; a rank counted twice or missed changes its 32-bit digit."""
    return (chunk * ELEMENTS + element + 1) << (32 * rank)


def reduce_scatter_ends_right(n: int, c: int, rounds: tuple[Round, ...]) -> bool:
    """Run ``rounds`` from the model's start (each punctual rank holds every chunk summed over the
    punctual ranks, the straggler n-1 its own data); every owner must end with its chunks' sums."""
    late = n - 1

    def summed(ranks: range, k: int) -> list[int]:
        return [sum(contribution(r, k, e) for r in ranks) for e in range(ELEMENTS)]

    state = [
        [summed(range(late), k) if r != late else summed(range(late, n), k) for k in range(c)]
        for r in range(n)
    ]
    for transfers in rounds:
        writes = [(t.dst, t.chunk, t.op, list(state[t.src][t.chunk])) for t in transfers]
        for dst, k, op, value in writes:
            state[dst][k] = (
                value if op is Op.COPY else [a + b for a, b in zip(state[dst][k], value, strict=True)]
            )
    return all(state[k % n][k] == summed(range(n), k) for k in range(c))


def all_gather_ends_right(n: int, c: int, rounds: tuple[Round, ...]) -> bool:
    """Run ``rounds`` of copies from the model's start (each punctual rank holds every punctual
    rank's shard, the straggler its own); every rank must end with every chunk."""
    late = n - 1

    def data(k: int) -> list[int]:
        return [contribution(k % n, k, e) for e in range(ELEMENTS)]

    state = [[data(k) if (r == late) == (k % n == late) else None for k in range(c)] for r in range(n)]
    for transfers in rounds:
        if any(t.op is not Op.COPY for t in transfers):
            return False  # an AllGather adds nothing
        writes = [(t.dst, t.chunk, state[t.src][t.chunk]) for t in transfers]
        for dst, k, value in writes:
            state[dst][k] = value
    return all(state[r][k] == data(k) for r in range(n) for k in range(c))


ENDS_RIGHT = {"reduce_scatter": reduce_scatter_ends_right, "all_gather": all_gather_ends_right}


def port_load(n: int, rounds: tuple[Round, ...]) -> int:
    """Chunks through the straggler's port: the larger of what it sends and what it receives."""
    late = n - 1
    sent = sum(t.src == late for r in rounds for t in r)
    received = sum(t.dst == late for r in rounds for t in r)
    return max(sent, received)


def check_proved(collective: str, n: int, c: int | None = None) -> None:
    result = shard_bound(collective, n, c, timeout_s=120)
    c = n if c is None else c
    assert result.proved and not result.refuted, result.lines
    assert result.rounds == result.port_chunks == c * (n - 1) // n == result.ring_rounds
    rounds = result.reached.exchange
    assert rounds is not None and len(rounds) == result.rounds and port_load(n, rounds) <= result.rounds
    assert all(len({t.src for t in r}) == len(r) == len({t.dst for t in r}) for r in rounds)  # one port
    assert ENDS_RIGHT[collective](n, c, rounds)
    title = shard.COLLECTIVES[collective]
    assert result.lines[0].startswith(
        f"proved: no {title} for {n} GPUs and {c} chunks fits in {result.rounds - 1}"
    )
    ring = f"{count_of(result.rounds, 'round')}, {count_of(result.rounds, 'chunk')}"
    assert result.lines[1] == f"Ring: {ring} through the straggler's port each way"  # 1 round at N = 2
    assert result.lines[2].startswith(f"no gain: a straggler-aware {title} needs as many rounds and bytes")


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather"])
@pytest.mark.parametrize("n", range(2, 6))
def test_fewest_rounds_and_port_chunks_are_rings_for_small_n(collective: str, n: int) -> None:
    """Unsat one round and one port chunk below (N-1)/N of the chunks, and a schedule that reaches
    both at once and really ends with the collective's result."""
    check_proved(collective, n)


@pytest.mark.slow
@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather"])
@pytest.mark.parametrize("n", range(6, 9))
def test_fewest_rounds_and_port_chunks_are_rings_up_to_8(collective: str, n: int) -> None:
    check_proved(collective, n)


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather"])
@pytest.mark.parametrize(("n", "c"), [(2, 4), (3, 6), (4, 8)])
def test_more_chunks_change_nothing(collective: str, n: int, c: int) -> None:
    check_proved(collective, n, c)


@pytest.mark.parametrize("n", range(2, 9))
def test_rings_figures_are_counted_in_rings_schedules(n: int) -> None:
    """By hand: a ReduceScatter must send the straggler's data of every chunk it does not own, an
    AllGather bring it every chunk it does not own, (N-1)/N of the buffer through one port, one
    chunk a round; Ring moves exactly that, in N-1 steps of one chunk."""
    ranks = list(range(n))
    for rounds in (ring_reduce_scatter(ranks, ranks), ring_allgather(ranks, ranks)):
        assert len(rounds) == ring_rounds(n, n) == fewest_rounds(n, n) == n - 1
        assert port_load(n, rounds) == n - 1
    assert ring_rounds(n, 3 * n) == fewest_rounds(n, 3 * n) == 3 * (n - 1)


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather"])
def test_a_claim_one_lower_is_refused_and_one_higher_fits(collective: str) -> None:
    n, fewest = 4, fewest_rounds(4, 4)
    assert shard_feasible(collective, n, fewest - 1).status == "unsat"
    assert port_feasible(collective, n, fewest - 1).status == "unsat"
    assert port_feasible(collective, n, fewest).status == "sat"
    assert shard_feasible(collective, n, fewest + 1, fewest).status == "sat"


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather"])
def test_a_model_with_one_chunk_across_the_port_already_needs_one_round_and_chunk_fewer(
    collective: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mutation: the straggler's data of chunk N-2 already at its owner (ReduceScatter), or chunk
    N-2 already at the straggler (AllGather).  The encoding is not vacuous: the round and the port
    chunk the bound counts for it come back.  (Chunk N-2 comes last in the symmetry breaking's
    order, which a chunk that need not cross the port would otherwise break.)"""
    n, fewest = 5, fewest_rounds(5, 5)
    honest = shard.start_parts

    def leaked(collective: str, n: int, rank: int, chunk: int, part: int) -> bool:
        return honest(collective, n, rank, chunk, part) or (chunk, rank, part) in {
            (n - 2, n - 2, 1),
            (n - 2, n - 1, 0),
        }

    monkeypatch.setattr(shard, "start_parts", leaked)
    answer = shard_feasible(collective, n, fewest - 1, fewest - 1)
    assert answer.status == "sat" and answer.exchange is not None and len(answer.exchange) == fewest - 1
    assert port_feasible(collective, n, fewest - 1).status == "sat"
    assert shard_feasible(collective, n, fewest - 2).status == "unsat"


@pytest.mark.parametrize("collective", ["reduce_scatter", "all_gather"])
def test_the_schedule_check_fails_a_schedule_missing_a_transfer(collective: str) -> None:
    """The check that proves z3's schedules can fail: without its last transfer one ends wrong."""
    answer = shard_feasible(collective, 4, 3)
    assert answer.exchange is not None and ENDS_RIGHT[collective](4, 4, answer.exchange)
    cut = (*answer.exchange[:-1], answer.exchange[-1][:-1])
    assert not ENDS_RIGHT[collective](4, 4, cut)


def test_a_query_out_of_time_is_unknown_and_the_bound_says_so() -> None:
    result = shard_bound("reduce_scatter", 8, timeout_s=0.01)
    assert not result.proved and not result.refuted
    assert result.lines == (result.lines[0],) and result.lines[0].startswith(
        "z3 gave no answer for the ReduceScatter"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("scatter", 4), "no bound for collective 'scatter': reduce_scatter, all_gather"),
        (("reduce_scatter", 25), "need 2 to 24 GPUs"),
        (("all_gather", 4, 6), "need a multiple of 4 chunks (one shard per GPU), got 6 chunks"),
        (("all_gather", 24, 48), "at most 1,000,000 sends to decide"),
    ],
)
def test_queries_that_are_not_or_too_large_are_refused_before_building(
    args: tuple[Any, ...], message: str
) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        shard_bound(*args)


def test_a_round_count_that_is_no_integer_is_refused_not_decided() -> None:
    """True named z3's final-state variables apart from the rounds' (has_True_...): sat."""
    with pytest.raises(ArgumentError, match="rounds must be an integer"):
        shard_feasible("reduce_scatter", 4, True, None, 20, 4)
