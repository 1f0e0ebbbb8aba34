"""The local executor runs every algorithm exactly, for any rank count, size and dtype."""

from __future__ import annotations

import copy
import dataclasses
import functools
import pickle
import types
from typing import Any

import numpy as np
import pytest

from stragglar.errors import ArgumentError, InputError
from stragglar.measure import data
from stragglar.measure.data import WrongResult, check_result, expected, payload
from stragglar.measure.run import run_benchmark
from stragglar.runtime import Layout, allreduce, allreduce_local, plan_for, rounds_without
from stragglar.runtime.plans import late_rank_for
from stragglar.runtime.program import compile_schedule
from stragglar.schedule import Op, Phase, Schedule, Transfer
from stragglar.synth import ALGORITHMS, synthesize
from stragglar.verify import Proof, prove

NUMPY_DTYPES = ("float16", "float32", "float64", "int32", "int64")
CASES = [(a, n) for a in ALGORITHMS for n in range(2, 17) if a != "rhd" or n & (n - 1) == 0]


@functools.cache
def schedule(algorithm: str, n: int) -> Proof:
    return prove(synthesize(algorithm, n))


def counts(n: int) -> list[int]:
    """Empty, smaller than the chunk count, one per chunk, uneven, and a larger uneven size."""
    return sorted({0, 1, max(1, n - 2), n - 1, 3 * (n - 1) + 1, 1000 + n})


def run_exact(s: Proof, count: int, dtype: str) -> None:
    n = s.num_ranks
    bufs = [payload(r, count, n, dtype).astype(dtype) for r in range(n)]
    allreduce_local(bufs, s)
    want = expected(count, n, dtype)
    for r, b in enumerate(bufs):
        assert np.array_equal(b.astype(np.float64), want), (s.schedule.algorithm, n, count, dtype, r)


@pytest.mark.parametrize(("algorithm", "n"), CASES)
def test_every_algorithm_size_and_dtype_is_exact(algorithm: str, n: int) -> None:
    for count in counts(n):
        for dtype in NUMPY_DTYPES:
            run_exact(schedule(algorithm, n), count, dtype)


@pytest.mark.parametrize("n", [2, 3, 5, 8, 16])
def test_bfloat16_through_torch_tensors(n: int) -> None:
    torch = pytest.importorskip("torch")
    for count in counts(n):
        bufs = [torch.from_numpy(payload(r, count, n, "bfloat16")).to(torch.bfloat16) for r in range(n)]
        allreduce_local(bufs, schedule("stragglar", n))
        for b in bufs:
            assert np.array_equal(b.double().numpy(), expected(count, n, "bfloat16"))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64", "int32", "int64"])
