"""The schedule IR: the one data structure every other part of stragglar consumes.

A :class:`Schedule` is a list of phases; a phase is a list of synchronous rounds;
a round is a set of chunk :class:`Transfer` s.  Generators (``stragglar.synth``)
produce it, and verifiers, exporters, the cost model and the runtime read it.
Every class is immutable (frozen dataclasses, and a named tuple for the millions of transfers)
so that a verified schedule cannot change afterwards.

Facts every consumer needs are derived here, once: which phases are hidden behind the
straggler's delay (:attr:`Schedule.hidden_phases`), the rounds exposed after it arrives, the rank
a run waits for when one is late (:attr:`Schedule.late_rank`), the round lower bound R*(n)
(:func:`round_lower_bound`) and a cheap, stable fingerprint for cache keys
(:attr:`Schedule.fingerprint`).

Semantics (also the JSON format's, see ``stragglar.formats.schedule_json``): rank ``r``
starts with its own contribution in every chunk.  In a round every transfer
reads the state at the start of the round; ``copy`` sets the destination's chunk
to the source's, ``reduce`` adds the source's chunk to the destination's.

>>> t = Transfer(src=0, dst=1, chunk=0, op=Op.REDUCE)
>>> s = Schedule("demo", num_ranks=2, num_chunks=1, straggler=None,
...              phases=(Phase("exchange", (0, 1), ((t, Transfer(1, 0, 0, Op.REDUCE)),)),))
>>> s.num_rounds
1
"""

from __future__ import annotations

import contextlib
import enum
import gc
import hashlib
import numbers
import operator
import re
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from stragglar.args import as_int, as_rank
from stragglar.errors import ArgumentError, InputError

__all__ = [
    "ALGORITHMS",
    "MAX_CELLS",
    "MAX_CHUNKS",
    "MAX_RANKS",
    "Op",
    "Phase",
    "Round",
    "Schedule",
    "Transfer",
    "base_name",
    "check_num_ranks",
    "gc_paused",
    "move_straggler",
    "relabel_ranks",
    "round_load",
    "round_lower_bound",
]


# The largest schedules stragglar makes, reads or proves.  They bound the memory of every step
# before it is allocated: the symbolic simulator holds one N-bit set per (rank, chunk), so a
# schedule of MAX_CELLS cells at N = MAX_RANKS needs about 1.5 GB, and its JSON file about 400 MB.
MAX_RANKS = 2048
MAX_CHUNKS = 65536
MAX_CELLS = 2**22  # ranks x chunks: N = 2048 with 2047 chunks, or N = 1024 with 4096

# The algorithms stragglar generates (``stragglar.synth`` has one generator per name), in a fixed
# order: the runtime's header numbers a schedule's algorithm by its place here, so ranks compare
# numbers, and naming them here lets it do so without importing the generators.
ALGORITHMS = ("stragglar", "ring", "rhd", "direct")


class Op(str, enum.Enum):
    """What the destination does with a received chunk."""

    COPY = "copy"
    REDUCE = "reduce"


class Transfer(NamedTuple):
    """One chunk sent from ``src`` to ``dst`` in one round.

    A named tuple rather than a frozen dataclass: as immutable, but built at C speed, which
    matters because a schedule at N = 1024 holds two million of them (twice as fast to make,
    and the larger part of synthesizing or loading such a schedule).
    """

    src: int
    dst: int
    chunk: int
    op: Op = Op.COPY


Round = tuple[Transfer, ...]


def _plain(value: Any) -> Any:
    """``value`` as a plain ``int`` where it is another integral type (NumPy's): a schedule built
    of them was proved, then refused by the writer, and fingerprinted apart from its equal.  Any
    other value (a bool, a float) is left for the checks to refuse by its own name."""
    if type(value) is int or isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return value
    return operator.index(value)


def _frozen(values: Any, what: str) -> tuple[Any, ...]:
    """``values`` (a list, any iterable but a string) as a tuple; a TypeError naming ``what``
    for anything else."""
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise ArgumentError(f"{what} must be a sequence, got {type(values).__name__}")
    return tuple(values)


@dataclass(frozen=True, slots=True)
class Phase:
    """Consecutive rounds run by a subset of the ranks.

    StragglAR's ReduceScatter is a phase without the straggler: it runs while
    the straggler is late, so its rounds are hidden behind the delay.
    """

    name: str
    ranks: tuple[int, ...]
    rounds: tuple[Round, ...]

    def __post_init__(self) -> None:
        # Tuples, whatever was given: a proved schedule built of lists could still be changed
        # through them (a round appended after the proof), and would run as it then was.
        ranks = self.ranks
        if type(ranks) is not tuple or any(type(r) is not int for r in ranks):
            object.__setattr__(self, "ranks", tuple(_plain(r) for r in _frozen(ranks, "ranks")))
        rounds = self.rounds
        if type(rounds) is not tuple or any(type(r) is not tuple for r in rounds):
            rounds = tuple(
                r if type(r) is tuple else _frozen(r, "a round") for r in _frozen(rounds, "rounds")
            )
            object.__setattr__(self, "rounds", rounds)

    @property
    def num_transfers(self) -> int:
        return sum(len(r) for r in self.rounds)


