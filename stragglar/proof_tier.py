"""The CI proof tier: prove every algorithm's schedule for a range of sizes, by z3 and by the simulator.

Within the z3 range each schedule is proved twice, by provers that share no code; beyond it the
simulator, which takes milliseconds where z3 takes seconds, carries on alone.  Rows come out one
proof at a time, for a command to print as a table while the proofs run; how many will come is
known before the first (:func:`proof_count`), for a progress bar's total.  A schedule file past
what z3 takes is proved by the simulator alone, and says so (:class:`Skipped`): z3 would refuse
it before starting, and the simulator proves any size, so the file is not wrong for it.

>>> rows = list(prove_all(max_smt=3, max_baseline_smt=2, max_simulated=3))
>>> [(r.algorithm, r.num_ranks, r.rounds, r.lower_bound, r.method) for r in rows[:3]]
[('stragglar', 2, 1, 1, 'smt'), ('stragglar', 2, 1, 1, 'simulate'), ('stragglar', 3, 3, 3, 'smt')]
>>> len(rows) == proof_count(max_smt=3, max_baseline_smt=2, max_simulated=3)
True
>>> format_table(rows).splitlines()[0].split()
['algorithm', 'N', 'rounds', 'bound', 'method', 'seconds', 'source']
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from stragglar.artifacts import FORMATS
from stragglar.formats import schedule_json
from stragglar.schedule import Schedule, round_lower_bound
from stragglar.synth import ALGORITHMS, synthesize
from stragglar.verify import prove, smt
from stragglar.verify.report import ArtifactProof

__all__ = [
    "ALGORITHM_MAX_WIDTH",
    "ALGORITHM_WIDTH",
    "TABLE_HEADER",
    "ProofRow",
    "Skipped",
    "format_row",
    "format_table",
    "proof_count",
    "prove_all",
    "prove_files",
    "prove_schedule_file",
    "table_header",
]

ALGORITHM_WIDTH = 10  # the algorithm column's least width: every synthesized algorithm's name fits
ALGORITHM_MAX_WIDTH = 40  # and its most, for an artifact's name (what its file says)
ROUNDS_WIDTH = 9  # the rounds column: direct at N = 2048 is "11(22517)", rounds(chunk-steps)


def table_header(width: int = ALGORITHM_WIDTH) -> str:
    """The table's header, its algorithm column ``width`` wide (an artifact's name may be longer)."""
    return (
        f"{'algorithm':<{width}} {'N':>4} {'rounds':>{ROUNDS_WIDTH}} {'bound':>6}  {'method':<9} "
        f"{'seconds':>7}  source"
    )


TABLE_HEADER = table_header()


@dataclass(frozen=True)
class ProofRow:
    """One proof: ``rounds`` counts the rounds after the straggler arrives (all rounds, without
    one), ``steps`` the chunk-steps among them, a round that moves k chunks over one link counting
    k (they differ for direct and rhd); ``lower_bound`` bounds the chunk-steps (a port moves one
    chunk per step), given for StragglAR only; ``method`` is "smt", "simulate" or an artifact
    format's name (a file proved as its executor runs it, see :data:`stragglar.artifacts.FORMATS`);
    ``source`` is "synthesized" or a file name."""

    algorithm: str
    num_ranks: int
    rounds: int
    steps: int
    lower_bound: int | None
    method: str
    seconds: float
    source: str

    @classmethod
    def for_artifact(cls, proof: ArtifactProof, method: str, source: str) -> ProofRow:
        """The row of a proved MSCCL XML file or MSCCL++ plan: its name for the algorithm, no rounds."""
        return cls(proof.name, proof.gpus, 0, 0, None, method, proof.seconds, source)


@dataclass(frozen=True)
class Skipped:
    """A z3 proof of the schedule file ``source`` not run, ``reason`` saying how far past what z3
    takes it is: z3 would refuse it before starting, and the simulator, which proves any size,
    proves it alone.  Not a failure: the file may be a correct schedule, only too big for z3."""

    source: str
    reason: str

    @property
    def line(self) -> str:
        """``z3 skipped s520.json: 269,880 ranks x chunks, more than the 262,144 z3 takes``."""
        return f"z3 skipped {self.source}: {self.reason}"


_PROVERS: dict[str, Callable[[Schedule], object]] = {"smt": smt.smt_prove, "simulate": prove}


def _plan(
    max_smt: int, max_baseline_smt: int, max_simulated: int
) -> Iterator[tuple[str, int, tuple[str, ...]]]:
    """Each (algorithm, N) :func:`prove_all` proves, in its order, with the methods that prove it:
    one plan for the proofs and their count, so that a progress bar's total is the rows that come."""
    for algorithm in ALGORITHMS:
        smt_up_to = max_smt if algorithm == "stragglar" else max_baseline_smt
        for n in range(2, max(smt_up_to, max_simulated) + 1):
            if algorithm == "rhd" and n & (n - 1):
                continue  # recursive halving/doubling exists for powers of two only
            by_smt = ("smt",) if n <= smt_up_to else ()
            yield algorithm, n, by_smt + (("simulate",) if n <= max_simulated else ())


