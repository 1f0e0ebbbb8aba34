"""The GPU loopback (every rank's CuPy array in this process) as batched kernels and CUDA graphs.

A round is the two stages of :func:`~stragglar.runtime.batched.run_rounds`, a gather of every
piece received into the round buffer and its landing (:mod:`~stragglar.runtime.kernels`: copied,
or for a reduction added in place in the dtype's own arithmetic, bit for bit the interpreter's).

Buffers are reached through a device array of pointers written before each call, so a graph
captured once (:mod:`~stragglar.runtime.graphs`) replays on any buffers of the plan's element
count and dtype.  Each :class:`CupyLoopback` owns a stream, the round buffer, the uploaded tables
and its graphs; a call waits for the caller's current stream first and synchronizes at the end
(the loopback returns finished work, as the interpreter does).  They are cached per (schedule,
late rank, element count, dtype, device).  Nothing here runs without a GPU: the stages' order is
tested on NumPy (:class:`~stragglar.runtime.batched.HostBackend`), the graph logic with a CuPy
stand-in, the kernels' C compiled for the host with g++ (tests/fake_cupy.py) and to PTX by NVRTC
(tests/nvrtc.py).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from stragglar.runtime.arrays import Array, dtype_name
from stragglar.runtime.batched import BatchedPlan, batched_plan, run_batched, run_rounds
from stragglar.runtime.clock import Timeline
from stragglar.runtime.graphs import Replayer, StreamGraphs
from stragglar.runtime.kernels import SUMS, kernels, launch, upload
from stragglar.runtime.plans import cached
from stragglar.runtime.program import Plan

__all__ = ["CupyLoopback", "run_cupy_loopback"]


class CupyLoopback:
    """One plan's tables on one device, with the stream, round buffer and graphs to run them."""

    def __init__(self, cupy: Any, plan: BatchedPlan, dtype: str) -> None:
        self.cupy = cupy
        self.plan = plan
        self.lock = threading.Lock()  # one call at a time: the round buffer is shared
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.kernels = kernels(cupy, dtype)
        self.received = cupy.empty(plan.scratch, dtype=SUMS[dtype][1])  # the elements' bits
        self.pointers = cupy.zeros(plan.num_ranks, dtype=cupy.uint64)
        self.gathers = [upload(cupy, t.gather) for t in plan.rounds]
        self.lands = [upload(cupy, t.land) for t in plan.rounds]
        self.replayer = Replayer(StreamGraphs(self.stream))

    def replayed(self, plan: BatchedPlan, first: int, stop: int) -> None:
        """Rounds ``first`` to ``stop - 1``, from a graph once one is captured."""
        self.replayer((first, stop), lambda: self.run(plan, first, stop))

    def bind(self, flats: Sequence[Array], plan: BatchedPlan) -> None:
        """Point the kernels at this call's buffers, after the caller's queued work on them."""
        self.stream.wait_event(self.cupy.cuda.get_current_stream().record())
        addresses = np.array([f.data.ptr for f in flats], dtype=np.uint64)
        self.pointers.set(addresses, stream=self.stream)

    def run(self, plan: BatchedPlan, first: int, stop: int) -> None:
        with self.stream:
            run_rounds(plan, first, stop, self)

    def synchronize(self) -> None:
        self.stream.synchronize()

    def gather(self, index: int) -> None:
        launch(self.kernels.gather, self.pointers, self.gathers[index], self.received)

    def land(self, index: int) -> None:
        reduced = np.int64(self.plan.rounds[index].reduced)
        launch(self.kernels.land, self.pointers, self.lands[index], reduced, self.received)


_loopbacks: OrderedDict[Hashable, CupyLoopback] = OrderedDict()
CACHED = 8  # loopbacks kept: each holds a round buffer of the largest round


def run_cupy_loopback(
    cupy: Any,
    flats: Sequence[Array],
    plans: Sequence[Plan],
    fingerprint: str,
    straggler_delay: float,
    late_rank: int,
    graphs: bool = True,
) -> list[Timeline]:
    """AllReduce CuPy ``flats`` (1-D views, one per rank, one device) in place with batched rounds, from
    CUDA graphs after the first call unless ``graphs`` is False."""
    count, dtype = int(flats[0].shape[0]), dtype_name(flats[0])
    key = (fingerprint, late_rank, count, dtype, int(flats[0].device.id))
    loopback = cached(
        _loopbacks, key, lambda: CupyLoopback(cupy, batched_plan(plans, late_rank), dtype), CACHED
    )
    with loopback.lock:
        loopback.replayer.graphs = graphs
        return run_batched(flats, loopback.plan, loopback, straggler_delay, runner=loopback.replayed)
