"""Reading NCCL Inspector's JSON: a communicator per group, a step per coll_sn, a rank's arrival
its first kernel start (not the host's enqueue), and every malformed or inconsistent set of
files refused in one line."""

from __future__ import annotations

import json
import shutil
from fractions import Fraction
from pathlib import Path

import pytest
from trace_writers import inspector_record, late_rank_arrivals, write_inspector

from stragglar.errors import InputError
from stragglar.formats.inspector import read_inspector
from stragglar.formats.traces import INSPECTOR, trace_files, trace_format_of

ARRIVALS = late_rank_arrivals(ranks=4, steps=8, late=2, by_us=20_000)
ALLREDUCE = [("coll", "AllReduce")]


def refused(paths: list[Path], where: list[tuple[str, str]] = ALLREDUCE) -> str:
    with pytest.raises(InputError) as info:
        read_inspector(paths, where)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_a_rank_arrives_when_its_first_kernel_starts_not_when_its_host_enqueues(tmp_path: Path) -> None:
    paths = write_inspector(tmp_path, "0x7f3a", ARRIVALS, size=1 << 20)
    assert trace_format_of(paths[:1], None) == INSPECTOR  # told by content: the files end in .log
    (group,) = read_inspector(trace_files([tmp_path]), ALLREDUCE)
    assert (group.name, group.ranks, group.steps) == ("0x7f3a", ("0", "1", "2", "3"), tuple(ARRIVALS))
    assert group.times == tuple(tuple(Fraction(t, 10**6) for t in times) for times in ARRIVALS.values())
    assert group.sizes == (1 << 20,) * len(ARRIVALS)
    late = [max(range(4), key=row.__getitem__) for row in group.times]
    assert late[3:] == [2] * 5  # rank 2 late from step 13 on, though its host enqueued on time


def test_where_reads_the_collective_s_fields_then_the_communicator_s(tmp_path: Path) -> None:
    paths = write_inspector(tmp_path, "0x7f3a", ARRIVALS, size=1 << 20)
    (broadcast,) = read_inspector(paths, [("coll", "Broadcast"), ("comm_name", " dp ")])
    assert broadcast.steps == tuple(range(1, 9)) and broadcast.sizes == (64,) * 8
    assert "no collective in the 4 NCCL Inspector files after the --where filters" in refused(
        paths, [("coll", "AllGather")]
    )
    assert "has no 'algo' in coll_perf or header" in refused(paths, [("algo", "Ring")])
    with pytest.raises(InputError, match="more than 5 collectives to replay in the 4 NCCL Inspector files"):
        read_inspector(paths, ALLREDUCE, max_rows=5)


def test_two_communicators_are_two_groups_and_steps_only_some_ranks_hold_are_cut(tmp_path: Path) -> None:
    first = write_inspector(tmp_path / "a", "0xaa", ARRIVALS, size=256, others=False)
    second = write_inspector(tmp_path / "b", "0xbb", ARRIVALS, size=512, others=False)
    lines = first[0].read_text().splitlines()
    first[0].write_text("\n".join(lines[1:]) + "\n")  # rank 0's ring had lost the first step
    groups = read_inspector([*first, *second])
    assert [g.name for g in groups] == ["0xaa", "0xbb"]
    assert groups[0].steps == tuple(ARRIVALS)[1:] and groups[1].steps == tuple(ARRIVALS)


def write_lines(path: Path, *records: object) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def record(rank: int = 0, ranks: int = 2, sn: int = 1, **changes: object) -> dict[str, object]:
    line = inspector_record("0xc0", rank, ranks, "AllReduce", sn, 4096, START + rank, START)
    for key, value in changes.items():
        part, _, field = key.partition("__")
        if value is None:
            del line[part][field]
        else:
            line[part][field] = value
    return line


START = 1_750_000_000_000_000


def test_a_record_longer_than_a_line_is_still_told_an_inspector_record(tmp_path: Path) -> None:
    """A first record of 15,000 kernel events (over 1 MiB) was cut where the format is told, read as
    no JSON, and so taken for JSON Lines: "x is JSON Lines and y NCCL Inspector's JSON"."""
    long = record()
    long["coll_perf"]["kernel_events"] = [{"start": i} for i in range(100_000)]  # type: ignore[index]
    path = write_lines(tmp_path / "long.log", long)
    assert path.stat().st_size > 2**20
    assert trace_format_of([path], None) == INSPECTOR


