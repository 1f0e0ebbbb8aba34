"""Traces written from known arrivals, in each format ``stragglar whatif`` reads: a CSV table,
NCCL Inspector's per-process JSON files and PyTorch Flight Recorder's per-rank pickles, laid out
as their libraries' documentation describes them.  The same arrivals in each format must replay
to the same figures."""

from __future__ import annotations

import json
import pickle
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

START_US = 1_750_000_000_000_000  # a wall-clock time in microseconds since 1970


def late_rank_arrivals(ranks: int, steps: int, late: int, by_us: int) -> dict[int, list[int]]:
    """Per step (numbered from 10), each rank's arrival in whole microseconds since 1970: every rank
    its own few microseconds after the step's start (the last another rank at each step), rank
    ``late`` ``by_us`` more from step 13 on."""
    arrivals = {}
    for step in range(10, 10 + steps):
        base = START_US + 100_000 * step
        jitter = [(rank + step) % ranks * ranks + rank for rank in range(ranks)]
        arrivals[step] = [
            base + jitter[rank] + (by_us if rank == late and step >= 13 else 0) for rank in range(ranks)
        ]
    return arrivals


def write_csv(path: Path, groups: Mapping[str, Mapping[int, Sequence[int]]]) -> Path:
    """A table with ``group``, ``step``, ``rank`` and ``time_us`` columns."""
    lines = ["group,step,rank,time_us"]
    for group, arrivals in groups.items():
        lines += [
            f"{group},{step},{rank},{t}" for step, times in arrivals.items() for rank, t in enumerate(times)
        ]
    path.write_text("\n".join(lines) + "\n")
    return path


def inspector_record(
    comm: str, rank: int, ranks: int, coll: str, sn: int, size: int, kernel_us: int | None, enqueue_us: int
) -> dict[str, Any]:
    """One collective's record, verbose (``kernel_us`` None: not verbose): the kernel of channel 1
    starts first, at ``kernel_us``; the host enqueued the collective at ``enqueue_us``."""
    perf: dict[str, Any] = {
        "coll": coll,
        "coll_sn": sn,
        "coll_msg_size_bytes": size,
        "coll_exec_time_us": 900,
        "coll_timing_source": "kernel_gpu",
        "coll_algobw_gbs": 12.5,
        "coll_busbw_gbs": 18.75,
    }
    if kernel_us is not None:
        channels = [(0, kernel_us + 4), (1, kernel_us), (2, kernel_us + 9)]
        perf["event_trace_sn"] = {"coll_start_sn": 1, "coll_stop_sn": 2, "kernel_events": []}
        perf["event_trace_ts"] = {
            "coll_start_ts": enqueue_us,
            "coll_stop_ts": enqueue_us + 3,
            "kernel_events": [
                {
                    "channel_id": c,
                    "kernel_start_ts": t,
                    "kernel_stop_ts": t + 900,
                    "kernel_record_ts": t + 900,
                }
                for c, t in channels
            ],
        }
    return {
        "header": {"id": comm, "comm_name": "dp", "rank": rank, "n_ranks": ranks, "nnodes": 1},
        "metadata": {
            "inspector_output_format_version": "v4.0",
            "git_rev": "",
            "rec_mechanism": "nccl_profiler_interface",
            "dump_timestamp_us": START_US + 10**9,
            "hostname": "node0",
            "pid": 4000 + rank,
        },
        "coll_perf": perf,
    }


def write_inspector(
    folder: Path,
    comm: str,
    arrivals: Mapping[int, Sequence[int]],
    size: int,
    verbose: bool = True,
    others: bool = True,
) -> list[Path]:
    """One file per rank (``node0-pid<N>.log``, one JSON object per line) with the AllReduce of
    each step, its kernel starting at the rank's arrival, enqueued by the host on time (20 us
    before the step's first arrival, whatever the GPU's delay); with ``others``, a Broadcast
    numbered from 1 and a send between the AllReduces, as a job's own records have."""
    folder.mkdir(parents=True, exist_ok=True)
    ranks = len(next(iter(arrivals.values())))
    paths = []
    for rank in range(ranks):
        lines = []
        for number, (step, times) in enumerate(arrivals.items(), 1):
            enqueue = min(times) - 20
            kernel = times[rank] if verbose else None
            lines.append(inspector_record(comm, rank, ranks, "AllReduce", step, size, kernel, enqueue))
            if others:
                lines.append(inspector_record(comm, rank, ranks, "Broadcast", number, 64, enqueue, enqueue))
                lines.append({"header": lines[-1]["header"], "p2p_perf": {"p2p": "Send", "p2p_sn": number}})
        path = folder / f"node0-pid{4000 + rank}.log"
        path.write_text("".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines))
        paths.append(path)
    return paths


