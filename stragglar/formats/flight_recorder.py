"""PyTorch Flight Recorder dumps as arrival traces.

PyTorch's Flight Recorder keeps each rank's recent collectives in a ring buffer and writes it,
on a timeout or on demand, as one pickle per rank, named by a prefix and the rank (``trace_3``).
The pickle holds a dictionary: ``pg_config`` maps each process group's name to its ``ranks``
(global ranks, as a JSON list in a string), and ``entries`` lists one record per collective with
its ``process_group`` (name, description), ``collective_seq_id`` (the group's sequence number,
one for all collective types), ``profiling_name`` (``nccl:all_reduce``), ``input_sizes`` and
``input_dtypes``, ``is_p2p``, ``state``, ``retired``, times in nanoseconds (``time_created_ns``:
the host enqueued it; ``time_discovered_started_ns`` and ``time_discovered_completed_ns``) and,
with ``TORCH_NCCL_ENABLE_TIMING=1``, ``duration_ms``: how long it ran on the GPU, from the event
recorded as the GPU reached it (its stream past the compute before it) to the one after it.

A rank's arrival is read from ``duration_ms``.  An AllReduce (a ReduceScatter, an AllGather, an
all-to-all) ends at about the same moment on every rank, within a step of its algorithm: none
can finish before the last has brought its data.  So a rank that reached it later ran it for
less time, and measured back from that end its arrival is ``-duration_ms``: the differences
between ranks, all that whatif asks of a step, are the durations' differences, off by how far
apart the ranks finished (microseconds).  A rooted collective (a Broadcast, a Reduce) ends at
other moments on its root and the others, so its records are refused.  Neither other time tells
the arrival: the host enqueues on time while its GPU is late (``time_created_ns``), and
``time_discovered_started_ns`` is when the watchdog thread found the start event done, which
for a finished collective is the poll that retires it, after its end: each rank's own poll.
A finished (``retired``) record without a duration is refused with the advice; one still in
flight at the dump (the dump's last collectives) is passed over.

A pickle can run any code as it loads; this one is read by an unpickler that builds only plain
data (dictionaries, lists, tuples, strings, numbers, None) and refuses any class or function the
file names, but for the three list builders TorchScript's pickler writes, which it builds as
plain lists (``torch.jit._pickle.build_intlist`` and the like; no module is imported).
"""

from __future__ import annotations

import io
import json
import math
import pickle
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from fractions import Fraction
from pathlib import Path
from typing import Any

from stragglar.errors import InputError, quoted, shown
from stragglar.formats.collectives import Record, collect, whole_number
from stragglar.formats.trace_reading import open_trace, read_at_most, shown_value, where_text
from stragglar.formats.traces import MAX_ROWS, Group, names_collective

__all__ = ["MAX_DUMP", "read_flight_recorder"]

MAX_DUMP = 2**28  # bytes of one rank's dump: 2,000 entries with stack frames are a few MB
_RANK = re.compile(r"([0-9]{1,9})$")
_BYTES = {  # an element's bytes, by the dtype names the dumps give
    **dict.fromkeys(("Bool", "Byte", "Char", "QInt8", "QUInt8"), 1),
    **dict.fromkeys(("Float8_e4m3fn", "Float8_e5m2", "Float8_e4m3fnuz", "Float8_e5m2fnuz"), 1),
    **dict.fromkeys(("Short", "Half", "BFloat16", "UInt16"), 2),
    **dict.fromkeys(("Int", "Float", "QInt32", "UInt32", "ComplexHalf"), 4),
    **dict.fromkeys(("Long", "Double", "ComplexFloat", "UInt64"), 8),
    "ComplexDouble": 16,
}


def _plain_list(kind: type) -> Callable[[Any], list[Any]]:
    """A TorchScript list builder, as a check that its argument is a list of ``kind``."""

    def build(values: Any) -> list[Any]:
        if not isinstance(values, list) or not all(type(v) is kind for v in values):
            raise pickle.UnpicklingError(f"a list of {kind.__name__} that is not one")
        return values

    return build


_BUILDERS = {
    ("torch.jit._pickle", "build_intlist"): _plain_list(int),
    ("torch.jit._pickle", "build_doublelist"): _plain_list(float),
    ("torch.jit._pickle", "build_boollist"): _plain_list(bool),
}