@pytest.mark.parametrize(("n", "chunks", "count"), [(4, 12, 997), (5, 24, 997), (8, 64, 997), (8, 64, 40)])
def test_torch_messages_of_several_pieces_pack_and_land_in_fused_calls_bit_for_bit(
    monkeypatch: pytest.MonkeyPatch, dtype: str, n: int, chunks: int, count: int
) -> None:
    """A message of several chunks is packed with one ``cat`` and its sums land with one
    ``_foreach_add_`` (a kernel or so on a GPU instead of one per chunk), the same bits as NumPy's
    slice by slice (torch's own slice by slice for bfloat16, which NumPy lacks; random values: any
    change in what is added to what shows)."""
    torch = pytest.importorskip("torch")
    from stragglar.runtime import interpreter

    proof = prove(synthesize("stragglar", n, chunks=chunks))
    rng = np.random.default_rng(n)
    data = [rng.standard_normal(count) * 1000 for _ in range(n)]  # 40: some chunks are empty
    tensors = [torch.tensor(d).to(getattr(torch, dtype)) for d in data]
    if dtype == "bfloat16":  # the slice-by-slice loop, on torch tensors
        reference = [t.clone() for t in tensors]
        with monkeypatch.context() as patch:
            patch.setattr(interpreter, "library_of", lambda value: "numpy")
            allreduce_local(reference, proof)
    else:
        reference = [t.numpy().copy() for t in tensors]
        allreduce_local(reference, proof)
    calls = {"cat": 0, "_foreach_add_": 0}
    for name in calls:
        real = getattr(torch, name)

        def counted(*args: object, real: Any = real, name: str = name, **kwargs: object) -> Any:
            calls[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(torch, name, counted)
    allreduce_local(tensors, proof)
    assert calls["cat"] > 0 and calls["_foreach_add_"] > 0, calls
    got = [t.view(torch.int16).numpy() if dtype == "bfloat16" else t.numpy() for t in tensors]
    want = [r.view(torch.int16).numpy() if dtype == "bfloat16" else r for r in reference]
    assert all(g.tobytes() == w.tobytes() for g, w in zip(got, want, strict=True))


def test_multidimensional_buffers_are_reduced_in_place() -> None:
    bufs = [np.arange(24, dtype=np.int64).reshape(2, 3, 4) * (r + 1) for r in range(5)]
    allreduce_local(bufs, schedule("stragglar", 5))
    assert all(np.array_equal(b, np.arange(24).reshape(2, 3, 4) * 15) for b in bufs)


def test_host_scratch_is_reused_per_thread_and_dtype_and_device_scratch_is_not(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import threading

    from stragglar.runtime import arrays
    from stragglar.runtime.arrays import scratch_for

    monkeypatch.setattr(arrays, "_host_scratch", threading.local())  # empty: earlier tests' calls fill it
    a = scratch_for(np.zeros(4, np.float32), 100)
    b = scratch_for(np.zeros(4, np.float32), 60)
    assert b.base is a.base and a.shape == (100,) and b.shape == (60,)
    assert scratch_for(np.zeros(4, np.float64), 60).base is not a.base
    assert scratch_for(np.zeros(4, np.float32), 200).base is not a.base  # grows when too small
    elsewhere: list[np.ndarray] = []
    thread = threading.Thread(target=lambda: elsewhere.append(scratch_for(np.zeros(4, np.float32), 60)))
    thread.start()
    thread.join()
    assert elsewhere[0].base is not scratch_for(np.zeros(4, np.float32), 60).base

    made: list[int] = []

    class DeviceArray:  # like a CUDA tensor: its pool caches, so we allocate every time
        device = types.SimpleNamespace(type="cuda")

        def new_empty(self, size: int) -> np.ndarray:
            made.append(size)
            return np.empty(size, np.float32)

    scratch_for(DeviceArray(), 10)
    scratch_for(DeviceArray(), 10)
    assert made == [10, 10]


def test_payload_differs_per_rank_and_element() -> None:
    a, b = payload(0, 100, 8, "float32"), payload(1, 100, 8, "float32")
    assert len(set(a.tolist())) > 90 and np.all(a != b)


def test_blockwise_check_counts_every_wrong_element_and_names_the_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(data, "CHECK_BLOCK", 7)  # the faults below sit in different blocks
    want = expected(50, 4, "float32")
    check_result(want.astype(np.float32), want, 2, "demo")
    got = want.astype(np.float32)
    got[[9, 30, 49]] += 1
    with pytest.raises(WrongResult, match=r"demo: rank 2 .* at 3 of 50 elements \(first: element 9 is"):
        check_result(got, want, 2, "demo")


@pytest.mark.parametrize(("count", "chunks"), [(0, 3), (2, 5), (10, 3), (12, 4), (1001, 7)])
def test_layout_covers_every_element_once(count: int, chunks: int) -> None:
    layout = Layout.even(count, chunks)
    covered = np.zeros(count, np.int64)
    for start, stop in layout.bounds:
        covered[start:stop] += 1
    assert np.all(covered == 1)
    assert max(layout.sizes) - min(layout.sizes) <= 1
    assert list(layout.sizes) == sorted(layout.sizes, reverse=True)


@pytest.mark.parametrize(
    ("count", "chunks", "error", "message"),
    [
        ("5", 3, ArgumentError, "count must be an integer"),
        (5, 2.0, ArgumentError, "num_chunks must be an integer"),
        (-1, 3, InputError, "count must be at least 0"),
        (5, 0, InputError, "num_chunks must be at least 1"),
        (5, 10**9, InputError, "in 1,000,000,000 chunks: at most 65,536"),
    ],
)
def test_a_layout_of_counts_that_are_none_is_refused_before_it_is_made(
    count: Any, chunks: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        Layout.even(count, chunks)


@pytest.mark.parametrize(("algorithm", "n"), CASES)
def test_program_respects_synchronous_rounds(algorithm: str, n: int) -> None:
    """No chunk is written in place while the same rank sends it, reduces never land in place,
    and sends and receives pair up with equal sizes and tags."""
    s = schedule(algorithm, n)
    for rank in range(n):
        for step in plan_for(s, rank, 3 * (n - 1) + 1).steps:
            sent = [m.direct or (0, 0) for m in step.sends] + [
                (a, b) for m in step.sends for a, b, _ in m.pieces
            ]
            for m in step.recvs:
                if m.direct is not None:
                    assert not any(reduce for _, _, reduce in m.pieces)
                    assert all(b <= m.direct[0] or a >= m.direct[1] for a, b in sent if a < b)
    plans = [plan_for(s, r, 1000) for r in range(n)]
    sends = {(p.rank, m.peer, m.tag, m.size) for p in plans for st in p.steps for m in st.sends}
    recvs = {(m.peer, p.rank, m.tag, m.size) for p in plans for st in p.steps for m in st.recvs}
    assert sends == recvs


def test_transfers_between_two_ranks_in_a_round_form_one_message() -> None:
    s = schedule("direct", 5)
    exchange = compile_schedule(s.schedule)[4].steps[0]
    assert [(m.peer, m.chunks) for m in exchange.sends] == [(0, (0, 1, 2, 3))]
    assert exchange.recvs[0].reduce == (True,) * 4 and not exchange.recvs[0].in_place


def test_clear_errors_for_bad_buffers_and_schedules() -> None:
    s = schedule("stragglar", 3)
    with pytest.raises(ArgumentError, match="supported dtypes"):  # an InputError too: exit 2
        allreduce_local([np.zeros(4, np.complex64)] * 3, s)
    with pytest.raises(TypeError, match="supported dtypes"):
        allreduce_local([np.zeros(4, np.uint8)] * 3, s)
    # a supported dtype in the other byte order is named as such, with the way out
    swapped = np.dtype(np.float32).newbyteorder("S")
    way_out = r"float32 in the other byte order: pass array\.astype\('float32'\)"
    with pytest.raises(ArgumentError, match=way_out):
        allreduce_local([np.zeros(4, swapped) for _ in range(3)], s)
    with pytest.raises(
        ValueError, match=r"^allreduce needs rank 0's buffer contiguous \(results are written"
    ):
        allreduce_local([np.zeros((4, 4))[:, 1] for _ in range(3)], s)
    with pytest.raises(
        InputError, match=r"^allreduce needs rank 2's buffer contiguous \(results are written"
    ):
        allreduce_local([np.zeros(4), np.zeros(4), np.zeros((4, 4))[:, 1]], s)
    with pytest.raises(ValueError, match="same buffer size"):
        allreduce_local([np.zeros(4), np.zeros(4), np.zeros(5)], s)
    with pytest.raises(ValueError, match="3 ranks, got 2"):
        allreduce_local([np.zeros(4), np.zeros(4)], s)
    with pytest.raises(TypeError, match="cannot allreduce a ndarray"):
        allreduce(np.zeros(4), s)
    wrong = Schedule("wrong", 2, 1, None, (Phase("p", (0, 1), ((Transfer(0, 1, 0, Op.COPY),),)),))
    for unproved in (wrong, synthesize("ring", 2)):  # only a Proof runs, never a bare schedule
        with pytest.raises(TypeError, match="prove the schedule first"):
            allreduce_local([np.zeros(4), np.zeros(4)], unproved)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="comes only from a prover"):
        Proof(wrong, "simulator", 0.0)


def test_a_proof_given_another_schedule_is_no_proof() -> None:
    """``dataclasses.replace(proof, schedule=s)`` passed the seal on with every other field, and the
    runtime summed with ``s`` unproved: every rank of Ring without its last round held its own
    chunks only.  A seal names the schedule it was issued for now; copies and pickles stay proofs."""
    ring = synthesize("ring", 4)
    cut = dataclasses.replace(
        ring, phases=(dataclasses.replace(ring.phases[0], rounds=ring.phases[0].rounds[:-1]),)
    )
    proof = prove(synthesize("stragglar", 4))
    with pytest.raises(ArgumentError, match="comes only from a prover"):
        dataclasses.replace(proof, schedule=cut)
    changed = prove(synthesize("stragglar", 4))
    changed.__dict__["schedule"] = cut  # or object.__setattr__: the seal still names the proved one
    with pytest.raises(ArgumentError, match="not the one a prover showed correct"):
        allreduce_local([payload(r, 8, 4, "int64") for r in range(4)], changed)
    for same in (copy.copy(proof), copy.deepcopy(proof), pickle.loads(pickle.dumps(proof))):
        buffers = [payload(r, 8, 4, "int64") for r in range(4)]
        allreduce_local(buffers, same)
        assert all(np.array_equal(b, expected(8, 4, "int64")) for b in buffers)


def test_a_schedule_built_of_lists_cannot_change_after_its_proof() -> None:
    """Schedule and Phase kept the lists they were given: a round appended after the proof ran
    (3, 3 became 3, 6), and the proved schedule could not be hashed."""
    rounds = [[Transfer(0, 1, 0, Op.REDUCE), Transfer(1, 0, 0, Op.REDUCE)]]
    ranks = [0, 1]
    phases = [Phase("x", ranks, rounds)]  # type: ignore[arg-type]
    proof = prove(Schedule("hand", 2, 1, None, phases))  # type: ignore[arg-type]
    rounds.append([Transfer(0, 1, 0, Op.REDUCE)])
    rounds[0].pop()
    ranks.append(2)
    phases.clear()
    buffers = [payload(r, 8, 2, "int64") for r in range(2)]
    allreduce_local(buffers, proof)
    assert all(np.array_equal(b, expected(8, 2, "int64")) for b in buffers)
    assert isinstance(hash(proof.schedule), int)
    with pytest.raises(ArgumentError, match="rounds must be a sequence, got int"):
        Phase("x", (0, 1), 5)  # type: ignore[arg-type]


def test_buffers_that_share_memory_or_are_read_only_are_refused_before_any_data_moves() -> None:
    s = schedule("stragglar", 3)
    whole = np.concatenate([payload(r, 8, 3, "int64") for r in range(3)])
    apart = [whole[0:8], whole[8:16], whole[16:24]]  # views of one array, each its own memory
    allreduce_local(apart, s)
    assert all(np.array_equal(b, expected(8, 3, "int64")) for b in apart)
    own = payload(0, 8, 3, "int64")
    cases = {
        "the same array three times": [own, own, own],
        "overlapping views": [whole[0:8], whole[4:12], whole[16:24]],
        "one view inside another's": [whole[0:24:1][0:8], whole[8:16], whole[10:18]],
    }
    for what, bufs in cases.items():
        before = [b.copy() for b in bufs]
        with pytest.raises(InputError, match=r"the buffers of ranks \d and \d overlap"):
            allreduce_local(bufs, s)
        assert all(np.array_equal(b, a) for b, a in zip(bufs, before, strict=True)), what
    frozen = [payload(r, 8, 3, "int64") for r in range(3)]
    frozen[2].flags.writeable = False
    with pytest.raises(InputError, match="rank 2's buffer is read-only"):
        allreduce_local(frozen, s)
    assert all(np.array_equal(b, payload(r, 8, 3, "int64")) for r, b in enumerate(frozen))


def test_torch_buffers_that_share_memory_are_refused() -> None:
    torch = pytest.importorskip("torch")
    whole = torch.zeros(24, dtype=torch.float64)
    with pytest.raises(InputError, match="the buffers of ranks 1 and 2 overlap"):
        allreduce_local([whole[0:8], whole[8:16], whole[12:20]], schedule("stragglar", 3))


def test_what_is_not_one_array_per_rank_is_refused_before_any_data_moves() -> None:
    """A list, a generator, one 2-D array, NumPy scalars, meta tensors, NumPy mixed with torch (or
    CuPy) gave raw AttributeError, TypeError or ValueError, or a meta "sum" that did nothing; a
    masked array was summed through its mask; a tensor that requires grad raised torch's own
    RuntimeError after the ranks before it were written."""
    torch = pytest.importorskip("torch")
    s = schedule("stragglar", 2)
    host = np.ones(4, dtype=np.float32)
    for buffers, error, message in [
        (
            [[1.0, 2.0], [3.0, 4.0]],
            ArgumentError,
            "allreduce_local sums NumPy, CuPy or torch arrays, got list",
        ),
        (
            [np.float32(1), np.float32(2)],
            ArgumentError,
            "allreduce_local sums NumPy, CuPy or torch arrays, got float32",
        ),
        (
            np.zeros((2, 4), np.float32),
            ArgumentError,
            "allreduce_local takes a list of arrays, one per rank, got ndarray",
        ),
        (
            (b for b in [host, host]),
            ArgumentError,
            "allreduce_local takes a list of arrays, one per rank, got generator",
        ),
        ([torch.zeros(4, device="meta")] * 2, InputError, "allreduce_local needs data to sum: a meta tensor"),
        (
            [host.copy(), np.ma.masked_array(host.copy(), mask=[False, True, False, False])],
            InputError,
            "allreduce_local cannot honour a mask: pass the array's data",
        ),
        (
            [torch.ones(4), torch.ones(4, requires_grad=True)],
            InputError,
            "rank 1's buffer: allreduce writes in place: pass a buffer that does not require grad",
        ),
        (  # torch raised "Cannot access storage of SparseTensorImpl" from deep inside
            [torch.ones(4), torch.ones(4).to_sparse()],
            InputError,
            "rank 1's buffer: allreduce writes a dense tensor in place, got a sparse_coo one: pass "
            "tensor.to_dense()",
        ),
        (
            [host, torch.ones(4)],
            InputError,
            "allreduce_local needs every rank's array in one place, got numpy on the host and torch on cpu",
        ),
    ]:
        with pytest.raises(error) as info:
            allreduce_local(buffers, s)  # type: ignore[arg-type]
        assert str(info.value).startswith(message) and "\n" not in str(info.value)
    assert np.array_equal(host, np.ones(4))


def test_a_0d_array_is_a_buffer_of_one_element() -> None:
    """Kept: a 0-d array is summed in place like any one-element buffer."""
    bufs = [np.array(float(r + 1)) for r in range(4)]
    allreduce_local(bufs, schedule("stragglar", 4))
    assert [float(b) for b in bufs] == [10.0] * 4 and all(b.shape == () for b in bufs)


def test_straggler_delay_hides_the_first_phase() -> None:
    s = schedule("stragglar", 4)
    bufs = [np.ones(1 << 12) for _ in range(4)]
    timelines = allreduce_local(bufs, s, straggler_delay=0.05)
    late = timelines[3]
    assert late.arrived - late.start >= 0.05
    for t in timelines[:3]:
        hidden_done = t.phase_done[0]
        assert hidden_done is not None and hidden_done < late.arrived
    assert all(np.all(b == 4) for b in bufs)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_entry_point_waits_for_the_schedules_late_rank_unless_told_another(algorithm: str) -> None:
    s = schedule(algorithm, 4)
    late_rank = s.schedule.late_rank
    assert late_rank == (3 if s.schedule.straggler is None else s.schedule.straggler)
    assert {p.late_rank for p in compile_schedule(s.schedule)} == {late_rank}
    assert late_rank_for(s.schedule) == late_rank and late_rank_for(s.schedule, np.int8(1)) == 1
    with pytest.raises(ValueError, match=r"^late_rank must be a rank in 0\.\.5, got 6$"):
        late_rank_for(s.schedule, 6, size=6)
    assert rounds_without(s) == rounds_without(s, late_rank)
    for told, expected_late in ((None, late_rank), (1, 1)):
        timelines = allreduce_local([np.ones(64) for _ in range(4)], s, 0.02, late_rank=told)
        assert [t.rank for t in timelines if t.arrived - t.start >= 0.02] == [expected_late]


def test_run_benchmark_local_reports_checked_figures() -> None:
    result = run_benchmark("local", 5, 3 * 2**16 + 4, "int32", delay=0.01, iters=2, warmup=0)
    assert result.count == (3 * 2**16 + 4) // 4 and len(result.times) == 2 == len(result.baseline_times)
    assert min(result.times) >= 0.01 and min(result.baseline_times) >= 0.01
    assert all(h < 0.01 for h in result.hidden)
    assert "speed-up" in result.report() and result.algbw > 0
    with pytest.raises(ValueError, match="cannot hold bfloat16"):
        run_benchmark("local", 3, 64, "bfloat16", iters=1)
    with pytest.raises(ValueError, match="unknown backend"):
        run_benchmark("mpi", 3, 64)


def test_sweep_table_says_when_the_ring_fit_failed() -> None:
    from stragglar.measure.sweep import Setting, SweepResult, fit_ring

    assert fit_ring(4, [(2**20, 0.5), (2**24, 0.1)]) is None  # faster when bigger: no network
    assert fit_ring(4, [(2**20, 0.5)]) is None
    # times that barely grew: 2e19 B/s, past what the model prices (the Network raised InputError)
    assert fit_ring(4, [(2**20, 1e-3), (2**24, 1e-3 + 1e-12)]) is None
    row = Setting(4, 2**20, 0.05, 0.08, 0.1, 1.25, 1.1, 1.4, None)
    table = SweepResult(
        "torch", "stragglar", "gloo all_reduce", "float32", 3, (row,), {4: None}, "2026-11-22", "x86_64"
    ).table()
    assert table.splitlines()[0] == (
        "gloo all_reduce fit, N=4: none (its times did not grow with the size: measure sizes further apart)"
    )
    assert table.splitlines()[-1] == "| 4 | 1 MiB | 50 | 80.0 | 100.0 | 1.25x | 1.25x [1.10-1.40] | - |"
    assert "ratio of the medians" in table and "per-iteration ratio: median [min-max]" in table


def test_the_late_ranks_wait_is_no_system_call_once_its_time_has_passed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A zero sleep still costs a system call (tens of microseconds here), once per call of the
    loopback: sleep_until sleeps only for time that is left."""
    import time

    from stragglar.runtime.clock import sleep_until

    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    sleep_until(time.perf_counter() - 1.0)
    assert slept == []
    sleep_until(time.perf_counter() + 0.5)
    assert len(slept) == 1 and 0.4 < slept[0] <= 0.5


def test_poll_refuses_a_nan_timeout_that_no_wait_ever_passes() -> None:
    """``waited > nan`` is never true: poll looked forever (here: until ready's 1000th look)."""
    from stragglar.runtime import poll

    looks: list[None] = []

    def never() -> bool:
        looks.append(None)
        if len(looks) > 1000:
            raise RuntimeError("poll looked 1000 times at a wait with a NaN timeout")
        return False

    with pytest.raises(InputError, match=r"^timeout must be a number of seconds or None, got nan$"):
        poll(never, float("nan"))
    assert looks == []
    assert poll(never, -1.0) is False and looks == [None]  # a deadline passed: one look
    assert poll(lambda: True, None)


def test_a_tensor_over_read_only_memory_is_refused_not_written(tmp_path: Any) -> None:
    """torch.from_numpy over a read-only np.memmap keeps no NumPy flags: the sum written into it
    killed the process (SIGSEGV).  The same buffer in writable memory sums."""
    torch = pytest.importorskip("torch")
    path = tmp_path / "values.bin"
    np.arange(24, dtype=np.float32).tofile(path)
    proof = prove(synthesize("stragglar", 3))
    with pytest.warns(UserWarning, match="not writable"):  # torch's own word, which is all it says
        mapped = [torch.from_numpy(np.memmap(path, dtype=np.float32, mode="r")) for _ in range(3)]
    with pytest.raises(InputError, match=r"rank 0's buffer: .*memory is read-only"):
        allreduce_local(mapped, proof)
    assert [b.tolist() for b in mapped] == [list(range(24))] * 3
    writable = [torch.from_numpy(np.memmap(path, dtype=np.float32, mode="c")) for _ in range(3)]
    allreduce_local(writable, proof)
    assert writable[1].tolist() == [3.0 * x for x in range(24)]


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
def test_a_numpy_subclass_sums_in_place() -> None:
    """np.matrix stays 2-D when flattened: the rounds' slices failed with a traceback."""
    bufs = [np.matrix(np.arange(6, dtype=np.int64).reshape(2, 3) * (r + 1)) for r in range(3)]
    allreduce_local(bufs, prove(synthesize("stragglar", 3)))
    assert all(b.tolist() == [[0, 6, 12], [18, 24, 30]] and type(b) is np.matrix for b in bufs)
