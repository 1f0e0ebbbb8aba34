"""torch.distributed on gloo with fork-started ranks: exact results, a real delay, a dying rank.

The DDP hook's tests are in test_ddp_hook.py."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from stragglar.measure.data import expected, payload  # noqa: E402
from stragglar.measure.launch import LaunchError, launch  # noqa: E402
from stragglar.measure.run import run_benchmark  # noqa: E402
from stragglar.synth import ALGORITHMS, synthesize  # noqa: E402
from stragglar.verify import Proof, prove  # noqa: E402

DTYPES = ("float32", "int64", "bfloat16", "float16")


def exact_rank(rank: int, n: int, schedules: list[Proof], sizes: list[int]) -> int:
    from stragglar.runtime import allreduce

    runs = 0
    for s in schedules:
        for count in sizes:
            for dtype in DTYPES:
                buf = torch.from_numpy(payload(rank, count, n, dtype)).to(getattr(torch, dtype))
                allreduce(buf, s, timeout=20, tag=runs * s.num_rounds)
                assert np.array_equal(buf.double().numpy(), expected(count, n, dtype)), (
                    s.schedule.algorithm,
                    count,
                    dtype,
                )
                runs += 1
    return runs


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
def test_gloo_results_are_exact_for_uneven_sizes(n: int) -> None:
    schedules = [prove(synthesize(a, n)) for a in ALGORITHMS if a != "rhd" or n & (n - 1) == 0]
    sizes = sorted({1, max(1, n - 2), 4 * (n - 1) + 3, 1001})
    runs = launch(exact_rank, n, (schedules, sizes), timeout=60)
    assert runs == [len(schedules) * len(sizes) * len(DTYPES)] * n


def parts_rank(rank: int, n: int, proofs: list[Proof], delay: float) -> list[tuple[float, float]]:
    """Each schedule run in parts (the rounds without the late rank, then the rest in two), with the
    late rank ``delay`` late; returns (seconds it slept, seconds the call took) per part."""
    from stragglar.runtime import allreduce, rounds_without

    slept = []
    for i, proof in enumerate(proofs):
        late = proof.schedule.straggler
        assert late is not None
        split = rounds_without(proof, late)
        middle = (split + proof.num_rounds) // 2
        buf = torch.from_numpy(payload(rank, 1001, n, "float64"))
        for part in ((0, split), (split, middle), (middle, None)):
            timeline = allreduce(buf, proof, straggler_delay=delay, timeout=20, tag=i * 100, rounds=part)
            slept.append((timeline.arrived - timeline.start, timeline.done - timeline.start))
        assert np.array_equal(buf.numpy(), expected(1001, n, "float64")), proof.schedule.algorithm
    return slept


def test_a_schedule_run_in_parts_gives_the_sum_and_the_late_rank_waits_in_its_first() -> None:
    n, delay = 5, 1.0  # margins a loaded machine keeps: the punctual ranks finish part 1 in delay / 2
    proofs = [prove(synthesize("stragglar", n)), prove(synthesize("stragglar", n, chunks=9))]
    per_rank = launch(parts_rank, n, (proofs, delay), timeout=60)
    for rank, slept in enumerate(per_rank):
        for first, second, third in zip(slept[::3], slept[1::3], slept[2::3], strict=True):
            assert third[0] < delay / 4 and first[0] < delay / 4  # nobody sleeps outside its first round
            if rank == n - 1:  # the late rank: no round without it, then it sleeps before its first
                assert second[0] >= delay * 0.95 and first[1] < delay / 4
            else:  # the punctual ranks run the first part at once, then wait for it in the second
                assert second[0] < delay / 4 and first[1] < delay / 2 and second[1] >= delay / 2


def mismatched_rounds_rank(rank: int, n: int, proof: Proof) -> str:
    from stragglar.runtime import MismatchError, allreduce

    try:
        allreduce(torch.zeros(10), proof, timeout=20, rounds=(0, None) if rank == 1 else (0, 2))
    except MismatchError as e:
        return str(e)
    return "no error"


def test_ranks_that_run_other_rounds_fail_alike_before_any_data_moves() -> None:
    errors = launch(mismatched_rounds_rank, 4, (prove(synthesize("stragglar", 4)),), timeout=60)
    words = "rounds: ranks 0, 2, 3 run rounds 0..1, rank 1 runs rounds 0..the end"
    assert set(errors) == {f"ranks disagree on the allreduce: {words}"}


def mixing_rank(rank: int, n: int, proof: Proof) -> str:
    from stragglar.runtime import allreduce

    def buffer(dtype: object) -> Any:
        return torch.from_numpy(payload(rank, 12, n, "float32")).to(dtype)  # exact in both dtypes

    for dtype in (torch.int32, torch.float32):  # both setups checked on every rank
        tensor = buffer(dtype)
        allreduce(tensor, proof, timeout=20)
        assert np.array_equal(tensor.numpy().astype(np.int64), expected(12, n, "float32"))
    tensor = buffer(torch.int32 if rank == 1 else torch.float32)  # the same bytes, another meaning
    allreduce(tensor, proof, timeout=2)
    return "summed"


def test_ranks_that_mix_two_checked_setups_time_out_and_never_sum_wrong() -> None:
    """Every rank fails, none sums: the rank that changed its setup checks alone and times out, the
    others time out in the rounds, or find the connection closed by a peer that gave up first."""
    with pytest.raises(LaunchError) as info:
        launch(mixing_rank, 3, (prove(synthesize("stragglar", 3)),), timeout=60)
    ends = [f"RankError: allreduce failed: rank {rank} " for rank in range(3)]
    reasons = [
        next((w for w in ("timed out", "lost the connection") if end + w in error), error)
        for end, error in zip(ends, (info.value.errors[r] for r in range(3)), strict=True)
    ]
    assert set(reasons) <= {"timed out", "lost the connection"} and "timed out" in reasons, reasons


def concurrent_rank(rank: int, n: int, proof: Proof, second_tag: int) -> tuple[str, str]:
    """A call that starts while another waits for the late rank: on the same tag it is refused
    before any data moves, and the first fails as it ends (on another rank the race may have gone
    the other way); on another tag both sum."""
    from stragglar.errors import InputError
    from stragglar.runtime import allreduce

    def buffer(count: int) -> Any:
        return torch.from_numpy(payload(rank, count, n, "float64"))

    allreduce(buffer(1000), proof, timeout=20)  # tag 0 checked, so the next call need not check
    first, second = buffer(1000), buffer(300)
    first_outcome: list[str] = []

    def waiting() -> None:
        try:
            allreduce(first, proof, straggler_delay=2.0, timeout=20)
            summed = np.array_equal(first.numpy(), expected(1000, n, "float64"))
            first_outcome.append("summed" if summed else "wrong")
        except InputError as e:
            first_outcome.append(str(e))

    thread = threading.Thread(target=waiting)
    thread.start()
    time.sleep(0.5)  # every rank is inside the first call, its late rank asleep (under load too)
    try:
        allreduce(second, proof, timeout=20, tag=second_tag)
        outcome = "summed" if np.array_equal(second.numpy(), expected(300, n, "float64")) else "wrong"
    except InputError as e:
        untouched = np.array_equal(second.numpy(), payload(rank, 300, n, "float64"))
        outcome = str(e) + ("" if untouched else " (and the buffer changed)")
    thread.join(30)
    return first_outcome[0] if first_outcome else "no outcome", outcome


@pytest.mark.parametrize("second_tag", [0, 1])
def test_a_call_on_a_busy_tag_is_refused_before_data_moves_and_another_tag_runs_beside(
    second_tag: int,
) -> None:
    outcomes = launch(concurrent_rank, 3, (prove(synthesize("stragglar", 3)), second_tag), timeout=60)
    if second_tag == 1:
        assert outcomes == [("summed", "summed")] * 3
    else:
        busy = "another allreduce with tag 0 is still running on this group in this process: "
        spoiled = "another allreduce started on tag 0 while this one ran: its ranks may have paired"
        for first, second in outcomes:
            assert first.startswith(spoiled) and second == busy + "concurrent calls need distinct tags"


def two_channels_rank(rank: int, n: int, proof: Proof, repeats: int) -> list[str]:
    """Two threads, each calling on its own tag with a new element count every time (so every
    call checks its header): the documented way to run calls at once on one gloo group."""
    from stragglar.runtime import allreduce

    outcomes: list[str] = []

    def calls(tag: int) -> None:
        for i in range(repeats):
            count = 50 + 7 * i + tag
            buf = torch.from_numpy(payload(rank, count, n, "float64"))
            try:
                allreduce(buf, proof, timeout=30, tag=tag)
            except Exception as e:
                outcomes.append(f"tag {tag} call {i}: {type(e).__name__}: {e}")
                return
            if not np.array_equal(buf.numpy(), expected(count, n, "float64")):
                outcomes.append(f"tag {tag} call {i}: wrong sum")

    threads = [threading.Thread(target=calls, args=(tag,)) for tag in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return outcomes


def test_calls_on_distinct_tags_run_at_once_each_checking_its_header() -> None:
    """Each channel's header gather pairs only with the same channel's: an untagged all_gather
    paired the threads' gathers across tags and blamed a correct program (18 of 40 calls)."""
    outcomes = launch(two_channels_rank, 3, (prove(synthesize("stragglar", 3)), 12), timeout=120)
    assert outcomes == [[]] * 3, outcomes


