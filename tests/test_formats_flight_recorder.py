"""Reading PyTorch Flight Recorder dumps: a process group per group, a step per collective
sequence id, a rank's arrival its GPU duration before the collective's common end; pickles read
as plain data only, and every malformed or inconsistent set of dumps refused in one line."""

from __future__ import annotations

import os
import pickle
import shutil
import struct
from fractions import Fraction
from pathlib import Path

import pytest
from trace_writers import (
    flight_recorder_dump,
    flight_recorder_entry,
    late_rank_arrivals,
    step_end_us,
    write_flight_recorder,
)

from stragglar.errors import InputError
from stragglar.formats.flight_recorder import read_flight_recorder
from stragglar.formats.traces import FLIGHT_RECORDER, trace_files, trace_format_of

ARRIVALS = late_rank_arrivals(ranks=4, steps=8, late=1, by_us=30_000)


def refused(paths: list[Path], where: list[tuple[str, str]] | None = None) -> str:
    with pytest.raises(InputError) as info:
        read_flight_recorder(paths, where or [])
    message = str(info.value)
    assert "\n" not in message
    return message


def test_a_rank_arrives_its_gpu_duration_before_the_collective_s_common_end(tmp_path: Path) -> None:
    """torch discovers a finished collective's start and end at the watchdog poll that retires
    it, after its end (each rank at its own poll): the late rank shows in its GPU duration alone,
    the shortest, and the reader took the discovered start before (every rank alike)."""
    paths = write_flight_recorder(tmp_path, "0", ARRIVALS, shape=[1024, 256])
    assert trace_format_of(paths[:1], None) == FLIGHT_RECORDER
    (group,) = read_flight_recorder(trace_files([tmp_path]))
    assert (group.name, group.ranks, group.steps) == ("0", ("0", "1", "2", "3"), tuple(ARRIVALS))
    assert group.times == tuple(
        tuple(Fraction(t - step_end_us(times), 10**6) for t in times) for times in ARRIVALS.values()
    )
    assert group.sizes == (1024 * 256 * 4,) * len(ARRIVALS)  # float32 inputs
    (picked,) = read_flight_recorder(paths, [("profiling_name", "nccl:all_reduce"), ("state", "completed")])
    assert picked.steps == group.steps
    assert "after the --where filters" in refused(paths, [("profiling_name", "nccl:broadcast")])


def dump_file(path: Path, entries: list[dict[str, object]], members: tuple[int, ...] = (0, 1)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps(flight_recorder_dump("0", members, entries), protocol=2))
    return path


def test_the_lists_torchscript_writes_are_built_as_plain_lists(tmp_path: Path) -> None:
    """TorchScript's pickler writes an int list as a call of torch.jit._pickle.build_intlist."""
    paths = []
    for rank in (0, 1):
        entry = {**flight_recorder_entry("0", 1, 0.5 + rank, [1]), "input_sizes": ["SHAPE"]}
        data = pickle.dumps(flight_recorder_dump("0", (0, 1), [entry]), protocol=2)
        plain = b"X" + struct.pack("<I", 5) + b"SHAPE"
        built = b"ctorch.jit._pickle\nbuild_intlist\n](K\x08K\x10e\x85R"
        assert data.count(plain) == 1  # the output's shape is the input's, memoized
        path = tmp_path / f"trace_{rank}"
        path.write_bytes(data.replace(plain, built))
        paths.append(path)
    (group,) = read_flight_recorder(paths)
    assert group.sizes == (8 * 16 * 4,)


def test_a_pickle_that_names_any_other_class_is_refused_unbuilt(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    hostile = tmp_path / "trace_0"
    hostile.write_bytes(
        b"\x80\x02cos\nsystem\nq\x00X" + struct.pack("<I", 12) + f"touch {marker}".encode()[:12] + b"\x85R."
    )
    assert "names os.system, which is no plain data" in refused([hostile])
    assert not marker.exists()
    builtin = dump_file(tmp_path / "trace_1", [])
    builtin.write_bytes(b"\x80\x02c__builtin__\nset\n)R.")
    assert "names __builtin__.set" in refused([builtin])
    fake = tmp_path / "trace_2"
    fake.write_bytes(b"\x80\x02ctorch.jit._pickle\nbuild_intlist\nX\x01\x00\x00\x00a\x85R.")
    assert "a list of int that is not one" in refused([fake])


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"", "the pickle ends early"),
        (pickle.dumps({"entries": []}, protocol=2)[:-6], "pickle data was truncated"),
        (pickle.dumps([1, 2], protocol=2), "no list of 'entries'"),
        (pickle.dumps({"entries": [], "version": "2.9"}, protocol=2), "no 'pg_config' of the process groups"),
        (b"\x80\x02\xff", "not a Flight Recorder dump stragglar reads"),
    ],
)
def test_what_is_no_dump_is_one_line(tmp_path: Path, data: bytes, words: str) -> None:
    path = tmp_path / "trace_0"
    path.write_bytes(data)
    assert words in refused([path])


