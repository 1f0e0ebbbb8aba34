"""StragglAR on a GPU: NCCL ranks against all_reduce, DDP, and the loopback eager against graphs.

    python benchmarks/bench_gpu.py [--quick] [--iters 5] [--parts PART ...] [--progress]
                                   [--json docs/perf/gpu.json]

(b) 4 NCCL ranks (on one GPU: each its own ``NCCL_HOSTID``, NCCL's socket transport, so ratios are
indicative), 4 KiB and 64 MiB float32: StragglAR (the paper's chunks and C = 8N; eager and from
CUDA graphs) against NCCL's all_reduce with the last rank 0, 20 and 100 ms late, and a bare
send/recv pair of 4 KiB; every call checked on every rank, a call's time the slowest rank's.
(c) DDP on 4 NCCL ranks, an MLP of 12 layers of 2048 x 2048, buckets of 8 MB: the default hook,
StragglAR with the paper's chunks and with ``chunks="auto"``, and ``policy="auto"``, with nobody
late and rank 3 late by 50 ms; losses compared step by step with the default hook's.  (d) As (b)
through CuPy's NCCL (``NcclGroup``): the paper's schedule eager and from graphs against CuPy's
NCCL allReduce, nobody late and the last rank 100 ms late (where CuPy is installed).  A part
whose ranks fail is reported in one line and the run goes on, then exits 1; ``--parts`` runs
some of them (``--json`` then keeps the file's other parts where they are of the same device).
(a), last (it makes a CUDA context in this process, which forked ranks could not use): the
loopback, every rank's CuPy array on one GPU, eager against CUDA graphs, for N in {4, 8, 16}, the
paper's C = N - 1 chunks and C = 8N, and buffers of 4 KiB to 256 MiB per rank (float32), every
call checked exactly: see gpu_loopback.py for its rows and targets.

(e) The device engine (one persistent kernel per rank, ``engine="device"``) against the graphed
loopback, last as well: see gpu_device.py for its rows and targets (issue 34).  (f) The device
engine's kernel under other tunings (blocks a rank, vectors a thread) against its own: see
gpu_tuning.py.  (g) Where the host's part of a device call goes, by cProfile: see gpu_profile.py.
(h) Packets against flags by chunk size, what the engine's ``packet_bytes`` is set from: see
gpu_packets.py.

Targets (issue 24), besides the loopback's: a StragglAR round with graphs on
4 NCCL ranks, 4 KiB, <= 1.5x the bare pair; DDP with ``chunks="auto"`` no slower than the paper's
chunks and ``policy="auto"`` with nobody late <= 1.03x the default hook.  Without a GPU it prints
one line "no GPU: ..." and exits 0.  ``--quick`` runs the loopback at N = 8 only, up to 64 MiB, the
device engine's 1 MiB rows at N = 3, 8 and 16 only (its targets' rows, 256 MiB among them, in
both), and fewer DDP steps.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpu_device import device_executor, device_table
from gpu_inputs import DDPConfig, P2PConfig, size_text, slowest
from gpu_loopback import loopback, loopback_table
from gpu_packets import device_packets, packets_table
from gpu_profile import device_profile, profile_table
from gpu_tuning import device_tuning, tuning_table
from options import Parser, as_command, json_output, note, whole
from results import save

from stragglar.measure.gpus import gpu_count
from stragglar.measure.launch import LaunchError, launch
from stragglar.synth import synthesize
from stragglar.verify import prove

SIZES = (4 << 10, 1 << 20, 64 << 20, 256 << 20)  # bytes per rank
QUICK_SIZES = (4 << 10, 1 << 20, 64 << 20)
ROUND_PAIR_TARGET = 1.5  # 4 NCCL ranks, 4 KiB: a StragglAR round with graphs over a bare send/recv pair
DDP_VARIANTS = ("default hook", "stragglar (paper)", "stragglar (chunks auto)", "auto")
AUTO_TARGET = 1.03  # DDP, nobody late: auto over the default hook
RANKS = 4


def p2p(cfg: P2PConfig, world: int, gpus: int) -> dict[str, float]:
    """Part (b): the slowest rank's median time per variant, and the bare pair's."""
    from gpu_ranks import p2p_rank  # torch: only where a part runs

    per_rank = launch(p2p_rank, world, (cfg,), timeout=cfg.timeout, backend=cfg.backend, gpus=gpus)
    return slowest(per_rank)


def p2p_table(times: dict[str, float], world: int) -> str:
    """One row per (size, delay, variant): the time, and at no delay the time per round."""
    rounds = {
        "paper": prove(synthesize("stragglar", world)).num_rounds,
        "chunked": prove(synthesize("stragglar", world, chunks=8 * world)).num_rounds,
    }
    lines = [
        "| size | last rank late (ms) | variant | time (ms) | per round (us) |",
        "|---:|---:|---|---:|---:|",
    ]
    pair = times.get("pair", 0.0)
    best_round = None
    for name, seconds in times.items():
        if name == "pair":
            continue
        size, delay, variant = name.split("|")
        kind = next((k for k in rounds if f"stragglar {k}," in variant), None)
        per_round = seconds / rounds[kind] * 1e6 if kind and float(delay) == 0 else None
        if per_round is not None and variant.endswith(", graph") and int(size) == min(_sizes(times)):
            best_round = per_round if best_round is None else min(best_round, per_round)
        shown = f"{per_round:.1f}" if per_round is not None else ""
        lines.append(
            f"| {size_text(int(size))} | {float(delay) * 1e3:g} | {variant} | {seconds * 1e3:.3f} | {shown} |"
        )
    if "pair" in times:
        lines.append(f"\nbare send/recv pair, {size_text(min(_sizes(times)))}: {pair * 1e6:.1f} us")
    if best_round is not None and pair > 0:
        ratio = best_round / (pair * 1e6)  # both in microseconds
        verdict = "met" if ratio <= ROUND_PAIR_TARGET else "MISSED"
        lines.append(
            f"a StragglAR round with graphs: {ratio:.2f}x the pair "
            f"(target <= {ROUND_PAIR_TARGET:g}x: {verdict})"
        )
    return "\n".join(lines)


def cupy_nccl(cfg: P2PConfig, world: int, gpus: int) -> dict[str, float] | str:
    """Part (d): as part (b) through CuPy's NCCL (:func:`gpu_ranks.cupy_rank`), or one line saying
    why there are no figures."""
    try:
        import cupy  # noqa: F401  (only whether it is there)
    except ImportError:
        return "not measured: cupy is not installed"
    from gpu_ranks import cupy_rank

    per_rank = launch(cupy_rank, world, (cfg,), timeout=cfg.timeout, backend=cfg.backend, gpus=gpus)
    return slowest(per_rank)


def _sizes(times: dict[str, float]) -> list[int]:
    return [int(name.split("|")[0]) for name in times if name != "pair"]


def ddp(cfg: DDPConfig, world: int, gpus: int, variants: tuple[str, ...]) -> dict[str, Any]:
    """Part (c): per variant the median step (the slowest rank's) and the largest loss difference
    from the default hook's, step by step on every rank."""
    from gpu_ranks import ddp_rank

    per_rank = launch(
        ddp_rank,
        world,
        (cfg, variants),
        timeout=cfg.timeout,
        backend=cfg.backend,
        gpus=gpus,
    )
    out: dict[str, Any] = {}
    baseline = [r["steps"]["default hook"] for r in per_rank]
    for variant in variants:
        runs = [r["steps"][variant] for r in per_rank]
        steps = [max(run[i][0] for run in runs) for i in range(len(runs[0]))]
        losses = max(
            abs(a[1] - b[1]) / max(abs(b[1]), 1e-30)
            for run, base in zip(runs, baseline, strict=True)
            for a, b in zip(run, base, strict=True)
        )
        chunks = sorted({c for r in per_rank for c in r["chunks"][variant]})
        out[variant] = {"median_step_s": statistics.median(steps), "loss_rel_diff": losses, "chunks": chunks}
    return out


def ddp_table(runs: dict[str, dict[str, Any]]) -> str:
    lines = [
        "| setting | variant | median step (ms) | vs default hook | loss difference (rel.) |",
        "|---|---|---:|---:|---:|",
    ]
    for setting, variants in runs.items():
        base = variants["default hook"]["median_step_s"]
        for variant, figures in variants.items():
            step, loss = figures["median_step_s"], figures["loss_rel_diff"]
            lines.append(f"| {setting} | {variant} | {step * 1e3:.1f} | {step / base:.2f}x | {loss:.1e} |")
    return "\n".join([*lines, "", *ddp_targets(runs)])


def ddp_targets(runs: dict[str, dict[str, Any]]) -> list[str]:
    """``chunks="auto"`` no slower than the paper's chunks (each setting); auto with nobody late
    within 1.03x the default hook."""
    out = []
    for setting, variants in runs.items():
        auto, paper = variants["stragglar (chunks auto)"], variants["stragglar (paper)"]
        ratio = auto["median_step_s"] / paper["median_step_s"]
        verdict = "met" if ratio <= 1.0 else "MISSED"
        if auto.get("chunks") and auto.get("chunks") == paper.get("chunks"):
            verdict += f", but both ran {paper['chunks']} chunks: the same schedule, the difference is noise"
        out.append(f"{setting}: chunks auto takes {ratio:.2f}x the paper's chunks (target <= 1: {verdict})")
    punctual = runs.get("nobody late")
    if punctual is not None:
        ratio = punctual["auto"]["median_step_s"] / punctual["default hook"]["median_step_s"]
        verdict = "met" if ratio <= AUTO_TARGET else "MISSED"
        out.append(
            f"nobody late: auto takes {ratio:.2f}x the default hook (target <= {AUTO_TARGET:g}x: {verdict})"
        )
    return out


# in the order they run
PARTS = (
    "p2p",
    "ddp",
    "cupy_nccl",
    "loopback",
    "device_executor",
    "device_packets",
    "device_tuning",
    "device_profile",
)


def kept_parts(path: Path | None, parts: tuple[str, ...]) -> tuple[str | None, dict[str, Any]]:
    """The device and the figures of the parts this run does not measure, from the JSON it will
    write (``--parts`` re-runs some parts and keeps the others).  Nothing from a file that is
    missing or not one of ours."""
    if path is None or not path.is_file():
        return None, {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None, {}
    if not isinstance(doc, dict):
        return None, {}
    return doc.get("device"), {part: doc[part] for part in PARTS if part in doc and part not in parts}


def _save_so_far(path: Path | None, figures: dict[str, Any], device: str | None) -> None:
    """The parts measured so far, so that a run cut short (a timeout, Ctrl-C) keeps them, with
    the device as its driver names it (:func:`driver_device_name`: a later ``--parts`` run keeps
    them only where its device is the same; None where the driver cannot say)."""
    if path is not None:
        save(path, {"device": device, "complete": False, **figures})


def _failed(part: str, error: LaunchError) -> str:
    """A part whose ranks failed, in one line (the others still run; main exits 1)."""
    line = str(error).splitlines()[0]
    print(f"\n## {part}: FAILED: {line}", flush=True)
    for rank, failure in error.failures.items():  # the whole story, for the log
        story = f"rank {rank}: {failure.detail or failure.reason}\n{failure.stacks}"
        print(story, file=sys.stderr, flush=True)
    return f"FAILED: {line}"


def run_p2p(args: argparse.Namespace, gpus: int) -> dict[str, float]:
    shared = " (sharing GPUs: NCCL's socket transport, ratios indicative)" if gpus < RANKS else ""
    times = p2p(P2PConfig("nccl", (4 << 10, 64 << 20), (0.0, 0.02, 0.1), args.iters), RANKS, gpus)
    print(f"## {RANKS} NCCL ranks on {gpus} GPU(s){shared}: StragglAR against all_reduce\n")
    print(p2p_table(times, RANKS), flush=True)
    return times


def run_ddp(args: argparse.Namespace, gpus: int) -> dict[str, Any]:
    runs = {}
    for setting, late in (("nobody late", None), ("rank 3 late 50 ms", 3)):
        cfg = DDPConfig("nccl", 2048, 12, 8.0, 14 if args.quick else 24, 4, late, 0.05)
        runs[setting] = ddp(cfg, RANKS, gpus, DDP_VARIANTS)
    print(f"\n## DDP, {RANKS} NCCL ranks, MLP 12 x 2048, buckets of 8 MB\n")
    print(ddp_table(runs), flush=True)
    return runs


def run_cupy_nccl(args: argparse.Namespace, gpus: int) -> dict[str, float] | str:
    times = cupy_nccl(P2PConfig("nccl", (4 << 10, 64 << 20), (0.0, 0.1), args.iters), RANKS, gpus)
    print(f"\n## {RANKS} CuPy/NCCL ranks (NcclGroup): StragglAR against allReduce\n")
    print(times if isinstance(times, str) else p2p_table(times, RANKS), flush=True)
    return times


def run_loopback(args: argparse.Namespace, gpus: int) -> list[dict[str, Any]] | str:
    ns, sizes = ((8,), QUICK_SIZES) if args.quick else ((4, 8, 16), SIZES)
    return _on_cupy(
        args,
        "loopback",
        "Loopback (one process, float32), eager against CUDA graphs",
        lambda cupy, progress: loopback(
            cupy, cupy.cuda.Device().synchronize, ns, sizes, args.iters, progress
        ),
        loopback_table,
    )


def run_device_executor(args: argparse.Namespace, gpus: int) -> list[dict[str, Any]] | str:
    return _on_cupy(
        args,
        "device executor",
        "Device engine (one kernel per rank) against the loopback with graphs",
        lambda cupy, progress: device_executor(
            cupy, cupy.cuda.Device().synchronize, args.quick, args.iters, progress
        ),
        device_table,
    )


def run_device_packets(args: argparse.Namespace, gpus: int) -> list[dict[str, Any]] | str:
    return _on_cupy(
        args,
        "device packets",
        "Device engine: packets against flags, by chunk size (N = 8, C = 64, float32)",
        lambda cupy, progress: device_packets(cupy, cupy.cuda.Device().synchronize, args.iters, progress),
        packets_table,
    )


def run_device_tuning(args: argparse.Namespace, gpus: int) -> list[dict[str, Any]] | str:
    return _on_cupy(
        args,
        "device tuning",
        "Device engine: the kernel's tunings against its own (float32)",
        lambda cupy, progress: device_tuning(cupy, cupy.cuda.Device().synchronize, args.iters, progress),
        tuning_table,
    )


def run_device_profile(args: argparse.Namespace, gpus: int) -> list[dict[str, Any]] | str:
    return _on_cupy(
        args,
        "device profile",
        "Device engine: where the host's part of a call goes (cProfile)",
        lambda cupy, progress: device_profile(cupy, cupy.cuda.Device().synchronize, args.iters, progress),
        profile_table,
    )


def _on_cupy(
    args: argparse.Namespace,
    what: str,
    title: str,
    measure: Callable[[Any, Callable[[str], None]], list[Any]],
    table: Callable[[list[Any]], str],
) -> list[dict[str, Any]] | str:
    """A part measured through CuPy in this process (``measure(cupy, progress)``: its rows),
    printed under ``title``; or why it was not measured.  Its progress lines go to stderr on a
    terminal, or with ``--progress`` (a log, where they say how far a run cut short got)."""
    if importlib.util.find_spec("cupy") is None:
        print(f"\n{what} not measured: cupy is not installed")
        return "not measured: cupy is not installed"
    import cupy

    def progress(line: str) -> None:
        if args.progress:
            print(f"  {line}", file=sys.stderr, flush=True)
        else:
            note(f"  {line}")

    rows = measure(cupy, progress)
    print(f"\n## {title}\n")
    print(table(rows), flush=True)
    return [asdict(r) for r in rows]


def driver_device_name() -> str | None:
    """The first GPU's name as its driver says it (``nvidia-smi``: no CUDA context in this process,
    which the ranks of a later part, forked from it, could not use); None where it cannot say."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", "0"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.strip().splitlines() if done.returncode == 0 else []
    return lines[0].strip() or None if lines else None


def device_name(named: str | None) -> str:
    """The first GPU's name: the driver's (``named``) where it said one, else torch's (torch
    only once the parts have run, for the same reason)."""
    if named is not None:
        return named
    import torch

    return str(torch.cuda.get_device_name(0))


# in this process: with progress lines
RUNS_ON_CUPY = ("loopback", "device_executor", "device_packets", "device_tuning", "device_profile")
RUNNERS: dict[str, Callable[[argparse.Namespace, int], Any]] = {
    "p2p": run_p2p,
    "ddp": run_ddp,
    "cupy_nccl": run_cupy_nccl,
    "loopback": run_loopback,
    "device_executor": run_device_executor,
    "device_packets": run_device_packets,
    "device_tuning": run_device_tuning,
    "device_profile": run_device_profile,
}


def no_gpu() -> str | None:
    """The line ``no GPU: ...`` where torch sees no CUDA GPU, None where it sees one: this script
    prints it and exits 0 (a run without a GPU is no failure), gpu_check.sh refuses with it
    (exit 2, its steps would check nothing).  Counted through NVML: no CUDA context is made here."""
    if gpu_count() >= 1:
        return None
    return f"no GPU: {'torch sees no CUDA device' if importlib.util.find_spec('torch') else 'no torch'}"


def main(argv: list[str] | None = None) -> None:
    parser = Parser(description="StragglAR on a GPU: loopback, NCCL ranks and DDP.")
    parser.add_argument("--quick", action="store_true", help="fewer settings: N = 8 only, up to 64 MiB")
    parser.add_argument("--iters", type=whole(1, 10**4), default=5, help="timed calls per setting (median)")
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=PARTS,
        default=list(PARTS),
        metavar="PART",
        help=f"which parts to run (default: all; they run in the order {' '.join(PARTS)}); "
        "with --json, the file's figures of the other parts are kept if they are of the same device",
    )
    parser.add_argument(
        "--progress",
        action="store_true",
        help="progress lines on stderr even where it is no terminal (a log); the loopback and the "
        "device engine's parts print them",
    )
    parser.add_argument("--json", type=json_output, metavar="FILE", help="also save the results as JSON")
    args = parser.parse_args(argv)
    args.parts = tuple(dict.fromkeys(args.parts))
    if args.progress and not set(args.parts) & set(RUNS_ON_CUPY):
        parser.error(f"--progress applies to the parts {', '.join(RUNS_ON_CUPY)} (the others print none)")
    refused = no_gpu()
    if refused is not None:
        print(refused)
        return
    gpus = gpu_count()  # through NVML: no CUDA context here before the ranks are forked
    kept_device, kept = kept_parts(args.json, args.parts)
    named = driver_device_name()
    figures = dict(kept)
    failed = False
    # The loopback and the device engine run last: they make a CUDA context in this process, which
    # the ranks of a part after them, forked from here, could not use.
    for part in (p for p in PARTS if p in args.parts):
        try:
            figures[part] = RUNNERS[part](args, gpus)
        except LaunchError as e:  # a rank failed or hung (a wrong result included): say so, go on
            figures[part] = _failed(part, e)
        failed |= isinstance(figures[part], str) and figures[part].startswith("FAILED")
        _save_so_far(args.json, figures, named)
    device = device_name(named)
    print(f"\ndevice: {device}")
    if kept and kept_device != device:
        print(f"not kept from {args.json}: {', '.join(sorted(kept))} (measured on {kept_device})")
        figures = {part: figures[part] for part in args.parts}
    if args.json:
        complete = all(part in figures for part in PARTS)
        save(args.json, {"device": device, "complete": complete, **figures})
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    as_command(main)