def flight_recorder_dump(
    group: str, members: Sequence[int], entries: Sequence[dict[str, Any]], version: str = "2.9"
) -> dict[str, Any]:
    """A dump as the Flight Recorder documentation shows it, unpickled."""
    return {
        "version": version,
        "pg_config": {group: {"name": group, "desc": "default_pg", "ranks": json.dumps(list(members))}},
        "pg_status": {
            group: {"last_enqueued_collective": len(entries), "last_completed_collective": len(entries)}
        },
        "entries": list(entries),
    }


def flight_recorder_entry(
    group: str, seq: int, duration_ms: float | None, shape: Sequence[int], retired_ns: int = 10**18
) -> dict[str, Any]:
    """One all_reduce's record of float32 inputs of ``shape`` as torch writes it: with a GPU
    duration, finished and retired by the watchdog's poll at ``retired_ns``, which is when it
    "discovered" both its start and its end (torch queries both events then); without one, still
    in flight at the dump (scheduled, not retired).  Enqueued by the host 50 ms before."""
    finished = duration_ms is not None
    return {
        "frames": [{"name": "all_reduce", "filename": "distributed_c10d.py", "line": 2700}],
        "record_id": seq - 1,
        "pg_id": 0,
        "process_group": (group, "default_pg"),
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": "nccl:all_reduce",
        "time_created_ns": retired_ns - 50 * 10**6,
        **({"duration_ms": duration_ms} if finished else {}),
        "input_sizes": [list(shape)],
        "input_dtypes": ["Float"],
        "output_sizes": [list(shape)],
        "output_dtypes": ["Float"],
        "state": "completed" if finished else "scheduled",
        "time_discovered_started_ns": retired_ns if finished else None,
        "time_discovered_completed_ns": retired_ns if finished else None,
        "retired": finished,
        "timeout_ms": 600_000,
        "is_p2p": False,
    }


def step_end_us(arrivals: Sequence[int]) -> int:
    """When a collective reached at ``arrivals`` ends on every rank: 900 us after the last."""
    return max(arrivals) + 900


def write_flight_recorder(
    folder: Path,
    group: str,
    arrivals: Mapping[int, Sequence[int]],
    shape: Sequence[int],
    prefix: str = "trace_",
) -> list[Path]:
    """One pickle per rank (``<prefix><rank>``) of the all_reduce of each step (its sequence id
    the step), reached at the rank's arrival (given in microseconds) and ended on every rank
    together, 900 us after the last arrival (:func:`step_end_us`): its GPU duration the time
    between; retired by each rank's watchdog at its own poll, 10-40 ms later.  A point-to-point
    send between them, and one collective still in flight at the end (the dump came first)."""
    folder.mkdir(parents=True, exist_ok=True)
    ranks = len(next(iter(arrivals.values())))
    paths = []
    for rank in range(ranks):
        entries = []
        for step, times in arrivals.items():
            end = step_end_us(times)
            poll = 1000 * end + 10**7 * (1 + (rank + step) % 4)
            entries.append(flight_recorder_entry(group, step, (end - times[rank]) / 1000, shape, poll))
            send = flight_recorder_entry(group, 0, 0.25, [4], poll)
            entries.append({**send, "is_p2p": True, "profiling_name": "nccl:send 0->1", "p2p_seq_id": step})
        entries.append(flight_recorder_entry(group, max(arrivals) + 1, None, shape))
        path = folder / f"{prefix}{rank}"
        path.write_bytes(pickle.dumps(flight_recorder_dump(group, range(ranks), entries), protocol=2))
        paths.append(path)
    return paths
