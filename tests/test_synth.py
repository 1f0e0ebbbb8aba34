"""Every generated schedule is a proved AllReduce with the promised number of rounds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import stragglar.schedule
import stragglar.synth
from stragglar.errors import InputError
from stragglar.schedule import Op, Schedule, round_lower_bound
from stragglar.synth import ALGORITHMS, check_ranks, check_request, generate, synthesize
from stragglar.verify import prove

# Phase-2 rounds of the authors' reference synthesizer (docs/model.md).
REFERENCE_ROUNDS = {6: 7, 10: 12, 12: 15, 14: 17, 18: 21, 20: 24, 24: 27, 48: 55, 96: 106}


def is_pow2(n: int) -> bool:
    return n & (n - 1) == 0


@pytest.mark.parametrize("n", range(2, 65))
def test_stragglar_is_proved_and_round_optimal_where_promised(n: int) -> None:
    s = synthesize("stragglar", n)
    proof = prove(s)
    bound = round_lower_bound(n)
    assert proof.exposed_rounds == s.exposed_rounds >= bound
    assert s.exposed_rounds == bound
    assert s.exposed_rounds <= REFERENCE_ROUNDS.get(n, s.exposed_rounds)
    assert s.metadata["lower_bound"] == bound


@pytest.mark.parametrize("n", range(2, 65))
def test_stragglar_shape_follows_the_paper(n: int) -> None:
    s = synthesize("stragglar", n)
    late, others = n - 1, tuple(range(n - 1))
    assert (s.num_chunks, s.straggler) == (n - 1, late)
    hidden = [p for p in s.phases if late not in p.ranks]
    assert [p.ranks for p in hidden] == ([others] if n > 2 else [])
    assert all(len(p.rounds) == n - 2 for p in hidden)
    exchange = s.phases[-1].rounds
    for t in range(n - 1):  # round t completes chunk t: GPU t and the straggler swap and add
        swaps = {(x.src, x.dst, x.chunk) for x in exchange[t] if x.op is Op.REDUCE}
        assert swaps == {(t, late, t), (late, t, t)}
    assert all(x.op is Op.COPY for r in exchange[n - 1 :] for x in r)


@pytest.mark.parametrize("n", range(2, 13))
def test_any_straggler_rank(n: int) -> None:
    for straggler in range(n):
        s = synthesize("stragglar", n, straggler=straggler)
        prove(s)
        assert s.straggler == straggler
        assert straggler not in s.phases[0].ranks or n == 2
        assert s.exposed_rounds == round_lower_bound(n)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize("n", range(2, 65))
def test_baselines_are_proved_with_their_round_counts(algorithm: str, n: int) -> None:
    if algorithm == "rhd" and not is_pow2(n):
        with pytest.raises(ValueError, match="power-of-two"):
            synthesize(algorithm, n)
        return
    s = synthesize(algorithm, n)
    prove(s)
    log2 = (n - 1).bit_length()
    expected = {"ring": 2 * (n - 1), "rhd": 2 * log2, "direct": log2}
    if algorithm in expected:
        assert s.exposed_rounds == expected[algorithm]


def test_direct_hides_an_allreduce_of_the_others() -> None:
    s = synthesize("direct", 8, straggler=3)
    prove(s)
    assert s.straggler == 3 and 3 not in s.phases[0].ranks and len(s.phases[0].rounds) == 2 * 6


def test_every_algorithm_named_in_the_core_has_a_generator_and_every_generator_a_name() -> None:
    """The runtime numbers algorithms by the core's tuple, the generators by their table: one list."""
    assert stragglar.synth.ALGORITHMS is stragglar.schedule.ALGORITHMS
    assert tuple(stragglar.synth._GENERATORS) == ALGORITHMS
    assert [synthesize(a, 4).algorithm for a in ALGORITHMS] == list(ALGORITHMS)


