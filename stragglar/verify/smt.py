"""A second proof that a schedule is a correct AllReduce, by the z3 SMT solver.

It shares only the IR and the reporting vocabulary (:mod:`stragglar.verify.report`) with
:mod:`stragglar.verify.simulate`, so a bug in one prover is caught by the other.  Two kinds of
query cover the whole model of :mod:`stragglar.schedule`:

* **Structure** (one query for all rounds; satisfiable means sound).  Each transfer becomes ground
  facts about uninterpreted functions of that round: ``sends_to(src) = dst``,
  ``receives_from(dst) = src`` and ``writer(dst, chunk) = i``, plus its ranks and chunk in range,
  ``src != dst``, a known op and membership of the phase.  A function has one value per
  argument, so the facts have a model exactly when every rank sends to at most one peer and
  receives from at most one peer (several chunks to that one peer are allowed) and no value is
  written twice.  When they have none, rounds are added one at a time to a second solver with
  every fact named, and the unsat core of the first round that fails names the transfers.  The
  facts are written as SMT-LIB text, which z3 parses in C++: building 10**6 terms through the
  Python API would cost more than all the solving.
* **Values** (one query per chunk, as chunks never mix; unsatisfiable means correct).  Every
  (rank, chunk) gets an uninterpreted input, the rounds run symbolically into z3 sum terms, and
  the solver is asked for inputs under which some rank's final value differs from the sum of all
  inputs.  Unsat is the proof; a model is a concrete counter-example.

The inputs are reals, not bit-vectors: over the reals ``k*x = x`` forces ``k = 1`` or ``x = 0``,
so a contribution counted twice or never leaves a nonzero linear difference that some input makes
visible.  A ``w``-bit vector wraps modulo ``2**w``, and as reduce counts can double every round no
fixed width is safe.  Linear real sums are also what z3 normalises best: a correct chunk is
refuted by rewriting alone, which keeps 256 ranks within seconds.

>>> from stragglar.schedule import Op, Phase, Schedule, Transfer
>>> swap = (Transfer(0, 1, 0, Op.REDUCE), Transfer(1, 0, 0, Op.REDUCE))
>>> smt_find_violation(Schedule("demo", 2, 1, None, (Phase("exchange", (0, 1), (swap,)),))) is None
True
>>> v = smt_find_violation(Schedule("demo", 2, 1, None, (Phase("exchange", (0, 1), (swap, swap)),)))
>>> str(v.kind), v.rank, v.chunk, v.counterexample.expected != v.counterexample.actual
('duplicate', 0, 0, True)
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from fractions import Fraction

import z3

from stragglar.args import as_seconds
from stragglar.errors import InputError, ResourceError
from stragglar.renamed import renamed
from stragglar.schedule import Op, Phase, Round, Schedule, Transfer
from stragglar.units import format_seconds
from stragglar.verify.report import (
    CounterExample,
    Kind,
    Proof,
    VerificationError,
    Violation,
    Where,
    check_header,
    check_transfer,
    chunk_range_violation,
    double_write_violation,
    issue_proof,
    membership_violation,
    op_violation,
    origin,
    port_violation,
    rank_list,
    rank_range_violation,
    self_violation,
)

__all__ = ["SMT_MAX_CELLS", "SMT_MAX_TRANSFERS", "smt_check", "smt_find_violation", "smt_prove"]

# z3's work grows faster than the schedule (N = 256: 130,050 transfers, 6 s, 0.21 GB; N = 512:
# 522,242 transfers, 30 s, 0.43 GB on 2 cores; N = 2048 would take many minutes and GBs), so a
# larger schedule is refused before the solver starts: the simulator proves any size in seconds.
SMT_MAX_TRANSFERS = 600_000
SMT_MAX_CELLS = 512 * 512  # ranks x chunks: z3 gets a term per rank for every chunk, transfers or not

_PAIRWISE = ("send-port", "receive-port", "double-write")  # rules two transfers break together


def smt_prove(schedule: Schedule, timeout_s: float | None = None) -> Proof:
    """Prove ``schedule`` a correct AllReduce with z3; raises :class:`VerificationError` if it is not
    (and :class:`~stragglar.errors.ResourceError` past ``timeout_s``: see :func:`smt_find_violation`)."""
    start = time.perf_counter()
    violation = smt_find_violation(schedule, timeout_s)
    if violation is not None:
        raise VerificationError(violation)
    return issue_proof(schedule, "z3", time.perf_counter() - start)


def smt_find_violation(schedule: Schedule, timeout_s: float | None = None) -> Violation | None:
    """Return why ``schedule`` is not a correct AllReduce, or None once z3 has proved that it is.

    A structural violation is reported before any wrong value, since values are only
    meaningful for a well-formed schedule.  ``timeout_s`` bounds the whole proof: z3's queries
    and the symbolic runs between them (most of the time on many chunks: 64 ranks with 4,000
    chunks ran for minutes); past it, a :class:`~stragglar.errors.ResourceError` says that
    nothing was decided, rather than a proof or a violation.
    """
    clock = _Clock(None if timeout_s is None else as_seconds(timeout_s, "timeout_s", positive=True))
    if check_header(schedule).collective != "allreduce":
        raise InputError(f"can only verify allreduce schedules, not {schedule.collective!r}")
    cells = schedule.num_ranks * schedule.num_chunks
    if cells > SMT_MAX_CELLS:
        raise InputError(
            f"z3 proves schedules of at most {SMT_MAX_CELLS:,} ranks x chunks (N = 512 takes ~30 s, 0.4 GB); "
            f"this one has {cells:,}: the simulator (verify without --smt) proves it"
        )
    if schedule.num_transfers > SMT_MAX_TRANSFERS:
        raise InputError(
            f"z3 proves schedules of at most {SMT_MAX_TRANSFERS:,} transfers (N = 512 takes ~30 s, 0.4 GB); "
            f"this one has {schedule.num_transfers:,}: the simulator (verify without --smt) proves it"
        )
    rounds = _rounds(schedule)
    violation = _structure_violation(schedule, rounds, clock)
    if violation is not None:
        return violation
    steps = _steps_by_chunk(rounds)
    solver = z3.Solver()  # one for all chunks, each in its own scope: creating solvers costs more
    for chunk in range(schedule.num_chunks):
        clock.check(solver, f"at chunk {chunk:,} of {schedule.num_chunks:,}")
        violation = _chunk_violation(solver, schedule.num_ranks, chunk, steps[chunk], clock)
        if violation is not None:
            return violation
    return None


class _Clock:
    """The time left to a proof of at most ``timeout_s`` seconds (None: no limit).

    :meth:`check` is called before each step of work: it raises once the time is spent, and
    otherwise gives z3 what is left, so that no single query outlasts the limit either (z3 then
    answers unknown, which :meth:`spent` turns into the same error)."""

    def __init__(self, timeout_s: float | None) -> None:
        self.timeout_s = timeout_s
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def check(self, solver: z3.Solver, where: str) -> None:
        if self.deadline is None:
            return
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise self.spent(where)
        solver.set("timeout", max(1, int(left * 1000)))

    def spent(self, where: str) -> ResourceError:
        assert self.timeout_s is not None
        return ResourceError(f"z3 did not finish the proof within {format_seconds(self.timeout_s)} ({where})")


smt_check = renamed(
    "stragglar.verify.smt.smt_check", "stragglar.verify.smt.smt_find_violation", smt_find_violation
)


def _rounds(schedule: Schedule) -> list[tuple[Where, Phase, Round]]:
    """Every round with its place; a transfer that is not the IR's is refused here, before its
    fields are written into z3's text."""
    rounds = []
    for pi, phase in enumerate(schedule.phases):
        for ri, rnd in enumerate(phase.rounds):
            where = Where(pi, phase.name, ri)
            for t in rnd:
                check_transfer(t, where)
            rounds.append((where, phase, rnd))
    return rounds


