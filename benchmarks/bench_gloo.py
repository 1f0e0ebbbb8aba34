"""Measured StragglAR against gloo's all_reduce on CPU: the grid of docs/performance.md, section 2.

    python benchmarks/bench_gloo.py [more stragglar bench options, e.g. --json out.json]

The same as ``stragglar bench --backend torch --gpus 4,8 --sizes 16MiB,64MiB,256MiB
--delays 0ms,50ms,200ms --iters 5 --timeout 300s``; the method (alternating pairs, per-iteration
ratios, the Ring model fitted to gloo's delay-0 times) is described in
:mod:`stragglar.measure.sweep`.  Needs torch and about 9 GiB of memory for 8 ranks at 256 MiB.
An option given here replaces the grid's (``--iters 3``); ``--backend`` is refused: this grid is
gloo's, and ``stragglar bench`` measures any other.
"""

from __future__ import annotations

import sys

from stragglar.cli import cli

GRID = ["--backend", "torch", "--gpus", "4,8", "--sizes", "16MiB,64MiB,256MiB"]
GRID += ["--delays", "0ms,50ms,200ms", "--iters", "5", "--timeout", "300s"]


def main(argv: list[str]) -> None:
    """``stragglar bench`` with the grid, the options in ``argv`` after it (click takes the last
    of an option given twice); ``--help`` says what this script runs, not ``bench``'s defaults."""
    if any(arg in ("-h", "--help") for arg in argv):
        print((__doc__ or "").strip())
        return
    if any(arg == "--backend" or arg.startswith("--backend=") for arg in argv):
        print("bench_gloo.py: error: --backend: this grid is gloo's; use stragglar bench", file=sys.stderr)
        sys.exit(2)
    cli.main(["bench", *GRID, *argv], prog_name="bench_gloo.py")


if __name__ == "__main__":
    main(sys.argv[1:])
