"""Choosing StragglAR's chunk count: the cost model's choice, ``--chunks C|auto`` on synth and cost,
the names chunked artifacts get, and the issue's model targets (1 GiB, 3 us, 450 GiB/s, 5 ms)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, cast

import pytest
from cli_results import run

from stragglar.errors import ArgumentError, InputError
from stragglar.formats import schedule_json
from stragglar.model import (
    AUTO,
    PAPER_NETWORK,
    Network,
    best_chunks,
    best_chunks_over,
    chunk_candidates,
    chunked_loads,
    compare_generated,
    estimate,
    generated_profile,
    ranked_chunks,
    resolve_chunks,
)
from stragglar.msccl import default_name as xml_name
from stragglar.mscclpp import default_name as plan_name
from stragglar.schedule import base_name, round_lower_bound
from stragglar.synth import synthesize

GIB = 2**30
GLOO_LIKE = Network(alpha=80e-6, bandwidth=2e9)


def exposed(n: int, c: int, size: float, delay: float, network: Network) -> float:
    return estimate(generated_profile("stragglar", n, c), size, delay, network).exposed


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 9, 12, 16, 33])
def test_the_closed_form_loads_are_the_generated_schedules(n: int) -> None:
    """auto prices every count from :func:`chunked_loads`, not from a synthesis each: they must be
    the generator's, at every count from N - 1 to past three multiples of it."""
    for c in range(n - 1, 3 * (n - 1) + 6):
        profile = generated_profile("stragglar", n, c)
        loads = (len(profile.hidden), sum(profile.hidden), len(profile.exposed), sum(profile.exposed))
        assert chunked_loads(n, c) == loads, (n, c)


@pytest.mark.parametrize(
    ("n", "size", "delay", "network", "missed"),
    [
        (9, 16 * 2**20, 500e-6, Network(10e-6, 50 * GIB), 8),  # the old candidates' misses: 11 is cheaper
        (12, 256 * 2**20, 5e-3, Network(10e-6, 50 * GIB), 44),  # 41
        (16, 256 * 2**20, 5e-3, Network(10e-6, 50 * GIB), 45),  # 44
        (7, GIB, 2e-3, PAPER_NETWORK, 36),  # 40
        (2, GIB, 5e-3, PAPER_NETWORK, None),
        (4, GIB, 1e-3, PAPER_NETWORK, None),
        (8, GIB, 5e-3, PAPER_NETWORK, None),
        (8, 64 * 2**20, 0.0, GLOO_LIKE, None),
        (12, GIB, 1e-3, PAPER_NETWORK, None),
    ],
)
def test_best_chunks_is_the_cheapest_of_every_count(
    n: int, size: int, delay: float, network: Network, missed: int | None
) -> None:
    """A brute force over every C from N - 1 to four times the pick, each priced on its generated
    schedule, finds nothing cheaper.  The candidates around phase 2's optimum that auto priced
    before missed the cheapest in the first four settings (by 0.1% to 0.4%)."""
    best = best_chunks(n, size, delay, network)
    every = range(n - 1, 4 * best + 1)
    cheapest = min(exposed(n, c, size, delay, network) for c in every)
    assert exposed(n, best, size, delay, network) == cheapest
    assert best == min(c for c in every if exposed(n, c, size, delay, network) == cheapest)  # fewest
    if missed is not None:
        assert exposed(n, missed, size, delay, network) > cheapest