def proof_count(max_smt: int = 32, max_baseline_smt: int = 16, max_simulated: int = 128) -> int:
    """How many rows :func:`prove_all` yields for the same bounds, known before any proof runs."""
    return sum(len(methods) for _, _, methods in _plan(max_smt, max_baseline_smt, max_simulated))


def prove_all(max_smt: int = 32, max_baseline_smt: int = 16, max_simulated: int = 128) -> Iterator[ProofRow]:
    """Prove StragglAR for N = 2..``max_smt`` and the baselines for N = 2..``max_baseline_smt`` by z3,
    and every algorithm for N = 2..``max_simulated`` by the simulator.

    Raises :class:`~stragglar.verify.VerificationError` at the first schedule that fails.
    """
    for algorithm, n, methods in _plan(max_smt, max_baseline_smt, max_simulated):
        schedule = synthesize(algorithm, n)
        for method in methods:
            yield _proved(schedule, method, _PROVERS[method], "synthesized")


def prove_files(paths: Iterable[str | os.PathLike[str]]) -> Iterator[ProofRow | Skipped]:
    """Prove schedule files (JSON) from their own text, by z3 and by the simulator.

    What ships is what is proved: a file may differ from what the synthesizer makes today.
    """
    for path in paths:
        yield from prove_schedule_file(schedule_json.read(path), Path(path).name)


def prove_schedule_file(schedule: Schedule, source: str) -> Iterator[ProofRow | Skipped]:
    """The rows of one schedule read from the file ``source``, proved by z3 and by the simulator;
    where it is past what z3 takes, :class:`Skipped` in place of z3's row, and the simulator's."""
    too_big = _past_z3(schedule)
    yield _proved(schedule, "smt", smt.smt_prove, source) if too_big is None else Skipped(source, too_big)
    yield _proved(schedule, "simulate", prove, source)


def _past_z3(schedule: Schedule) -> str | None:
    """How far ``schedule`` is past what z3 takes, or None within it: asked before z3 is, since z3
    would refuse it with advice for ``verify``, not a reason that fits a table of proofs.  The
    limits are z3's own (:data:`~stragglar.verify.smt.SMT_MAX_CELLS`,
    :data:`~stragglar.verify.smt.SMT_MAX_TRANSFERS`), read from its module when asked: one limit,
    wherever it is set."""
    cells = schedule.num_ranks * schedule.num_chunks
    if cells > smt.SMT_MAX_CELLS:
        return f"{cells:,} ranks x chunks, more than the {smt.SMT_MAX_CELLS:,} z3 takes"
    if schedule.num_transfers > smt.SMT_MAX_TRANSFERS:
        return f"{schedule.num_transfers:,} transfers, more than the {smt.SMT_MAX_TRANSFERS:,} z3 takes"
    return None


def _proved(schedule: Schedule, method: str, prover: Callable[[Schedule], object], source: str) -> ProofRow:
    start = time.perf_counter()
    prover(schedule)
    seconds = time.perf_counter() - start
    n, rounds, steps = schedule.num_ranks, schedule.exposed_rounds, schedule.exposed_steps
    bound = round_lower_bound(n, schedule.num_chunks) if schedule.algorithm == "stragglar" else None
    return ProofRow(schedule.algorithm, n, rounds, steps, bound, method, seconds, source)


def format_row(row: ProofRow, width: int = ALGORITHM_WIDTH) -> str:
    """The row, its algorithm ``width`` wide: a name longer than that (an artifact's, from its
    file) cut to it, ending in ``...``, where the column is at least as wide as that mark.  Its
    rounds are ``3(12)`` where they differ from its chunk-steps, as a summary's ``3 rounds (12
    chunk-steps)``: the bound counts chunk-steps, and rounds alone would flatter such a schedule;
    one word, so that the columns split on spaces.

    >>> format_row(ProofRow("direct", 5, 3, 12, None, "smt", 0.0, "d5.json")).split()[:3]
    ['direct', '5', '3(12)']
    """
    bound = "-" if row.lower_bound is None else str(row.lower_bound)
    if row.method in FORMATS:
        rounds = "-"
    else:
        rounds = str(row.rounds) if row.rounds == row.steps else f"{row.rounds}({row.steps})"
    name = row.algorithm if len(row.algorithm) <= width or width < 4 else row.algorithm[: width - 3] + "..."
    cells = f"{name:<{width}} {row.num_ranks:>4} {rounds:>{ROUNDS_WIDTH}} {bound:>6}"
    return f"{cells}  {row.method:<9} {row.seconds:>7.3f}  {row.source}"


def format_table(rows: Iterable[ProofRow | Skipped]) -> str:
    """The header and a line per row: a proof's row, or a skipped proof's line."""
    lines = (row.line if isinstance(row, Skipped) else format_row(row) for row in rows)
    return "\n".join([TABLE_HEADER, *lines])