@dataclass(frozen=True, slots=True)
class Schedule:
    """A complete collective schedule over ``num_ranks`` ranks and ``num_chunks`` chunks."""

    algorithm: str
    num_ranks: int
    num_chunks: int
    straggler: int | None
    phases: tuple[Phase, ...]
    collective: str = "allreduce"
    metadata: Mapping[str, Any] = field(default_factory=dict, hash=False, compare=False)
    _fingerprint: str | None = field(default=None, init=False, repr=False, hash=False, compare=False)

    def __post_init__(self) -> None:
        for name in ("num_ranks", "num_chunks", "straggler"):
            if type(value := getattr(self, name)) is not int:
                object.__setattr__(self, name, _plain(value))
        check_size(self.num_ranks, self.num_chunks)
        if type(self.phases) is not tuple:  # as Phase's: nothing proved may change afterwards
            object.__setattr__(self, "phases", _frozen(self.phases, "phases"))

    @property
    def num_rounds(self) -> int:
        """All rounds, hidden ones included."""
        return sum(len(p.rounds) for p in self.phases)

    @property
    def hidden_phases(self) -> int:
        """How many leading phases run without the straggler, hidden behind its delay.

        Phases run in order, so only those before the straggler's first phase can overlap its
        delay; a schedule without a straggler waits for whichever rank is late: none is hidden.

        >>> s = Schedule("x", 3, 1, 2, (Phase("a", (0, 1), ()), Phase("b", (0, 1, 2), ())))
        >>> s.hidden_phases
        1
        """
        if self.straggler is None:
            return 0
        return next((i for i, p in enumerate(self.phases) if self.straggler in p.ranks), len(self.phases))

    @property
    def late_rank(self) -> int:
        """The rank a run of this schedule takes for the late one unless told otherwise: its
        straggler, else the last rank.

        Ring and RHD have no straggler, yet a delay can be asked of them (to compare them with
        StragglAR on the same delay): it falls on the last rank, and since every rank takes part in
        their first round, all their rounds wait for it, as the engine's own AllReduce would.  Every
        layer that makes a rank late (the runtime, ``stragglar run``, the DDP hook) asks this.

        >>> Schedule("ring", 3, 1, None, ()).late_rank, Schedule("stragglar", 3, 1, 0, ()).late_rank
        (2, 0)
        """
        return self.straggler if self.straggler is not None else self.num_ranks - 1

    @property
    def exposed_rounds(self) -> int:
        """Rounds after the straggler arrives (every round without a straggler)."""
        return sum(len(p.rounds) for p in self.phases[self.hidden_phases :])

    @property
    def exposed_steps(self) -> int:
        """Chunk-steps after the straggler arrives: what :func:`round_lower_bound` bounds.

        A round in which some rank sends or receives k chunks takes as long as k rounds of one
        chunk (a port moves one chunk per step), so it counts k.  For the schedules stragglar
        generates every exposed round moves one chunk per port and this equals
        :attr:`exposed_rounds`.

        >>> t = Transfer(0, 1, 0), Transfer(0, 1, 1)
        >>> Schedule("x", 2, 2, None, (Phase("p", (0, 1), (t,)),)).exposed_steps
        2
        """
        return sum(max(1, round_load(rnd)) for p in self.phases[self.hidden_phases :] for rnd in p.rounds)

    @property
    def num_transfers(self) -> int:
        return sum(p.num_transfers for p in self.phases)

    def transfers(self) -> Iterator[tuple[int, int, Transfer]]:
        """Yield ``(phase_index, round_index, transfer)`` in execution order."""
        for pi, phase in enumerate(self.phases):
            for ri, rnd in enumerate(phase.rounds):
                for t in rnd:
                    yield pi, ri, t

    @property
    def fingerprint(self) -> str:
        """A digest of everything equality compares (not metadata), computed once per schedule.

        Hashing a schedule walks every transfer (milliseconds at N = 64); caches that are asked
        once per gradient bucket key on this instead, which costs a dictionary lookup after the
        first call.  It is the same in every process for equal schedules.

        >>> a = Schedule("x", 2, 1, None, (Phase("p", (0, 1), ((Transfer(0, 1, 0),),)),))
        >>> b = Schedule("x", 2, 1, None, (Phase("p", (0, 1), ((Transfer(1, 0, 0),),)),))
        >>> from dataclasses import replace
        >>> a.fingerprint == replace(a, metadata={"k": 1}).fingerprint, a.fingerprint == b.fingerprint
        (True, False)
        """
        if self._fingerprint is None:
            digest = hashlib.blake2b(digest_size=16)
            head = (self.algorithm, self.collective, self.num_ranks, self.num_chunks, self.straggler)
            digest.update(repr(head).encode())
            for phase in self.phases:
                digest.update(repr((phase.name, phase.ranks, len(phase.rounds))).encode())
                for rnd in phase.rounds:
                    digest.update(_round_bytes(rnd))
            object.__setattr__(self, "_fingerprint", digest.hexdigest())
        assert self._fingerprint is not None
        return self._fingerprint


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic collector while building a large schedule.

    A schedule is millions of small acyclic tuples that all stay alive; each generation-0
    collection would walk them again, which makes building one at N = 1024 about twice as
    slow.  It restores the collector only if it was on, so a caller's own pause survives.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def check_size(num_ranks: int, num_chunks: int) -> None:
    """Refuse, before anything is allocated, a schedule larger than stragglar handles.

    >>> check_size(4096, 4095)
    Traceback (most recent call last):
    ...
    stragglar.errors.InputError: 4096 ranks: stragglar handles at most 2048
    """
    num_ranks, num_chunks = as_int(num_ranks, "num_ranks"), as_int(num_chunks, "num_chunks")
    if num_ranks > MAX_RANKS:
        raise InputError(f"{num_ranks} ranks: stragglar handles at most {MAX_RANKS}")
    if num_chunks > MAX_CHUNKS:
        raise InputError(f"{num_chunks} chunks: stragglar handles at most {MAX_CHUNKS}")
    if num_ranks * num_chunks > MAX_CELLS:
        raise InputError(
            f"{num_ranks} ranks x {num_chunks} chunks: stragglar handles at most "
            f"{MAX_CELLS:,} (rank, chunk) cells"
        )