@pytest.mark.parametrize(
    ("rounds", "error", "words"),
    [
        ((3, 2), "InputError", "0 <= first <= stop <= 6"),
        ((0, 7), "InputError", "0 <= first <= stop <= 6"),
        ((7, None), "InputError", "0 <= first <= stop <= 6"),
        ([0, 2], "ArgumentError", "rounds must be a pair"),
        ((0.5, 2), "ArgumentError", "rounds\\[0\\] must be an integer"),
        ((-1, 2), "InputError", "rounds\\[0\\] must be at least 0"),
    ],
)
def test_rounds_out_of_the_schedule_are_refused(rounds: object, error: str, words: str) -> None:
    from stragglar import errors
    from stragglar.runtime import allreduce

    with pytest.raises(getattr(errors, error), match=words):
        allreduce(torch.zeros(4), prove(synthesize("stragglar", 4)), rounds=rounds)  # type: ignore[call-overload]


def delayed_rank(rank: int, n: int, s: Proof, delay: float) -> object:
    from stragglar.runtime import allreduce

    buf = torch.full((4096,), float(rank + 1))
    timeline = allreduce(buf, s, straggler_delay=delay, timeout=20)
    assert torch.all(buf == n * (n + 1) / 2)
    return timeline


def test_punctual_ranks_finish_the_hidden_phase_before_the_straggler_arrives() -> None:
    s = prove(synthesize("stragglar", 4, straggler=1))
    timelines = launch(delayed_rank, 4, (s, 0.3), timeout=60)
    late = timelines[1]
    assert late.arrived - late.start >= 0.3
    assert late.phase_done[0] is None  # the straggler has no part in phase 1
    for t in timelines:
        if t.rank != 1:
            assert t.phase_done[0] < late.arrived - 0.2  # done well before it arrived
            assert t.done > late.arrived  # and phase 2 waited for it


