"""Schedule generators: StragglAR and the baselines it is measured against, all in one IR.

Generators import only the core (:mod:`stragglar.schedule`); what they make is proved elsewhere
(:mod:`stragglar.verify`) before anything uses it.

>>> synthesize("ring", 4).num_rounds
6
>>> synthesize("stragglar", 8, chunks=32).exposed_rounds  # C + ceil(log2 N) - 1
34
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from stragglar.args import as_int, as_rank, as_seconds
from stragglar.errors import ArgumentError, InputError, described
from stragglar.schedule import (
    ALGORITHMS,
    Schedule,
    check_num_ranks,
    check_size,
    gc_paused,
    move_straggler,
)
from stragglar.synth.direct import direct_allreduce
from stragglar.synth.rhd import rhd_allreduce
from stragglar.synth.ring import ring_allreduce
from stragglar.synth.stragglar import stragglar_allreduce

__all__ = [
    "ALGORITHMS",
    "METHODS",
    "SMT_MAX_RANKS",
    "Request",
    "check_ranks",
    "check_request",
    "direct_allreduce",
    "generate",
    "rhd_allreduce",
    "ring_allreduce",
    "stragglar_allreduce",
    "synthesize",
]

_GENERATORS: dict[str, Callable[[int], Schedule]] = {  # one per name in ALGORITHMS, in its order
    "stragglar": stragglar_allreduce,
    "ring": ring_allreduce,
    "rhd": rhd_allreduce,
    "direct": direct_allreduce,
}
METHODS = ("construct", "smt")
SMT_MAX_RANKS = 16  # z3 takes about 20 s at 14 GPUs and grows fast


_CHUNKS: dict[str, Callable[[int], int]] = {  # the chunk count of each generator's schedule for N ranks
    "stragglar": lambda n: n - 1,
    "ring": lambda n: n,
    "rhd": lambda n: n,
    "direct": lambda n: n - 1,
}


@dataclass(frozen=True)
class Request:
    """A checked request for a schedule: what :func:`generate` will make, known before it does.

    ``num_chunks`` is the chunk count the schedule will have (``chunks``, else the algorithm's own),
    so that a caller can refuse what its output cannot hold (an executor's limits, a run's size)
    before any work.  ``timeout_s`` bounds each z3 query of method smt.
    """

    algorithm: str
    num_ranks: int
    straggler: int | None
    chunks: int | None
    method: str
    timeout_s: float | None = None
    # made by check_request's checks (:meth:`refined`), not by hand or by dataclasses.replace
    _checked: bool = field(default=False, init=False, repr=False, compare=False)

    @property
    def num_chunks(self) -> int:
        return _CHUNKS[self.algorithm](self.num_ranks) if self.chunks is None else self.chunks

    def refined(
        self, straggler: int | None = None, *, chunks: int | None = None, timeout_s: float | None = None
    ) -> Request:
        """This request (of :func:`check_ranks`) for ``straggler``, ``chunks`` and ``timeout_s``,
        checked: the rest of :func:`check_request`, for a caller that asks what the algorithm and N
        alone refuse first (``synth --chunks auto`` asks an export format, before it prices chunk
        counts for it).

        >>> check_ranks("stragglar", 8).refined(chunks=32).num_chunks
        32
        """
        n, algorithm = self.num_ranks, self.algorithm
        rank = None if straggler is None else as_rank(straggler, "straggler", n)
        c = self._checked_chunks(chunks)
        if self.method == "smt":
            if algorithm != "stragglar":
                raise InputError("method smt synthesizes StragglAR schedules only")
            if n > SMT_MAX_RANKS:
                raise InputError(
                    f"method smt handles at most {SMT_MAX_RANKS} GPUs (its time grows fast with N: "
                    f"z3 took 20 to 30 s at 14 on 2 cores), got {n}"
                )
            if timeout_s is not None:
                as_seconds(timeout_s, "timeout_s", positive=True)
        elif timeout_s is not None:
            raise InputError("a timeout applies to method smt only")
        return self._sealed(Request(algorithm, n, rank, c, self.method, timeout_s))

    def with_chunks(self, chunks: int | None) -> Request:
        """This checked request in ``chunks`` chunks instead (None: the algorithm's own), the count
        checked as :meth:`refined` checks one: for a caller that picks the count after the rest
        was checked (``synth --chunks auto``), without asking the rest again."""
        if not self._checked:
            raise ArgumentError("with_chunks takes a checked request (of check_request or refined)")
        return self._sealed(dataclasses.replace(self, chunks=self._checked_chunks(chunks)))

    def _checked_chunks(self, chunks: int | None) -> int | None:
        """``chunks`` checked for this request's algorithm, N and method."""
        n = self.num_ranks
        c = None if chunks is None else as_int(chunks, "chunks")
        if c is not None:
            if self.algorithm != "stragglar":
                raise InputError(f"a chunk count applies to stragglar only, not {self.algorithm}")
            if c < n - 1:
                raise InputError(f"StragglAR needs at least N - 1 = {n - 1} chunks, got {c}")
            check_size(n, c)
            if self.method == "smt" and c != n - 1:
                raise InputError("method smt finds schedules with the paper's N - 1 chunks only")
        return c

    @staticmethod
    def _sealed(request: Request) -> Request:
        object.__setattr__(request, "_checked", True)
        return request


def check_ranks(algorithm: str, num_ranks: int, method: str = "construct") -> Request:
    """What the algorithm, the method and the number of ranks alone refuse: the request for the
    algorithm's own schedule, which :meth:`Request.refined` completes.

    >>> check_ranks("ring", 1)
    Traceback (most recent call last):
    ...
    stragglar.errors.InputError: need 2 to 2048 GPUs, got 1
    """
    for value, name in ((algorithm, "algorithm"), (method, "method")):
        if not isinstance(value, str):  # a list was looked up in a dict: "unhashable type"
            raise ArgumentError(f"{name} must be a name (a str), got {described(value)}")
    if algorithm not in _GENERATORS:
        raise InputError(f"unknown algorithm {described(algorithm)} (choose from {', '.join(ALGORITHMS)})")
    if method not in METHODS:
        raise InputError(f"unknown method {described(method)} (choose from {', '.join(METHODS)})")
    return Request(algorithm, check_num_ranks(num_ranks), None, None, method)


def check_request(
    algorithm: str,
    num_ranks: int,
    straggler: int | None = None,
    *,
    chunks: int | None = None,
    method: str = "construct",
    timeout_s: float | None = None,
) -> Request:
    """Everything :func:`synthesize` checks before it generates (same arguments), in microseconds:
    :func:`check_ranks`, then :meth:`Request.refined`.

    >>> check_request("stragglar", 8).num_chunks, check_request("ring", 8).num_chunks
    (7, 8)
    >>> check_request("stragglar", 8, chunks=6)
    Traceback (most recent call last):
    ...
    stragglar.errors.InputError: StragglAR needs at least N - 1 = 7 chunks, got 6
    """
    return check_ranks(algorithm, num_ranks, method).refined(straggler, chunks=chunks, timeout_s=timeout_s)


def synthesize(
    algorithm: str,
    num_ranks: int,
    straggler: int | None = None,
    *,
    chunks: int | None = None,
    method: str = "construct",
    timeout_s: float | None = None,
) -> Schedule:
    """Generate ``algorithm``'s AllReduce schedule over ``num_ranks`` ranks.

    ``straggler`` (default: the last rank) only applies to the straggler-aware algorithms.
    ``chunks`` (StragglAR only, default ``num_ranks - 1``, the paper's) cuts the buffer into
    more chunks: phase 2 then takes ``chunks + ceil(log2 N) - 1`` rounds of smaller chunks.
    ``method="smt"`` lets z3 find StragglAR's copies (small N; ``timeout_s`` bounds each query).
    Raises :class:`~stragglar.errors.InputError` with a one-line reason for a bad request
    (:func:`check_request`, which callers may ask first and then :func:`generate` its request).
    """
    return generate(
        check_request(algorithm, num_ranks, straggler, chunks=chunks, method=method, timeout_s=timeout_s)
    )


def generate(request: Request) -> Schedule:
    """The schedule ``request`` asks for (of :func:`check_request`, which :func:`synthesize` asks).

    A request made by hand (or changed with ``dataclasses.replace``) is checked first, as
    :func:`check_request` would.
    """
    if not isinstance(request, Request):
        raise ArgumentError(f"expected a Request (of check_request), got {type(request).__name__}")
    if not request._checked:
        request = check_request(
            request.algorithm,
            request.num_ranks,
            request.straggler,
            chunks=request.chunks,
            method=request.method,
            timeout_s=request.timeout_s,
        )
    algorithm, n, rank, c = request.algorithm, request.num_ranks, request.straggler, request.chunks
    if request.method == "smt":
        from stragglar.synth.smt import smt_synthesize  # z3 is slow to import: only when asked

        return smt_synthesize(n, request.timeout_s, rank)
    with gc_paused():  # millions of transfers at N ~ 1000, all kept: collecting them is wasted work
        schedule = (
            stragglar_allreduce(n, num_chunks=c) if algorithm == "stragglar" else _GENERATORS[algorithm](n)
        )
        if rank is None:
            return schedule
        if schedule.straggler is None:
            raise InputError(f"algorithm {described(algorithm)} has no straggler: leave the straggler out")
        return move_straggler(schedule, rank)
