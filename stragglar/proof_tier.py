"""The CI proof tier: prove every algorithm's schedule for a range of sizes, by z3 and by the simulator.

Within the z3 range each schedule is proved twice, by provers that share no code; beyond it the
simulator, which takes milliseconds where z3 takes seconds, carries on alone.  Rows come out one
proof at a time, for a command to print as a table while the proofs run.

>>> rows = list(prove_all(max_smt=3, max_baseline_smt=2, max_simulated=3))
>>> [(r.algorithm, r.num_ranks, r.rounds, r.lower_bound, r.method) for r in rows[:3]]
[('stragglar', 2, 1, 1, 'smt'), ('stragglar', 2, 1, 1, 'simulate'), ('stragglar', 3, 3, 3, 'smt')]
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
from stragglar.verify import prove
from stragglar.verify.report import ArtifactProof
from stragglar.verify.smt import smt_prove

__all__ = [
    "ALGORITHM_MAX_WIDTH",
    "ALGORITHM_WIDTH",
    "TABLE_HEADER",
    "ProofRow",
    "format_row",
    "format_table",
    "prove_all",
    "prove_files",
    "prove_schedule_file",
    "table_header",
]

ALGORITHM_WIDTH = 10  # the algorithm column's least width: every synthesized algorithm's name fits
ALGORITHM_MAX_WIDTH = 40  # and its most, for an artifact's name (what its file says)


def table_header(width: int = ALGORITHM_WIDTH) -> str:
    """The table's header, its algorithm column ``width`` wide (an artifact's name may be longer)."""
    return f"{'algorithm':<{width}} {'N':>4} {'rounds':>7} {'bound':>6}  {'method':<9} {'seconds':>7}  source"


TABLE_HEADER = table_header()


@dataclass(frozen=True)
class ProofRow:
    """One proof: ``rounds`` counts the chunk-steps after the straggler arrives (all rounds,
    without one); ``lower_bound`` is its lower bound, given for StragglAR only; ``method`` is
    "smt", "simulate" or an artifact format's name (a file proved as its executor runs it, see
    :data:`stragglar.artifacts.FORMATS`); ``source`` is "synthesized" or a file name."""

    algorithm: str
    num_ranks: int
    rounds: int
    lower_bound: int | None
    method: str
    seconds: float
    source: str

    @classmethod
    def for_artifact(cls, proof: ArtifactProof, method: str, source: str) -> ProofRow:
        """The row of a proved MSCCL XML file or MSCCL++ plan: its name for the algorithm, no rounds."""
        return cls(proof.name, proof.gpus, 0, None, method, proof.seconds, source)


def prove_all(max_smt: int = 32, max_baseline_smt: int = 16, max_simulated: int = 128) -> Iterator[ProofRow]:
    """Prove StragglAR for N = 2..``max_smt`` and the baselines for N = 2..``max_baseline_smt`` by z3,
    and every algorithm for N = 2..``max_simulated`` by the simulator.

    Raises :class:`~stragglar.verify.VerificationError` at the first schedule that fails.
    """
    for algorithm in ALGORITHMS:
        smt_up_to = max_smt if algorithm == "stragglar" else max_baseline_smt
        for n in range(2, max(smt_up_to, max_simulated) + 1):
            if algorithm == "rhd" and n & (n - 1):
                continue  # recursive halving/doubling exists for powers of two only
            schedule = synthesize(algorithm, n)
            if n <= smt_up_to:
                yield _proved(schedule, "smt", smt_prove, "synthesized")
            if n <= max_simulated:
                yield _proved(schedule, "simulate", prove, "synthesized")


def prove_files(paths: Iterable[str | os.PathLike[str]]) -> Iterator[ProofRow]:
    """Prove schedule files (JSON) from their own text, by z3 and by the simulator.

    What ships is what is proved: a file may differ from what the synthesizer makes today.
    """
    for path in paths:
        yield from prove_schedule_file(schedule_json.read(path), Path(path).name)


def prove_schedule_file(schedule: Schedule, source: str) -> Iterator[ProofRow]:
    """The rows of one schedule read from the file ``source``, proved by z3 and by the simulator."""
    for method, prover in (("smt", smt_prove), ("simulate", prove)):
        yield _proved(schedule, method, prover, source)


def _proved(schedule: Schedule, method: str, prover: Callable[[Schedule], object], source: str) -> ProofRow:
    start = time.perf_counter()
    prover(schedule)
    seconds = time.perf_counter() - start
    n, rounds = schedule.num_ranks, schedule.exposed_steps
    bound = round_lower_bound(n, schedule.num_chunks) if schedule.algorithm == "stragglar" else None
    return ProofRow(schedule.algorithm, n, rounds, bound, method, seconds, source)


def format_row(row: ProofRow, width: int = ALGORITHM_WIDTH) -> str:
    """The row, its algorithm ``width`` wide: a name longer than that (an artifact's, from its
    file) cut to it, ending in ``...``, where the column is at least as wide as that mark."""
    bound = "-" if row.lower_bound is None else str(row.lower_bound)
    rounds = "-" if row.method in FORMATS else str(row.rounds)
    name = row.algorithm if len(row.algorithm) <= width or width < 4 else row.algorithm[: width - 3] + "..."
    cells = f"{name:<{width}} {row.num_ranks:>4} {rounds:>7} {bound:>6}"
    return f"{cells}  {row.method:<9} {row.seconds:>7.3f}  {row.source}"


def format_table(rows: Iterable[ProofRow]) -> str:
    return "\n".join([TABLE_HEADER, *map(format_row, rows)])
