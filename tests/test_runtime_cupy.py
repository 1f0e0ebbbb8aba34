"""The CuPy/NCCL transport against a fake NCCL over NumPy memory (raw pointers, counts, groups)."""

from __future__ import annotations

import ctypes
import queue
import threading
import time
from typing import Any

import numpy as np
import pytest

from stragglar.measure.data import expected, payload
from stragglar.runtime import NcclGroup, RankError, allreduce
from stragglar.synth import synthesize
from stragglar.verify import prove

ITEMSIZE = {2: 4, 4: 8, 6: 2, 7: 4, 8: 8}


class FakeNccl:
    """``cupy.cuda.nccl`` for N ranks in threads: ops queue inside groupStart/groupEnd and run at
    groupEnd; a receive nobody sends leaves the stream stuck, as a real NCCL kernel would hang."""

    NCCL_INT32, NCCL_INT64, NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64 = 2, 4, 6, 7, 8

    def __init__(self, n: int) -> None:
        self.wires = {(a, b): queue.Queue[tuple[int, bytes]]() for a in range(n) for b in range(n)}
        self.state = threading.local()
        self.groups = [0] * n

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
                    got_dtype, data = self.wires[(peer, c.rank)].get(timeout=0.5)
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

    def check_async_error(self) -> None:
        return None

    def abort(self) -> None:
        self.aborted = True


def run_ranks(n: int, body: Any) -> list[Any]:
    """Run ``body(rank, group)`` in n threads; return results or raised exceptions."""
    nccl = FakeNccl(n)
    groups = [
        NcclGroup(FakeComm(nccl, r, n, s), nccl, s) for r, s in enumerate(FakeStream() for _ in range(n))
    ]
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
        assert isinstance(results[rank], RankError) and "timed out" in str(results[rank])
        assert groups[rank].comm.aborted


def test_dtype_the_nccl_build_lacks_is_refused() -> None:
    nccl = FakeNccl(2)
    group = NcclGroup(FakeComm(nccl, 0, 2, FakeStream()), nccl, FakeStream())
    with pytest.raises(TypeError, match="no bfloat16"):
        allreduce(_Bf16(), prove(synthesize("ring", 2)), group=group)


class _Bf16:
    """Stands in for a bfloat16 device array (NumPy has none)."""

    dtype = "bfloat16"
    shape = (4,)
    flags = type("F", (), {"c_contiguous": True})()

    def reshape(self, *_: int) -> _Bf16:
        return self
