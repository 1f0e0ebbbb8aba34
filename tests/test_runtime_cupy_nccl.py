"""The CuPy/NCCL transport against a fake NCCL over NumPy memory (raw pointers, counts, groups)."""

from __future__ import annotations

import ctypes
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from stragglar.errors import InputError
from stragglar.measure.data import expected, payload
from stragglar.runtime import MismatchError, NcclGroup, RankError, allreduce
from stragglar.synth import synthesize
from stragglar.verify import Proof, prove

ITEMSIZE = {2: 4, 4: 8, 6: 2, 7: 4, 8: 8}


class FakeNccl:
    """``cupy.cuda.nccl`` for N ranks in threads: ops queue inside groupStart/groupEnd and run at
    groupEnd; a receive nobody sends leaves the stream stuck, as a real NCCL kernel would hang."""

    NCCL_INT32, NCCL_INT64, NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64 = 2, 4, 6, 7, 8
    patience = 0.5  # seconds an operation waits for its peers before its stream is stuck
    version = 22803  # NCCL 2.28.3, as get_version() encodes it

    def get_version(self) -> int:
        return self.version

    def __init__(self, n: int) -> None:
        self.n = n
        self.wires = {(a, b): queue.Queue[tuple[int, bytes]]() for a in range(n) for b in range(n)}
        self.state = threading.local()
        self.groups = [0] * n
        self.gathers = [0] * n  # allGather calls per rank
        self.arrived = threading.Condition()
        self.contributions: dict[int, dict[int, bytes]] = {}  # call number -> rank -> bytes

    def all_gather(self, comm: FakeComm, ptr: int, recv: int, count: int, dtype: int) -> None:
        """Every rank's ``count`` elements, in rank order; a rank that never joins leaves the
        others' streams stuck, as a real collective kernel would hang."""
        if comm.stream.stuck:
            return
        call = self.gathers[comm.rank]
        self.gathers[comm.rank] += 1
        size = count * ITEMSIZE[dtype]
        with self.arrived:
            self.contributions.setdefault(call, {})[comm.rank] = ctypes.string_at(ptr, size)
            self.arrived.notify_all()
            if not self.arrived.wait_for(lambda: len(self.contributions[call]) == self.n, self.patience):
                comm.stream.stuck = True
                return
            parts = self.contributions[call]
            assert {len(p) for p in parts.values()} == {size}, "allGather count mismatch"
            data = b"".join(parts[r] for r in range(self.n))
        ctypes.memmove(recv, data, len(data))

    def groupStart(self) -> None:
        self.state.ops = []

    def groupEnd(self) -> None:
        ops, self.state.ops = self.state.ops, None
        comm = ops[0][1] if ops else None
        if comm is None or comm.stream.stuck:
            return
        self.groups[comm.rank] += 1
        for kind, c, ptr, count, dtype, peer in ops:
            if kind == "send":
                self.wires[(c.rank, peer)].put((dtype, ctypes.string_at(ptr, count * ITEMSIZE[dtype])))
        for kind, c, ptr, count, dtype, peer in ops:
            if kind == "recv":
                try:
                    got_dtype, data = self.wires[(peer, c.rank)].get(timeout=self.patience)
                except queue.Empty:
                    c.stream.stuck = True
                    return
                assert got_dtype == dtype and len(data) == count * ITEMSIZE[dtype], "send/recv mismatch"
                ctypes.memmove(ptr, data, len(data))


class FakeStream:
    ptr = 0

    def __init__(self) -> None:
        self.stuck = False

    @property
    def done(self) -> bool:
        return not self.stuck

    def __enter__(self) -> FakeStream:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class FakeComm:
    def __init__(self, nccl: FakeNccl, rank: int, n: int, stream: FakeStream) -> None:
        self.nccl, self.rank, self.n, self.stream = nccl, rank, n, stream
        self.aborted = False

    def rank_id(self) -> int:
        return self.rank

    def size(self) -> int:
        return self.n

    def send(self, ptr: int, count: int, dtype: int, peer: int, stream: int) -> None:
        self._queue("send", ptr, count, dtype, peer)

    def recv(self, ptr: int, count: int, dtype: int, peer: int, stream: int) -> None:
        self._queue("recv", ptr, count, dtype, peer)

    def _queue(self, kind: str, ptr: int, count: int, dtype: int, peer: int) -> None:
        assert getattr(self.nccl.state, "ops", None) is not None, "NCCL p2p call outside a group"
        assert 0 <= peer < self.n and peer != self.rank and count > 0
        self.nccl.state.ops.append((kind, self, ptr, count, dtype, peer))

    def allGather(self, sendbuf: int, recvbuf: int, count: int, datatype: int, stream: int) -> None:
        self.nccl.all_gather(self, sendbuf, recvbuf, count, datatype)

    def check_async_error(self) -> None:
        return None

    def abort(self) -> None:
        self.aborted = True