@pytest.mark.parametrize(
    ("algorithm", "n"),
    [(a, n) for a in ALGORITHMS for n in (2, 3, 4, 7, 8, 16, 33) if a != "rhd" or is_pow2(n)],
)
def test_a_request_knows_the_chunk_count_before_the_schedule_is_made(algorithm: str, n: int) -> None:
    """Callers refuse what their output cannot hold from this count, before any work."""
    assert check_request(algorithm, n).num_chunks == synthesize(algorithm, n).num_chunks
    if algorithm == "stragglar":
        assert (
            check_request(algorithm, n, chunks=2 * n).num_chunks
            == synthesize(algorithm, n, chunks=2 * n).num_chunks
        )


@pytest.mark.parametrize(
    ("algorithm", "n", "straggler", "chunks", "method"),
    [
        ("stragglar", 8, 2, 20, "construct"),
        ("ring", 5, None, None, "construct"),
        ("stragglar", 5, 0, None, "smt"),
    ],
)
def test_a_request_checked_in_two_parts_is_the_whole_check_and_makes_the_schedule(
    algorithm: str, n: int, straggler: int | None, chunks: int | None, method: str
) -> None:
    """``synth --chunks auto`` asks what N alone refuses before it prices chunk counts, then the
    rest: together the one check_request, and what it returns makes synthesize's schedule."""
    whole = check_request(algorithm, n, straggler, chunks=chunks, method=method)
    assert check_ranks(algorithm, n, method).refined(straggler, chunks=chunks) == whole
    made, synthesized = generate(whole), synthesize(algorithm, n, straggler, chunks=chunks, method=method)
    if method == "smt":  # z3's model may differ from one query to the next, its shape may not
        assert (made.straggler, made.exposed_rounds) == (synthesized.straggler, synthesized.exposed_rounds)
    else:
        assert made == synthesized
    with pytest.raises(ValueError, match="StragglAR needs at least N - 1 = 7 chunks, got 3"):
        check_ranks("stragglar", 8).refined(chunks=3)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_output_is_deterministic(algorithm: str) -> None:
    assert synthesize(algorithm, 16) == synthesize(algorithm, 16)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("stragglar", 1), "need 2 to 2048 GPUs"),
        (("stragglar", 0), "need 2 to 2048 GPUs"),
        (("bogus", 8), "unknown algorithm"),
        (("stragglar", 8, 8), "straggler must be a rank in 0..7"),
        (("stragglar", 8, -1), "straggler must be a rank in 0..7"),
        (("ring", 8, 2), "has no straggler"),
        (("rhd", 6), "power-of-two"),
    ],
)
def test_bad_requests_say_why(args: tuple[str, int] | tuple[str, int, int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        synthesize(*args)


@settings(max_examples=6, deadline=None)
@given(st.integers(min_value=65, max_value=300))
def test_larger_sizes_are_proved_and_near_the_bound(n: int) -> None:
    s: Schedule = synthesize("stragglar", n)
    prove(s)
    assert round_lower_bound(n) <= s.exposed_rounds <= round_lower_bound(n) + 2


def test_a_stalled_search_jumps_back_and_reaches_the_bound() -> None:
    # plain backtracking thrashes at n = 178 and used to settle for one more round
    s = synthesize("stragglar", 178)
    prove(s)
    assert s.exposed_rounds == round_lower_bound(178)


@pytest.mark.slow
@pytest.mark.parametrize("n", [*range(65, 130), 200, 255, 256, 300, 500, 509, 510, 511, 512, 1023, 1024])
def test_larger_tier(n: int) -> None:
    s = synthesize("stragglar", n)
    prove(s)
    assert s.exposed_rounds == round_lower_bound(n)


@pytest.mark.slow
def test_a_search_with_jumps_is_deterministic() -> None:
    assert synthesize("stragglar", 509) == synthesize("stragglar", 509)


@pytest.mark.parametrize(
    ("straggler", "message"),
    [(1.5, "straggler must be an integer, got 1.5 (float)"), (True, "got True (bool)"), ("3", "got '3'")],
)
def test_api_arguments_are_checked_in_api_terms(straggler: object, message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        synthesize("stragglar", 8, straggler)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="num_ranks must be an integer"):
        synthesize("stragglar", 8.0)  # type: ignore[arg-type]
    assert synthesize("stragglar", np.int64(8), np.int64(3)).straggler == 3
    with pytest.raises(InputError, match="has no straggler: leave the straggler out"):
        synthesize("ring", 8, 3)
