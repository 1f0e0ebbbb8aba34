"""Measured StragglAR against gloo's all_reduce on CPU: the grid of docs/performance.md, section 2.

    python benchmarks/bench_gloo.py [stragglar bench options, e.g. --iters 3 --json out.json]

The same as ``stragglar bench --backend torch --gpus 4,8 --sizes 16MiB,64MiB,256MiB
--delays 0ms,50ms,200ms --iters 5 --timeout 300s``; the method (alternating pairs, per-iteration
ratios, the Ring model fitted to gloo's delay-0 times) is described in
:mod:`stragglar.measure.sweep`.  Needs torch and about 9 GiB of memory for 8 ranks at 256 MiB.
An option given here replaces the grid's (``--iters 3``); ``--backend`` is refused: this grid is
gloo's, and ``stragglar bench`` measures any other.
"""

from __future__ import annotations

import sys
import textwrap

import click

from stragglar.cli import cli

GRID = {"--backend": "torch", "--gpus": "4,8", "--sizes": "16MiB,64MiB,256MiB"}
GRID |= {"--delays": "0ms,50ms,200ms", "--iters": "5", "--timeout": "300s"}


def given_options(argv: list[str]) -> set[str]:
    """Every spelling of each ``stragglar bench`` option in ``argv``, read by bench's own parser:
    ``--iters 3``, ``--iters=3`` and ``-n8`` (``--gpus``) alike, and a switch is never taken for
    a value.  The parse is resilient: what bench cannot take is left for bench to refuse in its
    own words."""
    bench = cli.commands["bench"]
    with click.Context(bench, info_name="bench", resilient_parsing=True) as probe:
        _, _, order = bench.make_parser(probe).parse_args(args=list(argv))
    return {name for p in order if isinstance(p, click.Option) for name in p.opts + p.secondary_opts}


def command_line(argv: list[str]) -> list[str]:
    """``stragglar bench``'s arguments: the grid less each option ``argv`` gives, then ``argv``.
    Both used to go in whole, and bench refuses an option given twice ("--iters is given 2
    times"), so no grid value could be replaced."""
    given = given_options(argv)
    return [
        "bench",
        *(word for option, value in GRID.items() if option not in given for word in (option, value)),
        *argv,
    ]


def passed_on() -> str:
    """The ``stragglar bench`` options this script takes, read from bench itself (so that the help
    cannot fall behind it): its help showed only the grid, and a user could not tell that
    ``--json`` or ``--chunks`` may be given."""
    bench = cli.commands["bench"]
    spellings = [
        "/".join(p.opts)
        for p in bench.params
        if isinstance(p, click.Option) and "--backend" not in p.opts and "--help" not in p.opts
    ]
    return textwrap.fill(
        f"Options passed on to stragglar bench (one of the grid's given here replaces it): "
        f"{', '.join(spellings)}; stragglar bench --help says what each does.",
        width=100,
    )


def main(argv: list[str]) -> None:
    """``stragglar bench`` with the grid and the options in ``argv`` (:func:`command_line`);
    ``--help`` says what this script runs and which options it passes on, not ``bench``'s
    defaults."""
    if any(arg in ("-h", "--help") for arg in argv):
        print(f"{(__doc__ or '').strip()}\n\n{passed_on()}")
        return
    if "--backend" in given_options(argv):
        print("bench_gloo.py: error: --backend: this grid is gloo's; use stragglar bench", file=sys.stderr)
        sys.exit(2)
    cli.main(command_line(argv), prog_name="bench_gloo.py")


if __name__ == "__main__":
    main(sys.argv[1:])