def entry(seq: int = 1, duration_ms: float | None = 0.5, **changes: object) -> dict[str, object]:
    return {**flight_recorder_entry("0", seq, duration_ms, [4]), **changes}


UNRETIRED_COMPLETED = {k: v for k, v in entry(duration_ms=None, state="completed").items() if k != "retired"}


@pytest.mark.parametrize(
    ("entries", "words"),
    [
        ([entry(duration_ms=None, retired=True)], "entry 0: no GPU duration (duration_ms), which tells"),
        ([UNRETIRED_COMPLETED], "entry 0: no GPU duration (duration_ms)"),  # a dump older than retired
        ([{**entry(), "duration_ms": "0.5"}], "entry 0: duration_ms is '0.5', not a duration"),
        ([entry(duration_ms=-0.5)], "entry 0: duration_ms is -0.5, not a duration"),
        ([entry(profiling_name=None)], "entry 0: profiling_name is empty: name the collective"),
        ([entry(collective_seq_id="1")], "entry 0: collective_seq_id is '1', not a whole number"),
        ([entry(process_group=None)], "process_group is empty: name the process group"),
        ([entry(process_group=("9", "tp"))], "pg_config gives no list of ranks for process group '9'"),
        ([entry(input_sizes=[[4, -1]])], "input_sizes holds [4, -1], not a shape"),
        ([entry(input_dtypes=[])], "input_sizes and input_dtypes are no lists of one item per input"),
        ([entry(), entry()], "entry 1: rank '0' at step 1 of process group '0' is there twice"),
        (["all_reduce"], "entry 0: not a record"),
    ],
)
def test_malformed_entries_are_one_line_naming_the_entry(
    tmp_path: Path, entries: list[object], words: str
) -> None:
    assert words in refused([dump_file(tmp_path / "trace_0", entries)])  # type: ignore[arg-type]


def shared_lists(levels: int) -> list[object]:
    """Lists of lists that share their items: a few hundred bytes of pickle, 10**levels leaves."""
    value: list[object] = ["a"] * 10
    for _ in range(levels - 1):
        value = [value] * 10
    return value


def test_a_value_that_shares_its_parts_is_shown_cut_not_written_out(tmp_path: Path) -> None:
    """A 16 KB dump whose input_sizes held 10**10 strings through shared lists was written out as
    JSON to be cut to 80 characters: gigabytes, minutes, and Ctrl-C unheard meanwhile."""
    bomb = shared_lists(10)
    message = refused([dump_file(tmp_path / "trace_0", [entry(input_sizes=[bomb])])])
    assert message.endswith("... (more than 1,048,576 characters), not a shape"), message
    named = [entry(seq=s, profiling_name=bomb) for s in (1, 2)]  # compared by --where: the same bound
    where = [("profiling_name", "nccl:all_reduce")]
    assert "after the --where filters" in refused([dump_file(tmp_path / "w" / "trace_0", named)], where)


def test_dumps_that_disagree_are_refused(tmp_path: Path) -> None:
    paths = write_flight_recorder(tmp_path / "run", "0", ARRIVALS, shape=[8])
    assert "no file holds rank '2'" in refused([paths[0], paths[1], paths[3]])
    copy = tmp_path / "again_3"
    shutil.copy(paths[3], copy)
    assert "are both the dump of rank 3" in refused([*paths, copy])
    unnamed = tmp_path / "trace"
    shutil.copy(paths[0], unnamed)
    assert "this name ends in no number" in refused([unnamed])
    three = dump_file(tmp_path / "other" / "trace_2", [entry(seq=s) for s in ARRIVALS], members=(0, 1, 2))
    assert "process group '0' has 3 ranks here and 4" in refused([paths[0], paths[1], three, paths[3]])
    stranger = dump_file(tmp_path / "trace_7", [entry(seq=s) for s in ARRIVALS], members=(0, 1, 2, 3))
    assert "rank '7' is no rank of process group '0'" in refused([*paths, stranger])