_RULES = ("range", "self", "op", "membership", "send-port", "receive-port", "double-write")
_PARSED_LINES = 20_000  # lines of rules z3 parses in one call: ~0.1 s, the longest a Ctrl-C waits here


def _structure_violation(
    schedule: Schedule, rounds: list[tuple[Where, Phase, Round]], clock: _Clock
) -> Violation | None:
    """The first round whose transfers break the rules, located by an unsat core, or None."""
    n, c = schedule.num_ranks, schedule.num_chunks
    solver = z3.Solver()
    solver.from_string("\n".join(_preamble(n, c, schedule.phases)))
    for batch in _batches(n, rounds):
        clock.check(solver, "in the rounds' structure")
        holds = _rounds_hold(solver, batch)
        if holds is None and clock.deadline is not None:
            raise clock.spent("in the rounds' structure")
        if not holds:
            return _located_structure_violation(schedule, rounds, clock)
    return None


def _batches(n: int, rounds: list[tuple[Where, Phase, Round]]) -> Iterator[list[str]]:
    """The rules of consecutive rounds, about :data:`_PARSED_LINES` lines at a time."""
    batch: list[str] = []
    for r in rounds:
        batch += _round_rules(n, *r, named=False)
        if len(batch) >= _PARSED_LINES:
            yield batch
            batch = []
    if batch:
        yield batch