_OP_CODES = {Op.COPY: 0, Op.REDUCE: 1}


def _round_bytes(rnd: Round) -> bytes:
    """A round as bytes: its length, then (src, dst, chunk, op code) per transfer."""
    values = [len(rnd)]
    for t in rnd:
        values += (t.src, t.dst, t.chunk, _OP_CODES.get(t.op, 2))
    try:
        return array("q", values).tobytes()
    except (OverflowError, TypeError):  # a malformed transfer (huge or non-int fields): still distinct
        return repr(rnd).encode()


_SOURCE, _DESTINATION = operator.itemgetter(0), operator.itemgetter(1)


def round_load(rnd: Round) -> int:
    """The most chunks any rank sends or receives in ``rnd`` (0 for an idle round).

    The cost model asks this of every round of every schedule it prices (37.7 million transfers
    for ``stragglar cost -n 2048``), so the counting is done by C loops (``map``, ``set``,
    ``Counter``), not a Python loop per transfer: 1.4-3.1x faster at N = 1024.

    >>> round_load((Transfer(0, 1, 0), Transfer(0, 1, 1), Transfer(2, 3, 0)))
    2
    """
    transfers = len(rnd)
    if not transfers:
        return 0
    sources, destinations = list(map(_SOURCE, rnd)), list(map(_DESTINATION, rnd))
    if len(set(sources)) == transfers and len(set(destinations)) == transfers:
        return 1  # most rounds: every rank sends and receives at most one chunk
    return max(max(Counter(sources).values()), max(Counter(destinations).values()))


def round_lower_bound(num_ranks: int, num_chunks: int | None = None) -> int:
    """C + ceil(log2 n) - 1: exposed chunk-steps no schedule with a straggler can beat.

    With the paper's C = n - 1 chunks this is R*(n) = n - 2 + ceil(log2 n).  The straggler
    contributes to one chunk per step, so the last chunk is complete, at two holders, no earlier
    than step C - 1; doubling to n holders takes ceil(log2 n) - 1 more steps.

    >>> [round_lower_bound(n) for n in (2, 3, 4, 6, 8)], round_lower_bound(8, 32)
    ([1, 3, 4, 7, 9], 34)
    """
    n = as_int(num_ranks, "num_ranks")  # None was a TypeError on '<', NaN had no bit_length
    if n < 2:
        raise InputError(f"StragglAR needs at least 2 GPUs, got {n}")
    chunks = n - 1 if num_chunks is None else as_int(num_chunks, "num_chunks", minimum=1)
    return chunks + max(1, (n - 1).bit_length()) - 1


_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_.+-]")