def test_a_huge_dump_is_refused_before_it_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import stragglar.formats.flight_recorder as flight_recorder

    path = dump_file(tmp_path / "trace_0", [entry()])
    monkeypatch.setattr(flight_recorder, "MAX_DUMP", os.path.getsize(path) - 1)
    assert "stragglar reads files up to" in refused([path])


def test_a_collective_in_flight_at_the_dump_is_passed_over(tmp_path: Path) -> None:
    """Not retired: the dump came first, it has no duration yet; a dump of those alone says why."""
    both = [[entry(seq=1), entry(seq=2, duration_ms=None)], [entry(seq=1), entry(seq=2)]]
    paths = [dump_file(tmp_path / "a" / f"trace_{rank}", entries) for rank, entries in enumerate(both)]
    (group,) = read_flight_recorder(paths)
    assert group.steps == (1,) and group.partial == 1
    never = dump_file(tmp_path / "b" / "trace_0", [entry(seq=1, duration_ms=None)])
    assert "entry 0: none of its collectives is finished, or no GPU duration (duration_ms)" in refused(
        [never]
    )


def test_a_group_holding_two_kinds_of_collective_asks_for_one(tmp_path: Path) -> None:
    """Flight Recorder numbers every collective of a group in one sequence: an AllGather among the
    AllReduces was replayed as a gradient step without a word."""
    mixed = [entry(seq=1), entry(seq=2, profiling_name="nccl:all_gather"), entry(seq=3)]
    paths = [dump_file(tmp_path / f"trace_{rank}", mixed) for rank in (0, 1)]
    assert (
        "process group '0' holds nccl:all_gather and nccl:all_reduce collectives: keep one kind with "
        "--where (profiling_name=nccl:all_reduce, say)"
    ) in refused(paths)
    (group,) = read_flight_recorder(paths, [("profiling_name", "nccl:all_reduce")])
    assert group.steps == (1, 3)


@pytest.mark.parametrize("kind", ["nccl:broadcast", "nccl:reduce", "nccl:send 0->1"])
def test_a_rooted_collective_whose_ranks_end_apart_is_refused(tmp_path: Path, kind: str) -> None:
    """A Broadcast's root finishes once it has sent, the others once they have received: how long
    it ran does not tell when a rank reached it, and such a group was replayed as arrivals."""
    paths = [dump_file(tmp_path / f"trace_{rank}", [entry(seq=1, profiling_name=kind)]) for rank in (0, 1)]
    assert f"entry 0: {kind} ends at other moments on its root and the other ranks" in refused(paths)
    kept = [entry(seq=1), entry(seq=2, profiling_name=kind), entry(seq=3)]
    paths = [dump_file(tmp_path / "k" / f"trace_{rank}", kept) for rank in (0, 1)]
    assert read_flight_recorder(paths, [("profiling_name", "nccl:all_reduce")])[0].steps == (1, 3)


# Two gloo ranks that all-reduce with Flight Recorder on, each dumping its buffer to trace_<rank>.
RANK = """
import os, sys
os.environ["TORCH_FR_BUFFER_SIZE"] = "100"
import torch, torch.distributed as dist
rank, folder = int(sys.argv[1]), sys.argv[2]
dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=2)
tensor = torch.full((250,), float(rank))
for _ in range(3):
    dist.all_reduce(tensor)
dist.barrier()
with open(f"{folder}/dumps/trace_{rank}", "wb") as out:
    out.write(torch._C._distributed_c10d._dump_fr_trace())
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_a_dump_torch_writes_is_read_as_plain_data(tmp_path: Path) -> None:
    """A real dump unpickles with no class refused; gloo records no GPU duration, and says so."""
    pytest.importorskip("torch")
    import subprocess
    import sys

    (tmp_path / "dumps").mkdir()
    ranks = [
        subprocess.Popen([sys.executable, "-c", RANK, str(rank), str(tmp_path)], stderr=subprocess.PIPE)
        for rank in (0, 1)
    ]
    for process in ranks:
        _, err = process.communicate(timeout=120)
        assert process.returncode == 0, err.decode()
    paths = trace_files([tmp_path / "dumps"])
    assert [trace_format_of([path], None) for path in paths] == [FLIGHT_RECORDER] * 2
    assert "no GPU duration (duration_ms)" in refused(paths, [("profiling_name", "gloo:all_reduce")])
