"""The vocabulary every prover reports in: where, what kind, the violation, and the proof.

The symbolic simulator and the z3 checker share nothing but the IR and this module, so that a
bug in one is caught by the other; what they must agree on is how they *say* things, which is
defined here once: the place of a round (:class:`Where`), the kinds of violation
(:class:`Kind`), the sentence naming a faulty transfer (one builder per structural rule), and the
:class:`Proof` a prover hands out.  The provers of exported artifacts (MSCCL XML, MSCCL++ plans)
report in it too: each proof is an :class:`ArtifactProof`, so that the command line, the proof
tier and the benchmarks read any of them by the same names.

A :class:`Proof` carries the schedule it is about and can only be made by a prover of this
package (:func:`issue_proof`): exporters, the runtime, release and the DDP hook take a ``Proof``,
so nothing is proved twice and nothing unproved is exported or run.

>>> from stragglar.schedule import Op, Phase, Schedule, Transfer
>>> where = Where(1, "exchange", 2)
>>> print(self_violation(where, Transfer(3, 3, 0, Op.COPY)))
phase 1 'exchange' round 2: transfer 3->3 chunk 0 (copy) sends rank 3 chunk 0 to itself
>>> rank_list([0, 3, 5]), rank_list(range(12), shown=3)
('[0, 3, 5]', '[0, 1, 2, ... (9 more)]')
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from fractions import Fraction

from stragglar.args import as_int, as_rank
from stragglar.errors import ArgumentError, IncorrectError, InputError
from stragglar.schedule import Op, Phase, Schedule, Transfer, round_lower_bound
from stragglar.units import count_of

__all__ = [
    "ArtifactProof",
    "CounterExample",
    "Kind",
    "Proof",
    "VerificationError",
    "Violation",
    "Where",
    "bit_list",
    "check_header",
    "check_transfer",
    "chunk_range_violation",
    "double_write_violation",
    "duplicate_at",
    "issue_proof",
    "membership_violation",
    "op_violation",
    "origin",
    "port_violation",
    "rank_list",
    "rank_range_violation",
    "require_proof",
    "self_violation",
]

SHOWN_RANKS = 8  # ranks named in a message before it says "... (k more)"


def check_header(schedule: object) -> Schedule:
    """``schedule`` if it is a :class:`~stragglar.schedule.Schedule` whose header makes sense: at
    least one rank and one chunk, a straggler that is one of its ranks, phases of distinct ranks
    in range.  Every prover asks this first: a schedule made in Python, not read from a file,
    was proved with a straggler of 7 out of 2 ranks, and a run then blamed its ``late_rank``.

    >>> from stragglar.schedule import Schedule
    >>> check_header(Schedule("x", 2, 1, 7, ()))
    Traceback (most recent call last):
    ...
    stragglar.errors.InputError: straggler must be a rank in 0..1, got 7
    """
    if not isinstance(schedule, Schedule):
        raise ArgumentError(f"expected a Schedule, got {type(schedule).__name__}")
    for name, text in (("algorithm", schedule.algorithm), ("collective", schedule.collective)):
        if not isinstance(text, str) or not text:  # every writer names the schedule by them
            raise ArgumentError(f"a schedule's {name} must be a non-empty str, got {text!r}")
    n = as_int(schedule.num_ranks, "num_ranks", minimum=1)
    as_int(schedule.num_chunks, "num_chunks", minimum=1)
    if schedule.straggler is not None:
        as_rank(schedule.straggler, "straggler", n)
    for i, phase in enumerate(schedule.phases):
        if not isinstance(phase, Phase) or not isinstance(phase.name, str):
            what = f"a Phase named {phase.name!r}" if isinstance(phase, Phase) else type(phase).__name__
            raise ArgumentError(f"phase {i}: a schedule holds Phases named by a str, got {what}")
        ranks = [as_rank(r, f"phase {i} {phase.name!r}: a rank", n) for r in phase.ranks]
        if len(set(ranks)) != len(ranks):
            raise InputError(f"phase {i} {phase.name!r} lists a rank twice: {sorted(ranks)}")
    return schedule


class Kind(str, enum.Enum):
    """What rule a schedule breaks; a ``str`` so that ``violation.kind == "port"`` reads naturally."""

    RANGE = "range"  # a rank or chunk outside the schedule
    SELF = "self"  # a rank sending to itself
    OP = "op"  # neither copy nor reduce
    MEMBERSHIP = "membership"  # a rank outside the transfer's phase
    PORT = "port"  # a second peer on one rank's send or receive port in one round
    DOUBLE_WRITE = "double-write"  # one value written twice in one round
    DUPLICATE = "duplicate"  # a final value counting some contribution more than once
    MISSING = "missing"  # a final value lacking some contribution

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Where:
    """A round's place in a schedule, as every verifier's messages name it."""

    phase: int
    name: str
    round: int

    def __str__(self) -> str:
        return f"phase {self.phase} {self.name!r} round {self.round}"


@dataclass(frozen=True)
class CounterExample:
    """Inputs of one chunk (exact values from a solver's model) under which ``rank`` ends wrong."""

    chunk: int
    inputs: tuple[Fraction, ...]  # rank r's contribution to ``chunk``; every other chunk is irrelevant
    rank: int
    expected: Fraction
    actual: Fraction

    def __str__(self) -> str:
        nonzero = [f"rank {r}: {v}" for r, v in enumerate(self.inputs) if v]
        shown = ", ".join(nonzero[:SHOWN_RANKS]) + (", ..." if len(nonzero) > SHOWN_RANKS else "")
        return (
            f"with inputs {{{shown}}} (others 0) rank {self.rank} ends with {self.actual} "
            f"in chunk {self.chunk}, not {self.expected}"
        )


@dataclass(frozen=True)
class Violation:
    """Why a schedule is not a correct AllReduce, located where it first goes wrong.

    ``phase``, ``phase_name``, ``round`` and ``transfer`` locate the offending transfer; for a
    wrong final value they locate its last write (None if it was never written).  A prover that
    can give concrete inputs under which the value is wrong attaches them as ``counterexample``.
    """

    kind: Kind
    phase: int | None
    phase_name: str | None
    round: int | None
    transfer: Transfer | None
    rank: int
    chunk: int
    message: str
    counterexample: CounterExample | None = None

    def __str__(self) -> str:
        return self.message


class VerificationError(IncorrectError):
    """Raised by the provers; ``.violation`` says what went wrong and where."""

    def __init__(self, violation: Violation) -> None:
        super().__init__(violation.message)
        self.violation = violation


class _Seal:
    """What only :func:`issue_proof` makes: the very schedule object a prover showed correct.

    A seal names its schedule, not just its maker, so that a proof copied with another schedule
    (``dataclasses.replace(proof, schedule=s)`` passes every field on, the seal too) or changed in
    place names the wrong one and is refused, where the runtime would have run ``s`` unproved."""

    __slots__ = ("schedule",)

    def __init__(self, schedule: Schedule) -> None:
        self.schedule = schedule


@dataclass(frozen=True)
class Proof:
    """Evidence that ``schedule`` is a correct AllReduce, from the prover named in ``by``.

    Only the provers make one (see :func:`issue_proof`); code that exports or runs a schedule
    asks for a ``Proof`` (:func:`require_proof`) and so cannot be handed an unproved one.
    """

    schedule: Schedule = field(repr=False)
    by: str  # "simulator" or "z3"
    seconds: float  # how long the proof took
    _seal: object = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.sealed:
            raise ArgumentError("a Proof comes only from a prover: use stragglar.verify.prove(schedule)")

    @property
    def sealed(self) -> bool:
        """Whether a prover issued this proof for this very schedule."""
        seal = self._seal
        return isinstance(seal, _Seal) and seal.schedule is self.schedule

    @property
    def num_ranks(self) -> int:
        return self.schedule.num_ranks

    @property
    def num_chunks(self) -> int:
        return self.schedule.num_chunks

    @property
    def num_rounds(self) -> int:
        return self.schedule.num_rounds

    @property
    def exposed_rounds(self) -> int:
        return self.schedule.exposed_rounds

    @property
    def num_transfers(self) -> int:
        return self.schedule.num_transfers

    @property
    def summary(self) -> str:
        """``proved: allreduce over 4 ranks, 3 chunks, 4 rounds after the straggler (6 in all), ...``.

        Rounds after the straggler arrives are counted as :func:`_exposed` says, as in
        :attr:`headline`: a round that moves k chunks over one link is k chunk-steps."""
        s = self.schedule
        rounds = count_of(s.num_rounds, "round") if s.straggler is not None else _exposed(s)
        hidden, fat = s.exposed_rounds != s.num_rounds, s.exposed_steps != s.exposed_rounds
        if s.straggler is not None and (hidden or fat):
            rounds = f"{_exposed(s)} after the straggler"
            if hidden:
                rounds += f" ({s.num_rounds} in all)"
        text = (
            f"proved: allreduce over {count_of(s.num_ranks, 'rank')}, "
            f"{count_of(s.num_chunks, 'chunk')}, {rounds}, {count_of(s.num_transfers, 'transfer')}"
        )
        return text if self.by == "simulator" else f"{text} ({self.by}, {self.seconds:.2f} s)"

    @property
    def covers(self) -> str:
        """What the proof covers, for ``-v``: the rules of :mod:`stragglar.schedule`'s model that
        both provers check, and for how many inputs."""
        how = (
            "a symbolic run over the sets of ranks each value sums, so every input at once"
            if self.by == "simulator"
            else f"z3 found no input that gives a wrong sum ({self.seconds:.2f} s)"
        )
        return (
            f"covers, by {how}: every rank ends with every chunk summing each rank's contribution "
            "exactly once; in every round each transfer carries its sender's chunk as the round "
            "began, a rank sends to at most one peer and receives from at most one, never sends "
            "to itself, no chunk is written twice, and only the phase's ranks take part"
        )

    @property
    def headline(self) -> str:
        """One line for people (under 200 characters): who takes part, the rounds (against the
        lower bound for StragglAR), the transfers, and by whom it was proved."""
        s = self.schedule
        who = count_of(s.num_ranks, "GPU")
        if s.straggler is None:
            rounds = _exposed(s)  # every round, in chunk-steps too where some round moves several
        else:
            who += f" (straggler {s.straggler})"
            rounds = f"{_exposed(s)} after the straggler arrives{_versus_bound(s)}, {s.num_rounds} in all"
        by = "" if self.by == "simulator" else f" by {self.by} in {self.seconds:.2f} s"
        transfers = count_of(s.num_transfers, "transfer")
        return f"{s.algorithm}: {who}, {count_of(s.num_chunks, 'chunk')}, {rounds}, {transfers}; proved{by}"


def _exposed(schedule: Schedule) -> str:
    """The rounds after the straggler arrives as every summary counts them: ``9 rounds``, or
    ``9 rounds (10 chunk-steps)`` where some round moves several chunks over one link.

    The lower bound counts chunk-steps (a port moves one chunk per step), so a round that moves k
    chunks over one link counts k; rounds alone would make such a schedule look better than it
    is, so wherever the two differ both are said.

    >>> from stragglar.schedule import Phase
    >>> two = Transfer(0, 1, 0), Transfer(0, 1, 1)
    >>> _exposed(Schedule("x", 2, 2, 0, (Phase("p", (0, 1), (two,)),)))
    '1 round (2 chunk-steps)'
    """
    rounds = count_of(schedule.exposed_rounds, "round")
    if schedule.exposed_steps != schedule.exposed_rounds:
        rounds += f" ({schedule.exposed_steps} chunk-steps)"
    return rounds


def _versus_bound(schedule: Schedule) -> str:
    """How far StragglAR's exposed chunk-steps are from the lower bound; other algorithms are not
    in that model.  A gap below zero would mean the bound is wrong, and says so."""
    n, c = schedule.num_ranks, schedule.num_chunks
    if schedule.algorithm != "stragglar" or n < 2:
        return ""
    bound = round_lower_bound(n, c)
    name = f"R*({n})" if c == n - 1 else f"{c} + ceil(log2 {n}) - 1"
    gap = schedule.exposed_steps - bound
    if gap < 0:
        verdict = f"{gap:+d}, below a proved bound: please report this schedule"
    else:
        verdict = "optimal" if gap == 0 else f"{gap:+d}"
    return f" (lower bound {name} = {bound}: {verdict})"


@dataclass(frozen=True, slots=True)
class ArtifactProof(abc.ABC):
    """What the prover of an executor's file (MSCCL XML, an MSCCL++ plan) proved about its text.

    The facts every format has carry one name across formats: ``name`` (the algo's or plan's),
    ``gpus``, ``chunks`` (per loop: the chunk count times the instances), ``threadblocks`` (all
    GPUs' together) and ``seconds`` (reading and proving).  Each format's proof adds its own facts
    and says them in ``brief``, ``summary`` and ``details``.
    """

    name: str
    gpus: int
    chunks: int
    threadblocks: int
    seconds: float

    @property
    @abc.abstractmethod
    def brief(self) -> str:
        """The size of the program proved, e.g. ``94 thread blocks, 196 steps``."""

    @property
    @abc.abstractmethod
    def summary(self) -> str:
        """One line (under 200 characters): which file, what collective, how big."""

    @property
    @abc.abstractmethod
    def details(self) -> str:
        """What the proof covers, for ``-v``."""

    @property
    def warnings(self) -> tuple[str, ...]:
        """What the executor runs otherwise than the file says, yet correctly, one line each
        (``verify`` and ``show`` print them on stderr); a format that has none says nothing."""
        return ()


def require_proof(value: object) -> Proof:
    """``value`` if it is a :class:`Proof`; an :class:`~stragglar.errors.ArgumentError` (a
    TypeError, and an InputError: exit 2) that says how to get one otherwise.

    Exporters and the runtime call this first: a bare schedule passed where a proof belongs is a
    mistake Python's typing would not catch at run time.
    """
    if not isinstance(value, Proof):
        raise ArgumentError(
            f"expected a Proof, got {type(value).__name__}: prove the schedule first "
            "(stragglar.verify.prove(schedule))"
        )
    if not value.sealed:  # its schedule swapped after the prover issued it
        raise ArgumentError(
            "this Proof's schedule is not the one a prover showed correct: prove the schedule "
            "(stragglar.verify.prove(schedule))"
        )
    return value


def issue_proof(schedule: Schedule, by: str, seconds: float) -> Proof:
    """The :class:`Proof` a prover hands out once it has shown ``schedule`` correct."""
    return Proof(schedule, by, seconds, _Seal(schedule))


# ---------------------------------------------------------------------------- messages


def _at(where: Where, t: Transfer, kind: Kind, rank: int, what: str) -> Violation:
    """A violation caused by transfer ``t``; ``what`` completes the sentence naming it."""
    op = t.op.value if isinstance(t.op, Op) else repr(t.op)
    message = f"{where}: transfer {t.src}->{t.dst} chunk {t.chunk} ({op}) {what}"
    return Violation(kind, where.phase, where.name, where.round, t, rank, t.chunk, message)


def rank_range_violation(where: Where, t: Transfer, rank: int, num_ranks: int) -> Violation:
    return _at(where, t, Kind.RANGE, rank, f"names rank {rank}, outside 0..{num_ranks - 1}")


def chunk_range_violation(where: Where, t: Transfer, num_chunks: int) -> Violation:
    what = f"writes rank {t.dst} chunk {t.chunk}, outside 0..{num_chunks - 1}"
    return _at(where, t, Kind.RANGE, t.dst, what)


def self_violation(where: Where, t: Transfer) -> Violation:
    return _at(where, t, Kind.SELF, t.src, f"sends rank {t.src} chunk {t.chunk} to itself")


def check_transfer(t: object, where: Where) -> None:
    """Refuse a transfer that is not the IR's: a :class:`~stragglar.schedule.Transfer` whose
    ranks and chunk are Python ints.

    Every prover asks this of a transfer its rules do not pass, before naming a rule: a program
    that put ``True`` or a NumPy integer there had its schedule proved (``True == 1``) and then
    refused by every writer after the proof, and a float or a plain tuple broke the provers
    with Python's own errors.
    """
    if type(t) is not Transfer:
        raise ArgumentError(f"{where}: a round holds Transfers, got {type(t).__name__} {t!r:.60}")
    for name, value in zip(("src", "dst", "chunk"), t, strict=False):
        if type(value) is not int:
            kind = type(value)
            raise ArgumentError(
                f"{where}: transfer {t.src}->{t.dst} chunk {t.chunk}: its {name} must be a Python "
                f"int, got {value!r} ({kind.__module__ + '.' if kind.__module__ != 'builtins' else ''}"
                f"{kind.__name__})"
            )


def op_violation(where: Where, t: Transfer) -> Violation:
    what = f"gives rank {t.dst} op {t.op!r}, which is neither Op.COPY nor Op.REDUCE"
    return _at(where, t, Kind.OP, t.dst, what)


def membership_violation(where: Where, t: Transfer, members: Collection[int]) -> Violation:
    rank = t.src if t.src not in members else t.dst
    return _at(where, t, Kind.MEMBERSHIP, rank, f"involves rank {rank}, which is not in this phase")


def port_violation(where: Where, t: Transfer, *, sending: bool, other_peer: int) -> Violation:
    """``t`` gives a rank a second peer on its send (``sending``) or receive port in one round."""
    if sending:
        return _at(
            where, t, Kind.PORT, t.src, f"makes rank {t.src} send to a second peer (rank {other_peer})"
        )
    what = f"makes rank {t.dst} receive from a second peer (rank {other_peer})"
    return _at(where, t, Kind.PORT, t.dst, what)


def double_write_violation(where: Where, t: Transfer) -> Violation:
    return _at(where, t, Kind.DOUBLE_WRITE, t.dst, f"writes rank {t.dst} chunk {t.chunk} twice in one round")


def duplicate_at(where: Where, t: Transfer, what: str) -> Violation:
    """A reduce by ``t`` that counts some contribution twice; ``what`` names them."""
    return _at(where, t, Kind.DUPLICATE, t.dst, what)


def origin(where: Where, t: Transfer) -> str:
    """``last written in phase 1 'exchange' round 3 by 2->5 chunk 4 copy``: where a value came from."""
    return f"last written in {where} by {t.src}->{t.dst} chunk {t.chunk} {t.op.value}"


def rank_list(ranks: Iterable[int], shown: int = SHOWN_RANKS) -> str:
    """``[0, 3, 5]``: the first ``shown`` ranks and a count of the rest."""
    names = list(ranks)
    more = f", ... ({len(names) - shown} more)" if len(names) > shown else ""
    return f"[{', '.join(map(str, names[:shown]))}{more}]"


def bit_list(mask: int, shown: int = SHOWN_RANKS) -> str:
    """:func:`rank_list` of the set bits of ``mask``.

    >>> bit_list(0b101001), bit_list((1 << 12) - 1, shown=3)
    ('[0, 3, 5]', '[0, 1, 2, ... (9 more)]')
    """
    bits: list[int] = []
    while mask:
        low = mask & -mask
        bits.append(low.bit_length() - 1)
        mask ^= low
    return rank_list(bits, shown)