def base_name(schedule: Schedule) -> str:
    """``stragglar-n8-s7``: the stem of file and artifact names, so no two schedules share one.

    Executors cache plans by name, so the chunk count is part of it where a straggler-aware
    schedule does not use the paper's N-1: ``stragglar-n8-s7-c32``.

    A file's ``algorithm`` may be any string: what a name cannot hold (anything but letters, digits
    and ``_ . + -``, e.g. a terminal's control characters) becomes ``_``, and it is cut to 64
    characters, so the name is one every executor and file system takes.

    >>> s = Schedule("stragglar", 8, 32, 7, ())
    >>> base_name(s), base_name(Schedule("ring", 8, 8, None, ()))
    ('stragglar-n8-s7-c32', 'ring-n8')
    >>> base_name(Schedule("\x1b[2J mine/2", 4, 4, None, ()))
    '__2J_mine_2-n4'
    """
    name = f"{_NAME_UNSAFE.sub('_', schedule.algorithm[:64])}-n{schedule.num_ranks}"
    if schedule.straggler is not None:
        name += f"-s{schedule.straggler}"
        if schedule.num_chunks != schedule.num_ranks - 1:
            name += f"-c{schedule.num_chunks}"
    return name


def _check_schedule(schedule: object) -> Schedule:
    if not isinstance(schedule, Schedule):
        raise ArgumentError(f"expected a Schedule, got {type(schedule).__name__}")
    return schedule


def check_num_ranks(num_ranks: Any) -> int:
    """``num_ranks`` as an int that a generator can build a schedule for: 2 to :data:`MAX_RANKS`.

    >>> check_num_ranks(1)
    Traceback (most recent call last):
    ...
    stragglar.errors.InputError: need 2 to 2048 GPUs, got 1
    """
    n = as_int(num_ranks, "num_ranks")
    if not 2 <= n <= MAX_RANKS:
        raise InputError(f"need 2 to {MAX_RANKS} GPUs, got {n}")
    return n


def relabel_ranks(schedule: Schedule, mapping: Sequence[int]) -> Schedule:
    """Return ``schedule`` with rank ``r`` renamed ``mapping[r]``.

    Generators build StragglAR with the straggler last; relabelling moves it to any rank.

    >>> s = Schedule("x", 2, 1, 1, (Phase("p", (0, 1), ((Transfer(0, 1, 0),),)),))
    >>> relabel_ranks(s, [1, 0]).phases[0].rounds[0][0]
    Transfer(src=1, dst=0, chunk=0, op=<Op.COPY: 'copy'>)
    """
    _check_schedule(schedule)
    if not isinstance(mapping, Iterable) or isinstance(mapping, (str, bytes)):
        raise ArgumentError(f"mapping must be a sequence of ranks, got {type(mapping).__name__}")
    # plain ints: NumPy's would give another fingerprint, and True a rank that no file can hold
    m = [as_int(r, "a rank of mapping") for r in mapping]
    if sorted(m) != list(range(schedule.num_ranks)):
        raise InputError(f"mapping must be a permutation of 0..{schedule.num_ranks - 1}")
    try:
        phases = tuple(
            Phase(
                p.name,
                tuple(m[r] for r in p.ranks),
                tuple(
                    tuple([Transfer(m[src], m[dst], k, op) for src, dst, k, op in rnd]) for rnd in p.rounds
                ),
            )
            for p in schedule.phases
        )
        straggler = None if schedule.straggler is None else m[schedule.straggler]
    except (IndexError, TypeError, ValueError, AttributeError) as e:  # a rank no mapping renames
        raise ArgumentError(
            f"schedule {schedule.algorithm!r} names a rank outside 0..{schedule.num_ranks - 1} or "
            f"holds something other than Transfers ({e}): stragglar.verify.find_violation says where"
        ) from None
    return Schedule(
        schedule.algorithm,
        schedule.num_ranks,
        schedule.num_chunks,
        straggler,
        phases,
        schedule.collective,
        dict(schedule.metadata),
    )


def move_straggler(schedule: Schedule, straggler: int) -> Schedule:
    """Relabel so that the schedule's straggler becomes rank ``straggler``.

    The other ranks keep their relative order, so the result stays deterministic.

    >>> s = Schedule("x", 3, 1, 2, (Phase("p", (0, 1, 2), ((Transfer(2, 0, 0),),)),))
    >>> move_straggler(s, 0).phases[0].rounds[0][0]
    Transfer(src=0, dst=1, chunk=0, op=<Op.COPY: 'copy'>)
    """
    n = _check_schedule(schedule).num_ranks
    if schedule.straggler is None:
        raise InputError(f"schedule '{schedule.algorithm}' has no straggler to move")
    straggler = as_rank(straggler, "straggler", n)
    others = [r for r in range(n) if r != straggler]
    mapping = [0] * n
    old_others = [r for r in range(n) if r != schedule.straggler]
    for old, new in zip(old_others, others, strict=True):
        mapping[old] = new
    mapping[schedule.straggler] = straggler
    return relabel_ranks(schedule, mapping)