@pytest.mark.parametrize(
    ("n", "size", "delays", "network"),
    [
        (4, 25 * 2**20, [0.0] * 5 + [0.02] * 4, Network(10e-6, 25e9)),  # the median's count: 10
        (8, 16 * 2**20, [0.0, 1e-4, 3e-4, 2e-3, 2e-3, 5e-3], Network(10e-6, 50 * GIB)),
        (5, 2**20, [1e-3] * 3 + [0.0], GLOO_LIKE),
        (3, 64 * 2**20, [0.0] * 4, GLOO_LIKE),
        (9, 2**24, [0.0, 5e-3], PAPER_NETWORK),
    ],
)
def test_the_count_fastest_over_delays_is_the_cheapest_summed_over_them(
    n: int, size: int, delays: list[float], network: Network
) -> None:
    """A brute force over every count (each priced on its generated schedule at each delay and
    summed) finds nothing cheaper, nor a cheaper count among equals.  In the first setting the
    count fastest at the median delay (what the trace's replay took before) costs more in all."""
    best = best_chunks_over(n, size, delays, network)

    def total(c: int) -> float:
        return sum(exposed(n, c, size, d, network) for d in delays)

    every = range(n - 1, max(4 * best, 2 * n) + 1)
    cheapest = min(total(c) for c in every)
    assert total(best) == pytest.approx(cheapest, rel=1e-12)
    assert best == min(c for c in every if total(c) <= cheapest * (1 + 1e-12))  # the fewest of equals
    if delays == [0.0] * 5 + [0.02] * 4:  # the median lateness at the steps it was late: 20 ms
        assert total(best_chunks(n, size, 0.02, network)) > cheapest * 1.001


def test_one_delay_ranks_the_counts_as_best_chunks_does() -> None:
    """Over one delay the summed price is the estimate's own (the same float operations): the
    same pick as :func:`best_chunks` at every setting, to the last bit of each tie."""
    for n in (2, 3, 8, 17):
        for size in (4096, 3 * 2**20, GIB):
            for delay in (0.0, 1e-5, 2e-3, 0.5):
                for network in (PAPER_NETWORK, GLOO_LIKE, Network(0.0, 1e9)):
                    assert best_chunks_over(n, size, [delay], network) == best_chunks(n, size, delay, network)


def test_the_fastest_count_is_the_first_of_the_ranking() -> None:
    """best_chunks takes the cheapest without ranking the rest: the ranking's first everywhere,
    ties included (alpha 0 on 2 GPUs prices every count alike: the fewest, 1; float64's last bits
    tell apart sums equal in exact arithmetic)."""
    for n in (2, 3, 17, 64):
        for size in (4096, 3 * 2**20, GIB):
            for delay in (0.0, 2e-3):
                for network in (PAPER_NETWORK, GLOO_LIKE, Network(0.0, 1e9)):
                    for power_of_two in (False, True):
                        first = ranked_chunks(n, size, delay, network, power_of_two=power_of_two)[0]
                        assert best_chunks(n, size, delay, network, power_of_two=power_of_two) == first
    assert best_chunks(2, GIB, 0.0, Network(0.0, 1e9)) == 1


def test_counts_over_no_delay_or_a_bad_one_are_refused() -> None:
    with pytest.raises(InputError, match="one call at least"):
        best_chunks_over(8, GIB, [], PAPER_NETWORK)
    with pytest.raises(InputError, match="delay"):
        best_chunks_over(8, GIB, [0.0, float("nan")], PAPER_NETWORK)
    with pytest.raises(InputError, match="delay must be >= 0"):
        best_chunks_over(8, GIB, [-1e-3], PAPER_NETWORK)


@pytest.mark.parametrize("n", [3, 4, 8, 16])
def test_the_power_of_two_choice_is_the_cheapest_power_of_two(n: int) -> None:
    best = best_chunks(n, GIB, 5e-3, power_of_two=True)
    assert best & (best - 1) == 0 and best >= n - 1
    powers = [1 << k for k in range(14) if 1 << k >= n - 1]
    cheapest = min(exposed(n, c, GIB, 5e-3, PAPER_NETWORK) for c in powers)
    assert exposed(n, best, GIB, 5e-3, PAPER_NETWORK) == pytest.approx(cheapest, rel=1e-12)