def dying_rank(rank: int, n: int, s: Proof) -> None:
    from stragglar.runtime import allreduce

    buf = torch.ones(100_000)
    allreduce(buf, s, timeout=10)  # every rank checks the header and runs the rounds once
    if rank == 2:
        os._exit(3)
    allreduce(buf, s, timeout=10)


def test_a_dead_rank_makes_the_others_fail_clearly_and_quickly() -> None:
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(dying_rank, 5, (prove(synthesize("stragglar", 5)),), timeout=30)
    assert time.monotonic() - start < 20, (time.monotonic() - start, str(info.value), info.value.errors)
    errors = info.value.errors
    assert errors[2] == "exited with code 3 before reporting"
    assert set(errors) == set(range(5))
    for rank in (0, 1, 3, 4):
        assert f"RankError: allreduce failed: rank {rank} " in errors[rank], errors[rank]
        failure = info.value.failures[rank]
        assert failure.reason in ("lost the connection", "timed out") and failure.round is not None
    line = str(info.value).splitlines()[0]
    assert line.startswith("5 of 5 ranks failed: rank 2 exited with code 3 before reporting; "), line
    assert " in round " in line and "(phase 'reduce-scatter')" in line and len(line) < 400, line


def unbounded_rank(rank: int, n: int, proof: Proof) -> str | None:
    from datetime import timedelta

    import torch.distributed as dist

    from stragglar.runtime import RankError, allreduce

    group = dist.new_group(timeout=timedelta(seconds=2))  # the world's stays whole for the launcher
    if rank == 1:  # alive, and never calls
        time.sleep(6)
        return None
    try:
        allreduce(torch.zeros(4), proof, group, timeout=None)
    except RankError as e:
        return str(e)
    return "no error"


