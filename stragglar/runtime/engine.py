"""The interpreter every transport shares: run a bound plan round by round on one rank.

Buffers are NumPy, CuPy or torch arrays; the interpreter only slices them, copies into slices and
adds into slices, which all three spell the same way.  A transport only moves one round's
messages (:class:`Transport`); packing, scratch and the reductions after the round happen here, so
every engine computes exactly what the local reference computes.  A transport's caller may pack
and land with its own kernels instead (a :class:`Packing`: the CuPy/NCCL transport's), which add
the same operands, so the same bits.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from stragglar.args import as_rank
from stragglar.errors import ArgumentError, InputError, RunError
from stragglar.runtime.program import BoundMessage, BoundStep, Plan, RankProgram
from stragglar.schedule import Schedule

__all__ = [
    "DTYPES",
    "SLICE_PACKING",
    "Packing",
    "RankError",
    "Timeline",
    "Transport",
    "check_array",
    "check_buffers",
    "check_summable",
    "classify",
    "dtype_name",
    "failure_phrase",
    "flat_view",
    "late_rank_for",
    "library_of",
    "poll",
    "run_rank",
    "run_rank_replayed",
    "sleep_until",
    "step_error",
]

DTYPES = ("float16", "bfloat16", "float32", "float64", "int32", "int64")

Array = Any  # numpy.ndarray, cupy.ndarray or torch.Tensor: all sliced the same way


class RankError(RunError):
    """A rank could not finish its part: a peer died, never arrived, or timed out.

    Besides the message, the fields say what happened where, so a launcher can summarise many
    ranks' failures in one line: ``reason`` (``"timed out"``, ``"lost the connection"``,
    ``"failed"``), the ``round`` (numbered within its phase, as in the verifier's messages) and
    ``phase`` it happened in (None outside the rounds, then
    ``during`` says what the rank was doing), and the ``peer`` it was ``waiting`` for
    (``"waiting for"`` a receive, ``"sending to"`` a send) when one peer is to blame.
    """

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        reason: str = "failed",
        round: int | None = None,
        phase: str | None = None,
        peer: int | None = None,
        waiting: str = "waiting for",
        during: str | None = None,
    ) -> None:
        super().__init__(message)
        self.rank = rank
        self.reason = reason
        self.round = round
        self.phase = phase
        self.peer = peer
        self.waiting = waiting
        self.during = during

    def __reduce__(self) -> tuple[Any, ...]:  # keyword fields survive pickling (process pools)
        return (_rank_error, (str(self), self.fields()))

    def fields(self) -> dict[str, Any]:
        """The structured fields, as plain data (what a rank process sends its launcher)."""
        keys = ("rank", "reason", "round", "phase", "peer", "waiting", "during")
        return {k: getattr(self, k) for k in keys}

    @property
    def what(self) -> str:
        """``timed out in round 5 (phase 'exchange') waiting for rank 2``: the fields in words."""
        return failure_phrase(self.reason, self.round, self.phase, self.peer, self.waiting, self.during)


def _rank_error(message: str, fields: dict[str, Any]) -> RankError:
    return RankError(message, **fields)


def failure_phrase(
    reason: str,
    round: int | None = None,
    phase: str | None = None,
    peer: int | None = None,
    waiting: str = "waiting for",
    during: str | None = None,
) -> str:
    """A failure in words, without the rank: see :attr:`RankError.what`."""
    text = reason
    if round is not None:
        text += f" in round {round}" + (f" (phase {phase!r})" if phase is not None else "")
    elif during:
        text += f" {during}"
    if peer is not None:
        text += f" {waiting} rank {peer}"
    return text


def classify(error: BaseException) -> str:
    """``timed out``, ``lost the connection`` or ``failed``: what an engine's exception means."""
    text = str(error).lower()
    if isinstance(error, TimeoutError) or "timed out" in text or "timeout" in text:
        return "timed out"
    lost = ("closed by peer", "connection reset", "connection closed", "broken pipe", "connection refused")
    if any(word in text for word in lost):
        return "lost the connection"
    return "failed"


def first_line(text: object, limit: int = 200) -> str:
    """The first non-empty line of ``text``, cut to ``limit`` characters."""
    line = next((x.strip() for x in str(text).splitlines() if x.strip()), "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def late_rank_for(ranks: Schedule | RankProgram, late_rank: Any = None, size: int | None = None) -> int:
    """The rank that arrives late in a run of ``ranks`` (a schedule, or a rank's program of one):
    ``late_rank`` where the caller names one (checked as a rank of ``size`` ranks, default the
    schedule's), else the schedule's own (:attr:`~stragglar.schedule.Schedule.late_rank`: its
    straggler, else the last rank).

    Every entry point that makes a rank late asks this one function, so they all agree on who it
    is.  A call across processes checks the rank it is given against its group's size: a group of
    another size is then reported by the header check, in the same words on every rank.
    """
    if late_rank is None:
        return ranks.late_rank
    return as_rank(late_rank, "late_rank", ranks.num_ranks if size is None else size)


@dataclass(frozen=True, slots=True)
class Timeline:
    """When one rank did what, in ``time.perf_counter`` seconds (one clock for all processes of a
    host).  ``phase_done[i]`` is when it finished phase ``i`` (None: not in that phase); on a GPU
    these are host-side issue times."""

    rank: int
    start: float
    arrived: float
    phase_done: tuple[float | None, ...]
    done: float


class Transport(Protocol):
    """Moves one round's messages: every ``recvs[i]`` view filled from its peer's matching send."""

    def exchange(self, step: BoundStep, sends: list[Array], recvs: list[Array]) -> None: ...

    def finish(self) -> None: ...


_dtype_names: dict[Any, str] = {}  # a supported dtype object -> its name


def dtype_name(array: Array) -> str:
    """The dtype as a plain name (``torch.float32`` -> ``float32``), checked against :data:`DTYPES`.

    A call asks it several times per buffer, and naming a NumPy dtype costs microseconds, so the
    names of the dtypes seen are kept (a handful: only supported ones are)."""
    dtype = array.dtype
    name = _dtype_names.get(dtype)
    if name is not None:
        return name
    name = str(dtype).rsplit(".", 1)[-1]
    if name not in DTYPES:
        raise ArgumentError(f"cannot allreduce dtype {name}: supported dtypes are {', '.join(DTYPES)}")
    if len(_dtype_names) < 64:
        _dtype_names[dtype] = name
    return name


def sleep_until(moment: float) -> float:
    """Sleep until ``time.perf_counter()`` reaches ``moment`` (not at all if it has: a zero sleep
    is still a system call), and return the time then."""
    left = moment - time.perf_counter()
    if left > 0:
        time.sleep(left)
    return time.perf_counter()


POLL = 1e-4  # seconds between two looks at work the host cannot wait on with a timeout


def poll(ready: Callable[[], bool], timeout: float | None, spin: float = 0.0) -> bool:
    """Look at ``ready()`` until it is true (True) or ``timeout`` seconds have passed (False; None:
    no bound): without sleeping for the first ``spin`` seconds (where the moment it turns true is
    the figure being measured), then every :data:`POLL` seconds, leaving the cores to others.
    What NCCL's work and CUDA's events offer instead of a wait with a timeout."""
    begun = time.monotonic()
    while not ready():
        waited = time.monotonic() - begun
        if timeout is not None and waited > timeout:
            return False
        time.sleep(0 if waited < spin else POLL)
    return True


def flat_view(array: Array) -> Array:
    """A 1-D view sharing ``array``'s memory; the result must land in place, so no copies."""
    dtype_name(array)
    contiguous = array.is_contiguous() if hasattr(array, "is_contiguous") else array.flags.c_contiguous
    if not contiguous:
        raise InputError("allreduce needs a contiguous buffer (results are written in place)")
    return array.reshape(-1)


def in_place_refusal(array: Array) -> str | None:
    """Why the AllReduce cannot write ``array`` in place, or None: torch refuses in-place writes to
    a tensor that requires grad (a view of a leaf) or to an inference tensor outside inference
    mode, and would do so in the middle of the rounds, with the buffer half written and the peers
    waiting for data that never comes.  So the rank says so in its header, before any data moves."""
    if getattr(array, "requires_grad", False):
        return "allreduce writes in place: pass a buffer that does not require grad (tensor.detach())"
    inference = getattr(array, "is_inference", None)
    torch = sys.modules.get("torch")
    if inference is not None and inference() and torch is not None and not torch.is_inference_mode_enabled():
        return (
            "allreduce writes in place: an inference tensor can only be written inside torch.inference_mode()"
        )
    return None


def empty_like(flat: Array, size: int) -> Array:
    """Scratch on the same device and with the same dtype as ``flat``."""
    if hasattr(flat, "new_empty"):
        return flat.new_empty(size)
    return np.empty_like(flat, shape=(size,))  # CuPy arrays dispatch this to CuPy


_host_scratch = threading.local()


def scratch_for(flat: Array, size: int) -> Array:
    """``size`` elements of scratch like ``flat``, reused across calls for host (CPU) buffers.

    A fresh 100 MiB host allocation costs about 40 ms of page faults, paid on every call; CUDA
    memory pools already cache, and their stream-ordered reuse is theirs to manage, so device
    buffers get a fresh allocation.  The cache is per thread (a thread runs one AllReduce at a
    time) and per dtype, and holds the largest scratch asked for so far.
    """
    if not _on_host(flat):
        return empty_like(flat, size)
    key = (type(flat), dtype_name(flat))
    cache: dict[tuple[type, str], Array] = _host_scratch.__dict__.setdefault("buffers", {})
    buffer = cache.get(key)
    if buffer is None or buffer.shape[0] < size:
        buffer = cache[key] = empty_like(flat, size)
    return buffer[:size]


def _on_host(flat: Array) -> bool:
    device = getattr(flat, "device", None)
    return isinstance(flat, np.ndarray) or getattr(device, "type", None) == "cpu"


def send_view(flat: Array, work: Array, m: BoundMessage) -> Array:
    """What to send for ``m``: a buffer slice, or its chunks packed into ``work`` (a torch
    tensor's in one ``cat``: one kernel on a GPU, not one per chunk)."""
    if m.direct is not None:
        return flat[m.direct[0] : m.direct[1]]
    packed = work[m.staging : m.staging + m.size]
    if len(m.pieces) > 1 and library_of(flat) == "torch":
        sys.modules["torch"].cat([flat[a:b] for a, b, _ in m.pieces], out=packed)
        return packed
    offset = m.staging
    for start, stop in ((a, b) for a, b, _ in m.pieces):
        work[offset : offset + stop - start] = flat[start:stop]
        offset += stop - start
    return packed


def recv_view(flat: Array, work: Array, m: BoundMessage) -> Array:
    if m.direct is not None:
        return flat[m.direct[0] : m.direct[1]]
    return work[m.staging : m.staging + m.size]


def apply(flat: Array, work: Array, m: BoundMessage) -> None:
    """Copy or add a message received into scratch into the buffer (after the round).  A torch
    tensor's sums land in one fused call (``_foreach_add_``: a kernel or so on a GPU, not one per
    chunk), the same ``buffer += received`` element by element, so the results are the same bits.
    (A message of several pieces that are copies is contiguous in every generated schedule, and
    so direct.)"""
    if m.direct is not None:
        return
    fused = len(m.pieces) > 1 and library_of(flat) == "torch"
    targets: list[Array] = []
    received: list[Array] = []
    offset = m.staging
    for start, stop, reduce in m.pieces:
        data = work[offset : offset + stop - start]
        if not reduce:
            flat[start:stop] = data
        elif fused:
            if stop > start:  # an empty chunk adds nothing (and some foreach kernels mind it)
                targets.append(flat[start:stop])
                received.append(data)
        else:
            flat[start:stop] += data
        offset += stop - start
    if targets:
        sys.modules["torch"]._foreach_add_(targets, received)


class Packing(Protocol):
    """How a rank's messages get in and out of its buffer: ``pack`` returns what to send for a
    message (a slice of the buffer, or its pieces packed into ``work``), ``land`` puts a received
    message in place after the round (copied, or added for a reduction)."""

    def pack(self, flat: Array, work: Array, m: BoundMessage) -> Array: ...

    def land(self, flat: Array, work: Array, m: BoundMessage) -> None: ...


class SlicePacking:
    """The interpreter's packing (:func:`send_view`, :func:`apply`): slice copies and adds, which
    every array library spells alike (a torch tensor's chunks in one ``cat`` and one fused add).
    Its methods are the functions themselves, not methods that call them: a frame less per
    message."""

    pack = staticmethod(send_view)
    land = staticmethod(apply)


SLICE_PACKING = SlicePacking()


def run_rank(
    flat: Array,
    plan: Plan,
    transport: Transport,
    straggler_delay: float = 0.0,
    late_rank: int | None = None,
    rounds: tuple[int, int | None] = (0, None),
    packing: Packing = SLICE_PACKING,
) -> Timeline:
    """Run ``plan``'s steps in ``rounds`` (first, stop; stop None: to the end) on this rank's 1-D
    buffer, its messages packed and landed by ``packing``; the late rank (``late_rank``, else the
    schedule's: :func:`late_rank_for`) first sleeps ``straggler_delay`` s in the call that holds
    its first step."""
    steps = _steps_in(plan, rounds)
    start = time.perf_counter()
    arrived = _arrive(plan, straggler_delay, late_rank, rounds)
    work = scratch_for(flat, plan.work_size)
    phase_done: list[float | None] = [None] * len(plan.program.phases)
    pack, land = packing.pack, packing.land
    for step in steps:
        sends = [pack(flat, work, m) for m in step.sends]
        recvs = [recv_view(flat, work, m) for m in step.recvs]
        transport.exchange(step, sends, recvs)
        for m in step.recvs:
            land(flat, work, m)
        phase_done[step.phase] = time.perf_counter()
    transport.finish()
    return Timeline(plan.rank, start, arrived, tuple(phase_done), time.perf_counter())


def run_rank_replayed(
    flat: Array,
    plan: Plan,
    transport: Transport,
    replay: Callable[[Hashable, Callable[[], object]], None],
    key: Hashable,
    straggler_delay: float = 0.0,
    late_rank: int | None = None,
    rounds: tuple[int, int | None] = (0, None),
    packing: Packing = SLICE_PACKING,
) -> Timeline:
    """:func:`run_rank` with its rounds run by ``replay(key, work)`` (a
    :class:`~stragglar.runtime.graphs.Replayer`), the late rank's sleep before them and the
    transport's final wait after them on the host, outside any graph (a host wait on a stream
    being captured would break the capture).  Phases end when the rounds are issued (host times,
    as on any GPU path)."""
    start = time.perf_counter()
    arrived = _arrive(plan, straggler_delay, late_rank, rounds)
    steps = _steps_in(plan, rounds)
    if steps:  # a range this rank has no part in (the late rank's first) makes no empty graph
        replay(key, lambda: run_rank(flat, plan, _Issuing(transport), 0.0, late_rank, rounds, packing))
    transport.finish()
    done = time.perf_counter()
    phases = {step.phase for step in steps}
    phase_done = tuple(done if phase in phases else None for phase in range(len(plan.program.phases)))
    return Timeline(plan.rank, start, arrived, phase_done, done)


@dataclass(frozen=True)
class _Issuing:
    """``transport`` whose rounds are issued and not waited for: the caller waits, after them."""

    transport: Transport

    def exchange(self, step: BoundStep, sends: list[Array], recvs: list[Array]) -> None:
        self.transport.exchange(step, sends, recvs)

    def finish(self) -> None:
        pass


def _steps_in(plan: Plan, rounds: tuple[int, int | None]) -> tuple[BoundStep, ...]:
    """``plan``'s steps in rounds ``first`` to ``stop - 1`` (stop None: to the end)."""
    first, stop = rounds
    if rounds == (0, None):
        return plan.steps
    return tuple(s for s in plan.steps if first <= s.round and (stop is None or s.round < stop))


def _arrive(
    plan: Plan, straggler_delay: float, late_rank: int | None, rounds: tuple[int, int | None]
) -> float:
    """When this rank arrives: the late rank sleeps ``straggler_delay`` first in the call over
    ``rounds`` that holds its first step (the call it is late to), every other call at once."""
    first, stop = rounds
    begin = plan.steps[0].round if plan.steps else 0
    holds_first = first <= begin and (stop is None or begin < stop)
    if plan.rank == late_rank_for(plan.program, late_rank) and straggler_delay > 0 and holds_first:
        time.sleep(straggler_delay)
    return time.perf_counter()


def step_error(
    plan: Plan, step: BoundStep, error: BaseException, peer: int | None = None, waiting: str = "waiting for"
) -> RankError:
    """A :class:`RankError` for ``error`` met in ``step``, naming the peer when one is to blame
    (else the step's only peer, if it has one)."""
    peers = sorted({m.peer for m in step.sends + step.recvs})
    if peer is None and len(peers) == 1:
        peer, waiting = peers[0], "with"
    phase = plan.program.phases[step.phase]
    rnd = plan.program.phase_round(step.round, step.phase)
    reason = classify(error)
    what = failure_phrase(reason, rnd, phase, peer, waiting)
    return RankError(
        f"allreduce failed: rank {plan.rank} {what}: {first_line(error)}",
        rank=plan.rank,
        reason=reason,
        round=rnd,
        phase=phase,
        peer=peer,
        waiting=waiting,
    )


def check_sizes(sizes: Sequence[int], what: str) -> None:
    if len(set(sizes)) > 1:
        raise InputError(f"every rank needs the same buffer size for {what}, got {sorted(set(sizes))}")


def library_of(value: object) -> str | None:
    """``numpy``, ``torch`` or ``cupy`` for an array of that library; None for anything else (a
    list, a scalar), which the interpreter cannot slice in place.  The GPU libraries are asked
    first: an array type of theirs that derives from NumPy's is still theirs."""
    for name, kind in (("torch", "Tensor"), ("cupy", "ndarray")):
        module = sys.modules.get(name)  # never imported here: an array of it means it is loaded
        if module is not None and isinstance(value, getattr(module, kind)):
            return name
    return "numpy" if isinstance(value, np.ndarray) else None


def check_array(array: object, what: str) -> None:
    """Refuse a buffer the AllReduce cannot sum in place, before any data moves: anything but a
    NumPy, CuPy or torch array (:func:`check_summable` too).  A 0-d array is one element, and fine."""
    if library_of(array) is None:
        raise ArgumentError(f"{what} sums NumPy, CuPy or torch arrays, got {type(array).__name__}")
    check_summable(array, what)


def check_summable(array: object, what: str) -> None:
    """Refuse an array whose values are not its data: a meta tensor has a shape and no data (the
    rounds would "succeed" doing nothing in one process, and fail half-way across processes when a
    transport copies out of it); a masked NumPy array would be summed through its mask, the masked
    values included, and look like a masked sum."""
    if getattr(array, "is_meta", False):
        raise InputError(f"{what} needs data to sum: a meta tensor holds none")
    if isinstance(array, np.ma.MaskedArray):
        raise InputError(
            f"{what} cannot honour a mask: pass the array's data (array.filled(0) sums the unmasked values)"
        )


def check_buffers(buffers: object) -> None:
    """``allreduce_local``'s buffers: a list (or tuple) of arrays of one library on one device, so
    that a round's copy from one rank into another is a plain slice copy."""
    if not isinstance(buffers, (list, tuple)):
        raise ArgumentError(
            f"allreduce_local takes a list of arrays, one per rank, got {type(buffers).__name__}"
        )
    for rank, buffer in enumerate(buffers):
        check_array(buffer, "allreduce_local")
        refusal = in_place_refusal(buffer)
        if refusal is not None:
            raise InputError(f"rank {rank}'s buffer: {refusal}")
    places = sorted({f"{library_of(b)} on {_device(b)}" for b in buffers})
    if len(places) > 1:
        raise InputError(f"allreduce_local needs every rank's array in one place, got {' and '.join(places)}")


def _device(array: Any) -> str:
    return "the host" if isinstance(array, np.ndarray) else str(array.device)
