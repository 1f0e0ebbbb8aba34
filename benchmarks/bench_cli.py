"""How long a ``stragglar`` command takes from the shell's Enter to its exit, imports included.

    python benchmarks/bench_cli.py [--repeat 5] [--json out.json]

Each command runs as ``python -m stragglar ...`` in a fresh process, ``--repeat`` times, one
command after another in turn (a load that comes and goes on a shared machine then touches every
command alike); the table gives the best and the median wall-clock time, beside the bare
interpreter's start (``python -c pass``), which no change to stragglar can remove.  The commands
are quick on purpose (N = 8, a 4-rank file): what they measure is the start-up, the imports a
command waits on before it can print anything, not the work.  Every run must succeed: a failure
is the benchmark's error, with the command's last line.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

from options import Parser, as_command, each, json_output, whole
from results import save

from stragglar.errors import StragglarError

SCHEDULES = Path(__file__).resolve().parent.parent / "schedules"
COMMANDS: dict[str, list[str]] = {
    "python -c pass": ["-c", "pass"],
    "stragglar --help": ["-m", "stragglar", "--help"],
    "stragglar synth --gpus 8": ["-m", "stragglar", "synth", "--gpus", "8"],
    "stragglar cost --gpus 8": ["-m", "stragglar", "cost", "--gpus", "8"],
    "stragglar verify (4-rank JSON)": [
        "-m",
        "stragglar",
        "verify",
        str(SCHEDULES / "json" / "stragglar-n4-s3.json"),
    ],
    "stragglar verify (4-rank MSCCL XML)": [
        "-m",
        "stragglar",
        "verify",
        str(SCHEDULES / "msccl" / "stragglar-n4-s3-simple.xml"),
    ],
    "stragglar bound --gpus 4": ["-m", "stragglar", "bound", "--gpus", "4"],
    "stragglar whatif --help": ["-m", "stragglar", "whatif", "--help"],
    "stragglar run --help": ["-m", "stragglar", "run", "--help"],
}


def timed(args: list[str]) -> float:
    """Seconds one fresh ``python ARGS`` takes, its output discarded."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        raise StragglarError(f"python {' '.join(args)} exited {done.returncode}: {last}")
    return seconds


def main() -> None:
    parser = Parser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=whole(1, 1000), default=5, help="runs of each command")
    parser.add_argument("--json", type=json_output, metavar="FILE", help="also save the figures as JSON")
    args = parser.parse_args()

    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in each(range(args.repeat), lambda t: f"turn {t + 1}: every command once"):
        for name, command in COMMANDS.items():
            times[name].append(timed(command))

    print(f"| command | best of {args.repeat} (s) | median (s) |")
    print("|---|---:|---:|")
    for name, seconds in times.items():
        print(f"| `{name}` | {min(seconds):.3f} | {statistics.median(seconds):.3f} |")
    if args.json:
        figures = {
            name: {"best_s": min(s), "median_s": statistics.median(s), "runs_s": s}
            for name, s in times.items()
        }
        save(args.json, {"commands": figures})


if __name__ == "__main__":
    as_command(main)