def test_a_call_with_no_timeout_of_its_own_fails_at_the_group_s() -> None:
    """``timeout=None``: gloo's own timeout (the group's, 2 s here) ends the wait, in a RankError
    that says so (formatting the missing timeout raised a TypeError)."""
    said, _ = launch(unbounded_rank, 2, (prove(synthesize("stragglar", 2)),), timeout=30)
    assert said is not None and said.startswith("allreduce failed: rank 0 timed out "), said
    assert "no answer within the process group's timeout" in said, said


def test_run_benchmark_torch_checks_and_times_both() -> None:
    result = run_benchmark("torch", 3, 3 * 2**14 + 4, "float32", delay=0.02, iters=2, warmup=1, timeout=30)
    assert len(result.times) == 2 and min(result.times) >= 0.02 and min(result.baseline_times) >= 0.02
    assert result.baseline == "gloo all_reduce" and result.algbw > 0


def test_sweep_on_gloo_fits_the_ring_model_and_predicts_each_setting() -> None:
    from stragglar.measure.sweep import sweep

    # 16 MiB, not 4: on a loaded box one slow 4 KiB call outweighed a 4 MiB one and the fit failed
    result = sweep("torch", [3], [2**12, 2**24], [0.0, 0.02], iters=2)
    assert result.baseline == "gloo all_reduce"
    net = result.fits[3]
    assert net is not None and net.alpha >= 0 and net.bandwidth > 0
    assert [(s.size_bytes, s.delay) for s in result.settings] == [
        (2**12, 0.0),
        (2**12, 0.02),
        (2**24, 0.0),
        (2**24, 0.02),
    ]
    for s in result.settings:
        assert s.ratio_min <= s.ratio <= s.ratio_max and s.predicted is not None and s.predicted > 0
        assert s.time >= s.delay and s.baseline_time >= s.delay
    assert result.table().startswith("gloo all_reduce fit, N=3: alpha ")


def failing_post_rank(rank: int, n: int, proof: Proof) -> None:
    """Rank 0's first send of data to rank 1 fails as gloo's does to a dead peer (at posting)."""
    import torch.distributed as dist

    from stragglar.runtime import allreduce

    real = dist.isend

    def isend(tensor: Any, dst: int, *args: Any, **kwargs: Any) -> Any:
        if rank == 0 and dst == 1 and tensor.dtype == torch.float32:  # data, not the header's int64
            raise RuntimeError("[gloo/transport/tcp/pair.cc:598] Connection closed by peer [127.0.0.1]:4242")
        return real(tensor, dst, *args, **kwargs)

    setattr(dist, "isend", isend)  # noqa: B010 - a rank of its own: nothing else sees it
    allreduce(torch.arange(6, dtype=torch.float32), proof, timeout=3)


def test_a_send_that_fails_as_it_is_posted_names_its_peer() -> None:
    """gloo refuses a send to a dead peer as it is posted; the error named no peer."""
    with pytest.raises(LaunchError) as info:
        launch(failing_post_rank, 3, (prove(synthesize("stragglar", 3)),), timeout=30)
    failure = info.value.failures[0]
    assert (failure.reason, failure.peer, failure.waiting) == ("lost the connection", 1, "sending to"), (
        failure
    )
    assert "rank 0 lost the connection in round 0 (phase 'reduce-scatter') sending to rank 1" in str(
        info.value
    )


@pytest.mark.parametrize("backend_channel, refused", [(None, True), (0, False)])
def test_a_cpu_tensor_is_a_problem_of_its_rank_on_nccl_only(
    backend_channel: int | None, refused: bool
) -> None:
    """On NCCL (one channel: ``channel`` is None) a CPU tensor cannot travel: its rank says so in
    its header (peers learn it in the header check, not by their timeout in round 0); on gloo
    it travels."""
    from types import SimpleNamespace

    from stragglar.errors import ArgumentError
    from stragglar.runtime.header import Problem, inspect_call
    from stragglar.runtime.torch_dist import TorchEngine

    engine: Any = SimpleNamespace(channel=lambda tag: backend_channel)  # only its channel is asked
    proof = prove(synthesize("stragglar", 4))
    flat, header, problem = inspect_call(
        torch.arange(8, dtype=torch.float32),
        proof,
        0,
        3,
        (0, None),
        lambda f: TorchEngine.sendable(engine, f),
    )
    if refused:
        assert flat is None and header.problem == Problem.UNSENDABLE
        assert isinstance(problem, ArgumentError) and "CPU tensor on an NCCL process group" in str(problem)
    else:
        assert flat is not None and header.problem == 0 and problem is None
