"""Measured StragglAR against gloo's all_reduce on CPU: the grid of docs/performance.md, section 2.

    python benchmarks/bench_gloo.py [more stragglar bench options, e.g. --json out.json]

The same as ``stragglar bench --backend torch --gpus 4,8 --sizes 16MiB,64MiB,256MiB
--delays 0ms,50ms,200ms --iters 5 --timeout 300s``; the method (alternating pairs, per-iteration
ratios, the Ring model fitted to gloo's delay-0 times) is described in
:mod:`stragglar.measure.sweep`.  Needs torch and about 9 GiB of memory for 8 ranks at 256 MiB.
"""

from __future__ import annotations

import sys

from stragglar.cli import cli

GRID = ["--backend", "torch", "--gpus", "4,8", "--sizes", "16MiB,64MiB,256MiB"]
GRID += ["--delays", "0ms,50ms,200ms", "--iters", "5", "--timeout", "300s"]

if __name__ == "__main__":
    cli.main(["bench", *GRID, *sys.argv[1:]], prog_name="bench_gloo.py")