def _rounds_hold(solver: z3.Solver, batch: list[str]) -> bool | None:
    """Whether one batch of rounds keeps the rules, checked in a scope of its own.

    Rounds share nothing but the preamble, so the schedule holds iff every batch does, and the
    batches are solved one at a time: z3 parses a text, and simplifies a large problem, in calls
    that a Ctrl-C cannot stop (N = 512 in one piece: 20-40 s before it was answered).
    """
    solver.push()
    try:
        solver.from_string("\n".join(batch))
        verdict = solver.check()
        return None if verdict == z3.unknown else verdict == z3.sat  # unknown: out of time
    finally:
        solver.pop()


def _located_structure_violation(
    schedule: Schedule, rounds: list[tuple[Where, Phase, Round]], clock: _Clock
) -> Violation:
    """The first round that breaks the rules, named by an unsat core: only for a schedule that does."""
    n, c = schedule.num_ranks, schedule.num_chunks
    tracked = z3.Solver()
    options = ["(set-option :produce-unsat-cores true)", "(set-option :smt.core.minimize true)"]
    tracked.from_string("\n".join(options + _preamble(n, c, schedule.phases)))
    for where, phase, rnd in rounds:
        clock.check(tracked, f"locating the rule broken, at {where}")
        tracked.from_string("\n".join(_round_rules(n, where, phase, rnd, named=True)))
        verdict = tracked.check()
        if verdict == z3.unknown and clock.deadline is not None:
            raise clock.spent(f"locating the rule broken, at {where}")
        if verdict == z3.unsat:  # earlier rounds hold, so this round's labels are unsat alone
            core = [_label(str(name)) for name in tracked.unsat_core()]
            here = sorted(
                ((kind, i) for kind, at, i in core if at == (where.phase, where.round)), key=_second
            )
            return _structural(where, phase, rnd, here, schedule)
    raise RuntimeError("z3 rejected the rules of the whole schedule but of no prefix of its rounds")


def _preamble(n: int, c: int, phases: Sequence[Phase]) -> list[str]:
    """Predicates every round uses: a rank or chunk in range, a known op (copy 0, reduce 1), and
    per phase P ``member.P``, true exactly for the phase's ranks."""
    lines = [
        f"(define-fun rank ((x Int)) Bool (and (<= 0 x) (< x {n})))",
        f"(define-fun chunk ((x Int)) Bool (and (<= 0 x) (< x {c})))",
        "(define-fun op ((x Int)) Bool (or (= x 0) (= x 1)))",
    ]
    for index, phase in enumerate(phases):
        inside = set(phase.ranks)
        lines.append(f"(declare-fun member.{index} (Int) Bool)")
        facts = [f"(member.{index} {r})" if r in inside else f"(not (member.{index} {r}))" for r in range(n)]
        lines += [f"(assert {fact})" for fact in facts]
    return lines