class _PlainUnpickler(pickle.Unpickler):
    """Builds plain data only: every class or function the pickle names is refused."""

    def find_class(self, module: str, name: str) -> Any:
        builder = _BUILDERS.get((module, name))
        if builder is None:
            raise pickle.UnpicklingError(
                f"it names {shown(module, 40)}.{shown(name, 40)}, which is no plain data"
            )
        return builder

    def persistent_load(self, pid: Any) -> Any:
        raise pickle.UnpicklingError("it refers to an object outside it")


def read_flight_recorder(
    paths: Sequence[Path], where: Sequence[tuple[str, str]] = (), max_rows: int = MAX_ROWS
) -> list[Group]:
    """The process groups of the Flight Recorder dumps ``paths`` (one per rank, each named for
    its rank), from the collectives whose ``where`` entry fields have those values (compared as
    text: ``profiling_name=nccl:all_reduce``); each step's size from its inputs' shapes and dtypes
    (None where a dtype is not known)."""
    ranks: dict[int, Path] = {}
    for path in paths:
        rank = _rank_of(path)
        if rank in ranks:
            raise InputError(f"{shown(ranks[rank])} and {shown(path)} are both the dump of rank {rank}")
        ranks[rank] = path
    name = shown(paths[0]) if len(paths) == 1 else f"the {len(paths):,} Flight Recorder dumps"
    records = (record for rank, path in ranks.items() for record in _records(path, rank, where))
    return collect(records, "process group", "profiling_name", name, bool(where), max_rows)


def _rank_of(path: Path) -> int:
    found = _RANK.search(path.name.removesuffix(".gz"))
    if found is None:
        raise InputError(
            f"{shown(path)}: a Flight Recorder dump is named for its rank (a prefix, then the rank: "
            "trace_3), and this name ends in no number"
        )
    return int(found[1])