def test_candidates_respect_the_chunk_floor_and_the_limits() -> None:
    assert chunk_candidates(8, 7 * 4096) == [7]  # 4 KiB chunks at least: nothing finer
    assert max(chunk_candidates(1024, 2**40)) <= 2**22 // 1024  # the schedules' cells
    assert max(chunk_candidates(4, 2**40)) == 4096 and chunk_candidates(4, 2**40, max_chunks=5) == [3, 4, 5]
    with pytest.raises(ValueError, match="buffer size"):
        chunk_candidates(8, 0)
    with pytest.raises(ValueError, match="delay"):
        best_chunks(8, GIB, -1.0)


@pytest.mark.parametrize(("n", "target", "paper"), [(4, 1.35, 1.13), (8, 1.55, 1.36), (16, 1.65, 1.56)])
def test_the_issue_targets_in_the_papers_setting(n: int, target: float, paper: float) -> None:
    c = best_chunks(n, GIB, 5e-3)
    comparison = compare_generated(n, GIB, 5e-3, chunks=c)
    assert comparison.speedup(f"stragglar C={c}") >= target
    assert round(comparison.speedup("stragglar"), 2) == paper


def test_cost_prints_the_chunked_row_beside_the_papers() -> None:
    result = run("cost", "--gpus", "8", "--size", "1GiB", "--delay", "5ms", "--chunks", "auto")
    assert result.exit_code == 0, result.output
    rows = {
        line.split()[0] + (" " + line.split()[1] if "C=" in line else ""): line
        for line in result.stdout.splitlines()
    }
    assert re.search(r"40 of 46 .* 1\.60x$", rows["stragglar C=38"])
    assert re.search(r"9 of 15 .* 1\.36x$", rows["stragglar"])
    assert result.stdout.splitlines()[-1] == (
        "chunks: C = 38 (auto: the model's fastest of C = 7 to 4096) against the paper's C = N-1 = 7: "
        "1.17x faster after the straggler arrives"
    )
    slower = run("cost", "--gpus", "4", "--size", "4KiB", "--chunks", "30")
    exposed = {  # the rows' exposed times in us, by their first two words
        " ".join(words[:2]): float(words[-3]) for words in map(str.split, slower.stdout.splitlines()[2:7])
    }
    ours, theirs = exposed["stragglar C=30"], exposed["stragglar 4"]
    said = re.fullmatch(
        r"chunks: C = 30 against the paper's C = N-1 = 3: ([0-9.]+)x slower after the straggler arrives",
        slower.stdout.splitlines()[-1],
    )
    assert said is not None, slower.stdout
    assert float(said[1]) == pytest.approx(ours / theirs, rel=0.01)  # the larger over the smaller
    assert ours / theirs > 5  # 31 rounds of alpha against 4
    near = run("cost", "--gpus", "2", "--chunks", "4")  # 1.004x: "1.00x slower" hid which way
    assert near.stdout.splitlines()[-1] == (
        "chunks: C = 4 against the paper's C = N-1 = 1: 0.4% slower after the straggler arrives"
    )
    paper = run("cost", "--gpus", "8", "--chunks", "7")
    assert paper.stdout.splitlines()[-1] == "chunks: C = 7, the paper's C = N-1"
    assert "stragglar C=" not in paper.stdout