def _round_rules(n: int, where: Where, phase: Phase, rnd: Round, named: bool) -> list[str]:
    """One round's transfers as facts about its functions; ``named`` labels each for an unsat core."""
    tag = f"{where.phase}.{where.round}"
    member = f"member.{where.phase}"
    lines = [
        f"(declare-fun sends_to.{tag} (Int) Int)",
        f"(declare-fun receives_from.{tag} (Int) Int)",
        f"(declare-fun writer.{tag} (Int Int) Int)",
    ]
    for i, t in enumerate(rnd):
        src, dst, chunk = _int(t.src), _int(t.dst), _int(t.chunk)
        op = 0 if t.op is Op.COPY else 1 if t.op is Op.REDUCE else _int(-1)
        rules = (
            f"(and (rank {src}) (rank {dst}) (chunk {chunk}))",
            f"(distinct {src} {dst})",
            f"(op {op})",
            f"(and ({member} {src}) ({member} {dst}))",
            f"(= (sends_to.{tag} {src}) {dst})",
            f"(= (receives_from.{tag} {dst}) {src})",
            f"(= (writer.{tag} {dst} {chunk}) {i})",
        )
        if named:
            lines += [
                f"(assert (! {rule} :named {kind}.{tag}.{i}))"
                for kind, rule in zip(_RULES, rules, strict=True)
            ]
        else:
            lines.append(f"(assert (and {' '.join(rules)}))")
    return lines


def _int(value: int) -> str:
    """An SMT-LIB integer literal (which has no negative numerals)."""
    return f"{value:d}" if value >= 0 else f"(- {-value:d})"


def _second(rule: tuple[str, int]) -> int:
    return rule[1]


def _label(name: str) -> tuple[str, tuple[int, int], int]:
    """``kind.phase.round.index`` back to its parts."""
    kind, phase, rnd, index = name.split(".")
    return kind, (int(phase), int(rnd)), int(index)


def _structural(
    where: Where, phase: Phase, rnd: Round, core: list[tuple[str, int]], s: Schedule
) -> Violation:
    """Describe an unsat core: one transfer breaking a rule alone, or the later of two conflicting."""
    single = [rule for rule in core if rule[0] not in _PAIRWISE]
    kind, index = single[0] if single else core[-1]
    t = rnd[index]
    if kind == "range":
        rank = next((r for r in (t.src, t.dst) if not 0 <= r < s.num_ranks), None)
        if rank is not None:
            return rank_range_violation(where, t, rank, s.num_ranks)
        return chunk_range_violation(where, t, s.num_chunks)
    if kind == "self":
        return self_violation(where, t)
    if kind == "op":
        return op_violation(where, t)
    if kind == "membership":
        return membership_violation(where, t, phase.ranks)
    other = rnd[core[0][1]]
    if kind == "send-port":
        return port_violation(where, t, sending=True, other_peer=other.dst)
    if kind == "receive-port":
        return port_violation(where, t, sending=False, other_peer=other.src)
    return double_write_violation(where, t)


_Step = tuple[Where, list[Transfer]]  # one round's transfers of one chunk


def _steps_by_chunk(rounds: Sequence[tuple[Where, Phase, Round]]) -> defaultdict[int, list[_Step]]:
    steps: defaultdict[int, list[_Step]] = defaultdict(list)
    for where, _, rnd in rounds:
        touched: defaultdict[int, list[Transfer]] = defaultdict(list)
        for t in rnd:
            touched[t.chunk].append(t)
        for chunk, transfers in touched.items():
            steps[chunk].append((where, transfers))
    return steps


