"""Time the MSCCL XML export and the proof of the exported file, and print a table.

    python benchmarks/bench_msccl.py [--gpus 8 16 32 64] [--algorithm stragglar] [--proto Simple]
                                     [--instances 1] [--repeats 3] [--json out.json]

Times are wall-clock (``time.perf_counter``), best of ``--repeats``; synthesis and the proof of the
schedule that the export lowers are not timed.
The proof reads the XML text (the executor's parser rules) and runs it twice under the
deterministic scheduler with symbolic values, so its time is what ``stragglar verify x.xml`` costs.
"""

from __future__ import annotations

import functools
import platform

from exporting import best_of, synthesized
from options import Parser, as_command, each, json_output, whole
from results import save

from stragglar import msccl
from stragglar.msccl import PROTOCOLS, MscclProof, XmlOptions
from stragglar.synth import ALGORITHMS
from stragglar.verify import prove


def main() -> None:
    parser = Parser(description=__doc__.split("\n")[0])
    parser.add_gpus(default=[8, 16, 32, 64])
    parser.add_argument("--algorithm", choices=ALGORITHMS, default="stragglar", help="the schedule exported")
    parser.add_argument("--proto", choices=PROTOCOLS, default="Simple", help="the XML's MSCCL protocol")
    parser.add_argument("--instances", type=whole(1), default=1, help="copies of the schedule the XML runs")
    parser.add_argument("--repeats", type=whole(1, 1000), default=3, help="timed runs per N (the best kept)")
    parser.add_argument("--json", type=json_output, metavar="FILE", help="also save the rows as JSON")
    args = parser.parse_args()
    options = XmlOptions(proto=args.proto, instances=args.instances)
    check = functools.partial(msccl.check_request, instances=args.instances, algorithm=args.algorithm)
    schedules = synthesized(args.algorithm, args.gpus, check)
    python = platform.python_version()
    print(f"{args.algorithm}, proto {args.proto}, {args.instances} instance(s); Python {python}")
    print(f"{'N':>4} {'TBs':>6} {'steps':>7} {'chan':>4} {'KiB':>7} {'export s':>9} {'prove s':>8}")
    rows = []
    for schedule in each(schedules, lambda s: f"N = {s.num_ranks}: export and prove"):
        n, proof = schedule.num_ranks, prove(schedule)  # proved before the timing: the export lowers a proof
        export_s, xml = best_of(args.repeats, functools.partial(msccl.lower, proof, options))
        prove_s, proved = best_of(args.repeats, functools.partial(msccl.prove, xml))
        assert isinstance(proved, MscclProof)
        print(
            f"{n:>4} {proved.threadblocks:>6} {proved.steps:>7} {proved.channels:>4} "
            f"{len(xml) / 1024:>7.0f} {export_s:>9.3f} {prove_s:>8.3f}"
        )
        rows.append(
            {
                "n": n,
                "threadblocks": proved.threadblocks,
                "steps": proved.steps,
                "channels": proved.channels,
                "kib": len(xml) / 1024,
                "export_s": export_s,
                "prove_s": prove_s,
            }
        )
    if args.json:
        given = {"algorithm": args.algorithm, "proto": args.proto, "instances": args.instances}
        save(args.json, {**given, "repeats": args.repeats, "rows": rows})


if __name__ == "__main__":
    as_command(main)