@pytest.mark.parametrize(
    ("lines", "words"),
    [
        (
            ['{"header": {"id": "0xc0", "rank": 0, "n_ranks": 2}, "coll_perf": {"coll": "AllRed'],
            "line 1: not JSON",
        ),
        (
            [json.dumps(record())[:-1] + ', "coll_perf": {}}'],
            "line 1: not JSON: the key 'coll_perf' is there twice",
        ),
        ([{"metadata": {}, "coll_perf": {}}], "line 1: no 'header' object: not an NCCL Inspector record"),
        ([{"header": {}, "metadata": {}}], "no 'coll_perf' object"),
        ([record(header__rank=2)], "line 1: rank 2 of a communicator of 2 ranks"),
        ([record(header__n_ranks="2")], "n_ranks is '2', not a whole number"),
        ([record(header__n_ranks=2**40)], "n_ranks is 1,099,511,627,776: stragglar replays up to 1,048,576"),
        ([record(header__id=None)], "header.id is empty: name the communicator"),
        ([record(coll_perf__coll_sn=-1)], "coll_sn is -1: negative, which no count or time here can be"),
        ([record(coll_perf__coll_sn=2**70)], f"coll_sn is {2**70}: more than the 64 bits it is written in"),
        ([record(coll_perf__event_trace_ts=None)], "no kernel start times (coll_perf.event_trace_ts)"),
        (
            [record(coll_perf__event_trace_ts={"kernel_events": []})],
            "no kernel of the collective has a start",
        ),
        ([record(), record(rank=1, header__n_ranks=3)], "line 2: communicator '0xc0' has 3 ranks here and 2"),
        ([record(), record(sn=1)], "line 2: rank '0' at step 1 of communicator '0xc0' is there twice"),
        ([record(), record(coll_perf__coll="Broadcast")], "holds Broadcast and AllReduce collectives"),
        ([record()], "communicator '0xc0' has 2 ranks and no file holds rank '1'"),
    ],
)
def test_malformed_records_are_one_line_naming_the_place(
    tmp_path: Path, lines: list[object], words: str
) -> None:
    assert words in refused([write_lines(tmp_path / "r0.log", *lines)], [])


def test_non_verbose_records_say_how_to_get_the_kernel_times(tmp_path: Path) -> None:
    paths = write_inspector(tmp_path, "0x7f3a", ARRIVALS, size=1 << 20, verbose=False)
    assert "with NCCL_INSPECTOR_DUMP_VERBOSE=1" in refused(paths)


def test_files_that_disagree_are_refused(tmp_path: Path) -> None:
    paths = write_inspector(tmp_path, "0x7f3a", ARRIVALS, size=1 << 20)
    copy = tmp_path / "copy.log"
    shutil.copy(paths[1], copy)
    assert "rank '1' of communicator '0x7f3a' is in two files" in refused([*paths, copy])
    assert "no file holds rank '3'" in refused(paths[:3])


def test_a_sample_of_the_collectives_keeps_the_steps_every_rank_wrote(tmp_path: Path) -> None:
    """NCCL's Inspector before 2.30 writes a sample (one finished collective per communicator at
    each of its dump thread's ticks), other steps on each rank: whatif refused every such trace
    ("step 13 has no record of rank '0'").  The steps all ranks wrote are kept, the rest counted."""
    paths = write_inspector(tmp_path, "0x7f3a", ARRIVALS, size=1 << 20, others=False)
    for rank, path in enumerate(paths):  # rank r lost step 11 + r
        lines = path.read_text().splitlines()
        path.write_text("".join(line + "\n" for i, line in enumerate(lines) if i != 1 + rank))
    (group,) = read_inspector(paths, ALLREDUCE)
    kept = tuple(step for step in ARRIVALS if step not in (11, 12, 13, 14))
    assert group.steps == kept and group.partial == 4
    assert group.times == tuple(tuple(Fraction(t, 10**6) for t in ARRIVALS[step]) for step in kept)


def test_a_size_that_differs_between_ranks_names_both(tmp_path: Path) -> None:
    lines = [record(), record(rank=1, coll_perf__coll_msg_size_bytes=8192)]
    message = refused(
        [write_lines(tmp_path / "a.log", lines[0]), write_lines(tmp_path / "b.log", lines[1])], []
    )
    assert "at step 1 rank '0' reduces 4096 bytes and rank '1' 8192: mismatched ranks" in message


def test_the_lines_read_are_bounded_kept_or_not(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records a filter drops (or sends, which are no collective) were read without end: a gzip
    file of a few MB unpacks to billions of lines.  The lines read stop at MAX_READ_ROWS (here 50)."""
    monkeypatch.setattr("stragglar.formats.traces.MAX_READ_ROWS", 50)
    path = write_lines(tmp_path / "rank0.log", *(record(sn=sn) for sn in range(1, 60)))
    assert refused([path], [("coll", "Broadcast")]) == (
        f"{path} has more than 50 lines: cut the trace to the steps to replay (--where reads every line)"
    )