def nccl_groups(
    n: int, fake: type[FakeNccl] = FakeNccl, stream: Callable[[], Any] = FakeStream
) -> tuple[FakeNccl, list[NcclGroup]]:
    """A fake NCCL of ``n`` ranks and each rank's group on it, on a ``stream()`` of its own."""
    nccl = fake(n)
    return nccl, [
        NcclGroup(FakeComm(nccl, r, n, s), nccl, s) for r, s in enumerate(stream() for _ in range(n))
    ]


def run_ranks(
    n: int, body: Any, fake: type[FakeNccl] = FakeNccl, stream: Callable[[], Any] = FakeStream
) -> list[Any]:
    """Run ``body(rank, group)`` in n threads, each rank's group on a ``stream()`` of its own;
    return results or raised exceptions, the fake NCCL and the groups."""
    nccl, groups = nccl_groups(n, fake, stream)
    out: list[Any] = [None] * n

    def target(r: int) -> None:
        try:
            out[r] = body(r, groups[r])
        except Exception as e:
            out[r] = e

    threads = [threading.Thread(target=target, args=(r,)) for r in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return [*out, nccl, groups]


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("algorithm", ["stragglar", "direct", "ring"])
def test_fake_nccl_results_are_exact(n: int, algorithm: str) -> None:
    s = prove(synthesize(algorithm, n))
    for count in (1, max(1, n - 2), 5 * (n - 1) + 2):
        for dtype in ("float16", "float32", "float64", "int32", "int64"):
            bufs = [payload(r, count, n, dtype).astype(dtype) for r in range(n)]
            *results, nccl, _ = run_ranks(
                n, lambda r, g, bufs=bufs: allreduce(bufs[r], s, group=g, timeout=5)
            )
            assert not [x for x in results if isinstance(x, Exception)], results
            for b in bufs:
                assert np.array_equal(b.astype(np.float64), expected(count, n, dtype))
    # one NCCL group per round the rank takes part in
    steps = [
        sum(1 for st in s.schedule.phases for rnd in st.rounds if any(r in (t.src, t.dst) for t in rnd))
        for r in range(n)
    ]
    assert nccl.groups == steps


def test_missing_rank_times_out_and_aborts() -> None:
    s = prove(synthesize("stragglar", 4))

    def body(rank: int, group: NcclGroup) -> Any:
        if rank == 3:
            return None  # never arrives
        return allreduce(np.ones(64, np.float32), s, group=group, timeout=1.0)

    start = time.monotonic()
    *results, _, groups = run_ranks(4, body)
    assert time.monotonic() - start < 10
    for rank in range(3):
        error = results[rank]
        assert isinstance(error, RankError) and error.reason == "timed out", error
        assert error.what == "timed out checking that every rank runs the same allreduce"
        assert groups[rank].comm.aborted


def test_a_rank_that_stops_in_the_rounds_names_the_round() -> None:
    s = prove(synthesize("stragglar", 4))

    def body(rank: int, group: NcclGroup) -> Any:
        allreduce(np.ones(64, np.float32), s, group=group, timeout=1.0)  # header checked, cached
        if rank == 3:
            return None  # leaves before the second call's rounds
        return allreduce(np.ones(64, np.float32), s, group=group, timeout=1.0)

    *results, _, _ = run_ranks(4, body)
    for rank in range(3):
        error = results[rank]
        assert isinstance(error, RankError) and error.reason == "timed out" and error.round is not None
        assert str(error).startswith(f"allreduce failed: rank {rank} timed out in round ")


class NoHalfNccl(FakeNccl):
    """An NCCL build without float16."""

    @property
    def NCCL_FLOAT16(self) -> int:  # type: ignore[override]
        raise AttributeError("NCCL_FLOAT16")


def test_a_dtype_the_nccl_build_lacks_fails_every_rank_clearly() -> None:
    s = prove(synthesize("ring", 2))
    both = run_ranks(2, lambda r, g: allreduce(np.ones(4, np.float16), s, group=g, timeout=5), NoHalfNccl)
    assert all(isinstance(e, TypeError) and "no float16" in str(e) for e in both[:2]), both
    dtypes = (np.float16, np.float32)
    one = run_ranks(2, lambda r, g: allreduce(np.ones(4, dtypes[r]), s, group=g, timeout=5), NoHalfNccl)
    assert isinstance(one[0], TypeError) and "no float16" in str(one[0])
    assert isinstance(one[1], MismatchError), one[1]
    assert str(one[1]) == (
        "cannot allreduce: rank 0 has data its engine cannot send (its dtype, or a CPU tensor on NCCL)"
    )


def mismatched(n: int, s: Proof, change: str) -> tuple[list[Any], list[np.ndarray]]:
    """Every rank runs ``s`` on distinct data, except rank 1, whose ``change`` differs."""
    other = prove(synthesize("stragglar", n, straggler=0))
    bufs = [payload(r, 12, n, "float32").astype(np.float32) for r in range(n)]
    if change == "dtype":
        bufs[1] = bufs[1].astype(np.float64)
    elif change == "count":
        bufs[1] = bufs[1][:11].copy()
    before = [b.copy() for b in bufs]

    def body(rank: int, group: NcclGroup) -> Any:
        schedule = other if change == "straggler" and rank == 1 else s
        return allreduce(bufs[rank], schedule, group=group, timeout=5)

    *results, _, _ = run_ranks(n, body)
    return results, [a for a, b in zip(bufs, before, strict=True) if not np.array_equal(a, b)]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("dtype", "dtype: ranks 0, 2, 3 have float32, rank 1 has float64"),
        ("count", "element count: ranks 0, 2, 3 have 12, rank 1 has 11"),
        ("straggler", "schedule: ranks 0, 2, 3 run the 'stragglar' schedule for 4 ranks (straggler 3, "),
    ],
)
def test_ranks_that_disagree_all_raise_the_same_clear_error_and_move_no_data(
    change: str, message: str
) -> None:
    results, changed = mismatched(4, prove(synthesize("stragglar", 4)), change)
    assert all(isinstance(e, MismatchError) for e in results), results
    assert len({str(e) for e in results}) == 1  # the same one line on every rank
    text = str(results[0])
    assert text.startswith("ranks disagree on the allreduce: " + message) and "\n" not in text, text
    if change == "straggler":
        assert "rank 1 runs the 'stragglar' schedule for 4 ranks (straggler 0, " in text
    assert changed == []  # nobody summed anything


