"""Write ``two_stages.csv``, the small trace the README's ``stragglar whatif`` example replays.

A made-up job in the shape of a per-rank op trace: two pipeline stages, each a data-parallel
group of 4 ranks, 30 iterations; each row is one rank's op (a ``forward`` or the gradient
``allreduce``) with its start time in milliseconds.  In stage 0 data-parallel rank 2 reaches the
gradient AllReduce 6-10 ms after the others at most iterations (a slow GPU); in stage 1 a rank
picked at random each iteration is 0-3 ms late (noise, no persistent straggler).  Seeded: the
file is the same on every run (``python examples/traces/make_two_stages.py``).
"""

from __future__ import annotations

import random
from pathlib import Path

STEPS, RANKS = 30, 4


def rows() -> list[str]:
    gen = random.Random(25)
    out = ["stage,dp_rank,iteration,op,start_ms"]
    for iteration in range(1, STEPS + 1):
        start = 250.0 * iteration
        for stage in (0, 1):
            noisy = gen.randrange(RANKS)
            for rank in range(RANKS):
                late = gen.uniform(0.0, 0.4)
                if stage == 0 and rank == 2 and gen.random() < 0.9:
                    late += gen.uniform(6.0, 10.0)
                if stage == 1 and rank == noisy:
                    late += gen.uniform(0.0, 3.0)
                out.append(f"{stage},{rank},{iteration},forward,{start - 120.0 + late:.3f}")
                out.append(f"{stage},{rank},{iteration},allreduce,{start + late:.3f}")
    return out


if __name__ == "__main__":
    target = Path(__file__).with_name("two_stages.csv")
    target.write_text("\n".join(rows()) + "\n")
    print(f"wrote {target}")