def _load(path: Path) -> Mapping[str, Any]:
    """The dictionary a dump holds, built as plain data; anything else an :class:`InputError`."""
    name = shown(path)
    with open_trace(path, MAX_DUMP) as file:
        data = read_at_most(file, MAX_DUMP + 1, name)
    if len(data) > MAX_DUMP:  # a gzip file within the limit that unpacks past it
        raise InputError(f"{name} unpacks to more than {MAX_DUMP:,} bytes: stragglar reads dumps up to that")
    try:
        dump = _PlainUnpickler(io.BytesIO(data)).load()
    except EOFError:
        raise InputError(f"{name}: the pickle ends early (a dump cut short)") from None
    except (pickle.UnpicklingError, ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
        raise InputError(f"{name}: not a Flight Recorder dump stragglar reads: {shown(e, 120)}") from None
    except (RecursionError, MemoryError):
        raise InputError(f"{name}: not a Flight Recorder dump: nested too deep or too large") from None
    if not isinstance(dump, dict) or not isinstance(dump.get("entries"), list):
        raise InputError(f"{name}: not a Flight Recorder dump: no list of 'entries'")
    if not isinstance(dump.get("pg_config"), dict):
        raise InputError(f"{name}: not a Flight Recorder dump: no 'pg_config' of the process groups")
    return dump


def _records(path: Path, rank: int, where: Sequence[tuple[str, str]]) -> Iterator[Record]:
    """The dump's finished collectives, each rank's arrival measured back from the collective's
    end (see the module's docstring).  One not ``retired`` was in flight when the dump was
    written, and is passed over; a dump with none finished says why."""
    name = shown(path)
    dump = _load(path)
    groups = dump["pg_config"]
    in_flight: str | None = None  # the place of the first collective passed over
    timed = False
    members: dict[str, tuple[str, ...]] = {}  # group -> its ranks, read from pg_config once
    for index, entry in enumerate(dump["entries"]):
        place = f"{name} entry {index}"
        if not isinstance(entry, dict):
            raise InputError(f"{place}: not a record (a dictionary)")
        if entry.get("is_p2p") is True:
            continue  # a send or a receive: no collective
        missing = next((key for key, _ in where if key not in entry), None)
        if missing is not None:
            raise InputError(f"{place} has no {quoted(missing)}")
        if any(where_text(entry[key]) != value.strip() for key, value in where):
            continue
        group = _group_name(entry, place)
        duration = entry.get("duration_ms")  # measured as the watchdog retires a finished collective
        if duration is None:
            if entry.get("retired", entry.get("state") == "completed") is True:  # older dumps: no retired
                raise _no_duration(place)
            in_flight = in_flight or place
            continue
        if group not in members:
            members[group] = _members(groups, group, place)
        timed = True
        yield Record(
            group=group,
            members=members[group],
            rank=str(rank),
            step=whole_number(entry.get("collective_seq_id"), "collective_seq_id", place),
            time=-_milliseconds(duration, place),
            size=_size(entry, place),
            kind=_kind(entry, place),
            source=name,
            place=place,
        )
    if in_flight is not None and not timed:
        raise _no_duration(in_flight, "none of its collectives is finished, or ")


def _milliseconds(value: Any, place: str) -> Fraction:
    """``duration_ms`` in seconds, to the nanosecond: finer than CUDA's event timer (half a
    microsecond) and than the float it is written in, and the unit whatif says of the dump."""
    if type(value) not in (int, float) or not math.isfinite(value) or not 0 <= value < 2**53 / 10**6:
        raise InputError(f"{place}: duration_ms is {shown_value(value)}, not a duration")
    return Fraction(round(value * 10**6), 10**9)


_ENDING_TOGETHER = ("allreduce", "reducescatter", "allgather", "alltoall")


def _kind(entry: Mapping[str, Any], place: str) -> str:
    """The record's collective, one whose duration tells the rank's arrival (see the module)."""
    kind = entry.get("profiling_name")
    if not isinstance(kind, str) or not kind:
        raise InputError(f"{place}: profiling_name is {shown_value(kind)}: name the collective")
    if not names_collective(kind, *_ENDING_TOGETHER):
        raise InputError(
            f"{place}: {shown(kind, 40)} ends at other moments on its root and the other ranks, so its "
            "duration does not tell when a rank reached it: keep the gradient collective with --where "
            "(profiling_name=nccl:all_reduce, say)"
        )
    return kind


def _no_duration(place: str, why: str = "") -> InputError:
    return InputError(
        f"{place}: {why}no GPU duration (duration_ms), which tells when the rank reached the "
        "collective: Flight Recorder measures it for the NCCL backend with TORCH_NCCL_ENABLE_TIMING=1"
    )


def _group_name(entry: Mapping[str, Any], place: str) -> str:
    group = entry.get("process_group")
    if not isinstance(group, (tuple, list)) or not group or not isinstance(group[0], str):
        raise InputError(f"{place}: process_group is {shown_value(group)}: name the process group")
    return group[0]


def _members(groups: Mapping[str, Any], group: str, place: str) -> tuple[str, ...]:
    """The process group's global ranks, from ``pg_config`` (a JSON list in a string, or a list)."""
    config = groups.get(group)
    ranks = config.get("ranks") if isinstance(config, dict) else None
    if isinstance(ranks, str):
        try:
            ranks = json.loads(ranks)
        except (ValueError, RecursionError):
            ranks = None
    if not isinstance(ranks, list) or not all(type(r) is int and r >= 0 for r in ranks) or not ranks:
        raise InputError(f"{place}: pg_config gives no list of ranks for process group {quoted(group)}")
    if len(set(ranks)) != len(ranks):
        raise InputError(f"{place}: pg_config names a rank twice in process group {quoted(group)}")
    return tuple(str(r) for r in ranks)


def _size(entry: Mapping[str, Any], place: str) -> int | None:
    """The collective's input bytes: each input's elements times its dtype's bytes; None where a
    dtype is not one this reader knows."""
    shapes, dtypes = entry.get("input_sizes"), entry.get("input_dtypes")
    if not isinstance(shapes, list) or not isinstance(dtypes, list) or len(shapes) != len(dtypes):
        raise InputError(f"{place}: input_sizes and input_dtypes are no lists of one item per input")
    total = 0
    for shape, dtype in zip(shapes, dtypes, strict=True):
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise InputError(f"{place}: input_sizes holds {shown_value(shape)}, not a shape")
        if dtype not in _BYTES:
            return None
        total += math.prod(shape) * _BYTES[dtype]
    return total