@pytest.mark.parametrize(("lockstep", "gathers"), [(False, 4), (True, 2)])
def test_the_header_is_checked_when_the_setup_changes_or_once_per_setup_in_lockstep(
    lockstep: bool, gathers: int
) -> None:
    """10, 10, 10, 7, 10, 7 elements: checked on the first call and at each change (10 -> 7 -> 10
    -> 7), 4 times; a caller in lockstep checks each setup once, twice."""
    s = prove(synthesize("stragglar", 3))

    def body(rank: int, group: NcclGroup) -> list[int]:
        counts = (10, 10, 10, 7, 10, 7)
        for count in counts:
            buf = payload(rank, count, 3, "int64")
            allreduce(buf, s, group=group, timeout=5, lockstep=lockstep)
            assert np.array_equal(buf, expected(count, 3, "int64"))
        return list(counts)

    *results, nccl, _ = run_ranks(3, body)
    assert not [x for x in results if isinstance(x, Exception)], results
    assert nccl.gathers == [gathers] * 3


def test_a_schedule_for_another_size_fails_every_rank() -> None:
    s = prove(synthesize("ring", 3))
    *results, _, _ = run_ranks(4, lambda r, g: allreduce(np.ones(6, np.float32), s, group=g, timeout=5))
    assert all(isinstance(e, MismatchError) for e in results), results
    assert str(results[0]).startswith("the 'ring' schedule for 3 ranks (no straggler, fingerprint ")
    assert str(results[0]).endswith(") cannot run on a group of 4 ranks")


def summed_or_timed_out(buf: np.ndarray, s: Proof, group: NcclGroup) -> Any:
    """A call that must time out: its RankError, or the buffer if a sum came back (it must not)."""
    try:
        allreduce(buf, s, group=group, timeout=0.5)
    except RankError as e:
        return e
    return buf