def test_counts_equal_in_exact_arithmetic_are_one_price_and_the_fewest_wins() -> None:
    """At alpha 0 over 2 GPUs every count costs one buffer's time exactly (C + 0 rounds of s/C);
    float64's last bits made 49 chunks "2.2e-14% faster" than 1, and auto wrote 49 rounds for it."""
    free = Network(0.0, PAPER_NETWORK.bandwidth)
    assert best_chunks(2, 2**30, 0.0, free) == 1
    assert ranked_chunks(2, 2**30, 0.0, free)[:3] == [1, 2, 3]  # one price: fewest first
    line = run("cost", "--gpus", "2", "--size", "1GiB", "--alpha", "0", "--chunks", "auto").stdout
    assert line.splitlines()[-1].startswith("chunks: C = 1 (auto: ")
    fixed = run("cost", "--gpus", "2", "--size", "1GiB", "--alpha", "0", "--chunks", "49").stdout
    assert fixed.splitlines()[-1] == (
        "chunks: C = 49 against the paper's C = N-1 = 1: as fast after the straggler arrives"
    )


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--gpus", "8", "--size", "1GiB", "--delay", "5ms"], "(auto: the model's fastest of C = 7 to 4096)"),
        (  # 64 KiB: 40 chunks beat auto's 16, and auto keeps chunks at 4 KiB or more: said, not hidden
            ["--gpus", "8", "--size", "64KiB", "--delay", "1s", "--alpha", "0.1us", "--bandwidth", "1GB/s"],
            "(auto: the model's fastest of C = 7 to 16: no chunk under 4 KiB)",
        ),
        (["--gpus", "8", "--size", "16KiB"], "(auto: the only count it takes: more than N-1 = 7 would cut"),
    ],
)
def test_cost_says_which_counts_auto_chose_among(args: list[str], said: str) -> None:
    result = run("cost", *args, "--chunks", "auto")
    assert result.exit_code == 0, result.output
    assert said in result.stdout.splitlines()[-1]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["cost", "--gpus", "8", "--chunks", "6"], "StragglAR needs at least N - 1 = 7 chunks, got 6"),
        (["cost", "--gpus", "8", "--chunks", "many"], "expected a whole number of chunks or auto"),
        (["cost", "--gpus", "8", "--chunks", "-3"], "expected a whole number of chunks or auto"),
        (["synth", "--gpus", "8", "--chunks", "0"], "expected a whole number of chunks or auto"),
        (["synth", "--gpus", "8", "--chunks", "100000"], "100000 chunks: stragglar handles at most 65536"),
        (["synth", "--gpus", "8", "--chunks", "9" * 5000], "a number of 5000 digits is more than the 65536"),
        (["synth", "--gpus", "8", "--chunks", "\u00b2"], "expected a whole number of chunks or auto"),
        (["synth", "--gpus", "8", "--chunks", "000"], "expected a whole number of chunks or auto"),
        (["synth", "--gpus", "8", "-a", "ring", "--chunks", "9"], "--chunks does not apply"),
        (
            ["synth", "--gpus", "8", "--delay", "5ms"],
            "--delay does not apply: it is a setting for --chunks auto",
        ),
        (["synth", "--gpus", "8", "--chunks", "9", "--size", "1GiB"], "--size does not apply"),
        (
            ["synth", "--gpus", "6", "--chunks", "9", "--method", "smt"],
            "method smt finds schedules with the paper's",
        ),
    ],
)
def test_bad_chunk_requests_are_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = run(*args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1


def test_synth_auto_picks_a_power_of_two_for_executors(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    result = run(
        "synth", "--gpus", "8", "--chunks", "auto", "--delay", "5ms", "--format", "mscclpp", "-o", str(plan)
    )
    assert result.exit_code == 0, result.output
    assert "--chunks auto: C = 32," in result.stderr and "a power of two for executors" in result.stderr
    assert json.loads(plan.read_text(encoding="utf-8"))["name"] == "stragglar-n8-s7-c32"
    schedule_file = tmp_path / "s.json"
    result = run("synth", "--gpus", "8", "--chunks", "auto", "--delay", "5ms", "-o", str(schedule_file))
    assert result.exit_code == 0, result.output
    schedule = schedule_json.read(schedule_file)
    assert schedule.num_chunks == 38 and schedule.exposed_rounds == round_lower_bound(8, 38) == 40
    assert (
        "38 chunks, 40 rounds after the straggler arrives (lower bound 38 + ceil(log2 8) - 1 = 40"
        in result.stdout
    )


def test_chunked_artifacts_are_named_apart_from_the_papers() -> None:
    paper, chunked = synthesize("stragglar", 8), synthesize("stragglar", 8, chunks=32)
    assert base_name(paper) == "stragglar-n8-s7" and base_name(chunked) == "stragglar-n8-s7-c32"
    assert xml_name(chunked) == "stragglar-n8-s7-c32-simple" and xml_name(paper) == "stragglar-n8-s7-simple"
    assert plan_name(chunked, 2) == "stragglar-n8-s7-c32-x2"
    assert base_name(synthesize("ring", 8)) == "ring-n8"


def test_cost_plot_has_the_chunk_panel(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from stragglar.plot import chunk_sweep, cost_figure

    fig = cost_figure(8, GIB, 5e-3, PAPER_NETWORK, sizes=[2, 4, 8], chunks=38)
    by_chunks = fig.axes[2]
    assert by_chunks.get_xlabel() == "chunks C (log scale)"
    curve = by_chunks.get_lines()[0]
    xs = [int(x) for x in cast("list[float]", curve.get_xdata())]
    assert xs == chunk_sweep(8, 38) and xs[0] == 7
    ys = [float(y) for y in cast("list[float]", curve.get_ydata())]
    assert max(ys) == pytest.approx(ys[xs.index(38)])  # the chosen count is the curve's top
    out = tmp_path / "cost.png"
    result = run("cost", "--gpus", "8", "--delay", "5ms", "--chunks", "auto", "--plot", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_output_can_cap_the_candidates() -> None:
    assert resolve_chunks(AUTO, 100, 2**30, 0.0, PAPER_NETWORK, power_of_two=True) == 256
    assert resolve_chunks(AUTO, 100, 2**30, 0.0, PAPER_NETWORK, power_of_two=True, max_chunks=163) == 128
    assert max(chunk_candidates(8, 2**30)) == 4096 and max(chunk_candidates(8, 2**30, max_chunks=40)) == 40
    with pytest.raises(InputError, match="no power-of-two chunk count from 189 to 194 for 190 GPUs"):
        chunk_candidates(190, 2**30, power_of_two=True, max_chunks=194)


@pytest.mark.parametrize("limit", [0, 1, 6, -5])
def test_a_chunk_limit_below_n_minus_1_is_refused_not_passed_over(limit: int) -> None:
    """``best_chunks(8, ..., max_chunks=2)`` returned 7, past the limit it was given."""
    with pytest.raises(InputError, match=rf"^max_chunks must be at least N - 1 = 7, .* got {limit}$"):
        best_chunks(8, GIB, 5e-3, max_chunks=limit)


def test_every_candidate_keeps_within_the_limit() -> None:
    for limit in (7, 8, 20, 100):
        candidates = chunk_candidates(8, GIB, max_chunks=limit)
        assert max(candidates) <= limit and 7 in candidates
        assert best_chunks(8, GIB, 5e-3, max_chunks=limit) <= limit


@pytest.mark.parametrize(
    ("call", "error", "message"),
    [
        (
            lambda: resolve_chunks("x", 8, GIB, 0.0, PAPER_NETWORK),
            InputError,
            "chunks must be a chunk count, None",
        ),
        (lambda: resolve_chunks(0, 8, GIB, 0.0, None), InputError, r"^chunks must be at least 1, got 0$"),
        (
            lambda: best_chunks(2.5, GIB, 0.0),  # type: ignore[arg-type]
            ArgumentError,
            r"^num_ranks must be an integer, got 2\.5",
        ),
        (
            lambda: compare_generated(4, 1024, 0.0, algorithms="ring"),
            ArgumentError,
            r"^algorithms must be a list of names, got 'ring': pass \['ring'\]$",
        ),
    ],
)
def test_the_model_refuses_in_its_own_words(call: Any, error: type[Exception], message: str) -> None:
    """Each raised from inside: int('x'), 2.5.bit_length(), and 'ring' read as four names ('g')."""
    with pytest.raises(error, match=message):
        call()