def _chunk_violation(
    solver: z3.Solver, n: int, chunk: int, steps: list[_Step], clock: _Clock
) -> Violation | None:
    """Run ``chunk`` symbolically and ask z3 for inputs that make some rank's final value wrong.

    One query covers all ranks; only if it is satisfiable are the ranks asked one by one, so
    that the rank reported is the first one that can be wrong, whatever model z3 happens to pick.
    """
    inputs = [z3.Real(f"x_{r}_{chunk}") for r in range(n)]
    value: list[z3.ArithRef] = list(inputs)
    last: list[tuple[Where, Transfer] | None] = [None] * n
    for where, transfers in steps:  # every transfer reads the state from before its round
        writes = [(t, value[t.src] + value[t.dst] if t.op is Op.REDUCE else value[t.src]) for t in transfers]
        for t, term in writes:
            value[t.dst] = term
            last[t.dst] = (where, t)
    total = z3.Sum(inputs)
    distinct = {term.get_id(): term for term in value}  # copies share terms: ask once per term
    if _model(solver, z3.Or([term != total for term in distinct.values()]), chunk, clock) is None:
        return None
    for rank, term in enumerate(value):
        model = _model(solver, term != total, chunk, clock)
        if model is not None:
            numbers = tuple(_number(model, x) for x in inputs)
            example = CounterExample(chunk, numbers, rank, _number(model, total), _number(model, term))
            return _wrong_value(example, _coefficients(term, inputs), last[rank])
    raise RuntimeError(f"z3 found chunk {chunk} wrong at some rank but at none alone")


def _model(solver: z3.Solver, claim: z3.BoolRef, chunk: int, clock: _Clock) -> z3.ModelRef | None:
    """A model of ``claim`` or None when it is unsatisfiable, leaving ``solver`` as it was."""
    solver.push()
    solver.add(claim)
    verdict = solver.check()
    model = solver.model() if verdict == z3.sat else None
    solver.pop()
    if verdict == z3.unknown:
        if clock.deadline is not None and solver.reason_unknown() in ("timeout", "canceled"):
            raise clock.spent(f"at chunk {chunk:,}")
        raise RuntimeError(f"z3 could not decide chunk {chunk}: {solver.reason_unknown()}")
    return model


def _number(model: z3.ModelRef, term: z3.ArithRef) -> Fraction:
    value = model.eval(term, model_completion=True)
    return Fraction(value.numerator_as_long(), value.denominator_as_long())


def _coefficients(term: z3.ArithRef, inputs: list[z3.ArithRef]) -> list[Fraction]:
    """How many times ``term`` counts each input: its value at each unit vector."""
    zero, one = z3.RealVal(0), z3.RealVal(1)
    coefficients: list[Fraction] = []
    for x in inputs:
        unit = z3.simplify(z3.substitute(term, *[(y, one if y.eq(x) else zero) for y in inputs]))
        coefficients.append(Fraction(unit.as_fraction()))
    return coefficients


def _wrong_value(
    example: CounterExample, coefficients: list[Fraction], last: tuple[Where, Transfer] | None
) -> Violation:
    """A final value that is not the sum, described by the contributions it counts wrongly."""
    doubled = [r for r, k in enumerate(coefficients) if k > 1]
    lacking = [r for r, k in enumerate(coefficients) if k == 0]
    parts = [f"counts {_ranks(doubled)} more than once"] if doubled else []
    parts += [f"lacks {_ranks(lacking)}"] if lacking else []
    kind = Kind.DUPLICATE if doubled else Kind.MISSING
    value = f"rank {example.rank} chunk {example.chunk}"
    head = f"final state: {value} {' and '.join(parts)}; z3 counter-example: {example}"
    if last is None:
        message = f"{head} (never written)"
        return Violation(kind, None, None, None, None, example.rank, example.chunk, message, example)
    where, t = last
    fields = (where.phase, where.name, where.round, t, example.rank, example.chunk)
    return Violation(kind, *fields, f"{head} ({origin(where, t)})", example)


def _ranks(ranks: list[int]) -> str:
    return f"ranks {rank_list(ranks)}"