def test_a_rank_that_changes_its_count_after_the_check_fails_every_rank_never_sums_wrong() -> None:
    """The header is checked once per plan: a rank that later brings a new count checks a new
    header alone, so every rank times out instead of summing mismatched chunks."""
    s = prove(synthesize("stragglar", 3))

    def body(rank: int, group: NcclGroup) -> Any:
        buf = payload(rank, 12, 3, "int64")
        allreduce(buf, s, group=group, timeout=5)
        count = 11 if rank == 1 else 12
        buf = payload(rank, count, 3, "int64")
        return summed_or_timed_out(buf, s, group)

    *results, _, _ = run_ranks(3, body)
    assert all(isinstance(e, RankError) and e.reason == "timed out" for e in results), results


@pytest.mark.parametrize(
    ("comm", "named"),
    [(None, "NoneType"), ("comm", "str"), (object(), "object")],
)
def test_a_group_on_something_other_than_a_communicator_is_refused_as_it_is_made(
    comm: object, named: str
) -> None:
    """A torch process group or a placeholder passed as ``comm`` would fail deep inside the
    first call with Python's own AttributeError; the group says at once what it needs."""
    with pytest.raises(
        InputError,
        match=rf"NcclGroup needs an NCCL communicator .*, got {named}, "
        r"which has no rank_id, size, send, recv, allGather, check_async_error, abort$",
    ):
        NcclGroup(comm)


def test_a_communicator_missing_one_call_is_refused_naming_it() -> None:
    class Partial(FakeComm):
        abort = None  # type: ignore[assignment]

    nccl = FakeNccl(2)
    with pytest.raises(InputError, match=r"got Partial, which has no abort$"):
        NcclGroup(Partial(nccl, 0, 2, FakeStream()), nccl, FakeStream())


class PatientNccl(FakeNccl):
    """A fake NCCL whose operations wait long enough for a late rank that sleeps a second."""

    patience = 5.0


def test_a_second_call_on_a_busy_nccl_group_is_refused_whatever_its_tag() -> None:
    """NCCL matches messages by order, so a group runs one call at a time: a call that starts while
    another waits for the late rank is refused on every rank before its data moves, and the call
    that ran fails as it ends."""
    s = prove(synthesize("stragglar", 3))

    def body(rank: int, group: NcclGroup) -> Any:
        allreduce(payload(rank, 12, 3, "int64"), s, group=group, timeout=5)  # checked: no gather next
        first, second = payload(rank, 12, 3, "int64"), payload(rank, 6, 3, "int64")
        failed: list[Exception] = []

        def waiting() -> None:
            try:
                allreduce(first, s, group=group, straggler_delay=1.5, timeout=5)
            except InputError as e:
                failed.append(e)

        thread = threading.Thread(target=waiting)
        thread.start()
        time.sleep(0.4)  # the first call is inside, waiting for its late rank (under load too)
        try:
            allreduce(second, s, group=group, timeout=5, tag=7)
        except InputError as e:
            outcome = str(e) if np.array_equal(second, payload(rank, 6, 3, "int64")) else "moved"
        else:
            outcome = "ran"
        thread.join(10)
        assert [str(e).startswith("another allreduce started on this NCCL group") for e in failed] == [True]
        return outcome

    *results, _, _ = run_ranks(3, body, PatientNccl)
    assert results == [results[0]] * 3 and "calls on one group must not overlap" in str(results[0]), results


def test_ranks_that_mix_two_checked_setups_fail_and_never_sum_wrong() -> None:
    """Every rank ran a float32 and an int32 buffer of one length, each checked; then rank 1 brings
    the int32 one while the others bring the float32 one.  The same bytes move either way, so
    without a check the sum is garbage: a rank that changes its setup checks again, and alone it
    waits, as its peers wait for its data, until all time out."""
    s = prove(synthesize("stragglar", 3))

    def body(rank: int, group: NcclGroup) -> Any:
        for dtype in ("int32", "float32"):
            buf = payload(rank, 12, 3, dtype).astype(dtype)
            allreduce(buf, s, group=group, timeout=5)
            assert np.array_equal(buf, expected(12, 3, dtype))
        dtype = "int32" if rank == 1 else "float32"
        buf = payload(rank, 12, 3, dtype).astype(dtype)
        return summed_or_timed_out(buf, s, group)

    *results, _, _ = run_ranks(3, body)
    assert all(isinstance(e, RankError) and e.reason == "timed out" for e in results), results
