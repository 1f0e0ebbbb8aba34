"""``stragglar whatif`` on inputs it must refuse in one line (exit 2) that say what is wrong: a
false-alarm probability too rare to work a threshold out for, a trace file that is not there
whatever its name, a chunk count one group of several cannot use, files of two formats, records
spread over lines, values no trace can mean; and on traces as jobs and tools leave them, which it
reads: compressed, with an empty file or a cut-off last line, reformatted by ``jq``."""

from __future__ import annotations

import gzip
import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from cli_results import one_error, run
from click.testing import Result
from trace_writers import (
    flight_recorder_dump,
    flight_recorder_entry,
    inspector_record,
    late_rank_arrivals,
    write_csv,
    write_flight_recorder,
    write_inspector,
)

from stragglar.formats.inspector import MAX_RANKS, read_inspector
from stragglar.model.detect import MIN_FALSE_ALARM

ARRIVALS = late_rank_arrivals(ranks=4, steps=12, late=2, by_us=20_000)
MODEL = ("--alpha", "10us", "--bandwidth", "25GB/s", "--window", "4")
ALLREDUCE = ("--where", "coll=AllReduce")


def whatif(*args: str | Path) -> Result:
    return run("whatif", *map(str, args))


def figures(result: Result) -> dict[str, Any]:
    assert result.exit_code == 0, (result.output, result.exception)
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def trace(tmp_path: Path, sizes: dict[str, int]) -> Path:
    """A CSV trace with a group of each size (rank 1 late by 20 ms at each of 12 steps)."""
    lines = ["g,rank,step,time"]
    for step in range(12):
        for group, n in sizes.items():
            lines += [f"{group},{rank},{step},{step + (0.02 if rank == 1 else 0)}" for rank in range(n)]
    path = tmp_path / "grp.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("value", ["2e-308", "1e-310", "5e-324", "1e-300", "1e-13"])
def test_a_false_alarm_rarer_than_the_floor_is_refused_in_one_line(tmp_path: Path, value: str) -> None:
    """Below about 1e-308 the threshold overflowed (a traceback); at 1e-300 it took half a minute."""
    error = one_error(whatif(str(trace(tmp_path, {"a": 4})), "--false-alarm", value, "--share", "0.3"), 2)
    assert error == (
        "Error: Invalid value for '--false-alarm': must be at least 1e-12 (the threshold of a rarer "
        f"false alarm takes too long to work out), got {float(value)}"
    )


def test_a_false_alarm_at_the_floor_is_taken(tmp_path: Path) -> None:
    result = whatif(str(trace(tmp_path, {"a": 4})), "--false-alarm", str(MIN_FALSE_ALARM))
    assert result.exit_code == 0, (result.output, result.exception)
    assert "false alarms begin at 1e-10% of steps at most" in result.output


@pytest.mark.parametrize("name", ["trace.log", "trace_3", "sub/host-pid1.log"])
def test_a_missing_trace_is_not_found_whatever_its_name(tmp_path: Path, name: str) -> None:
    """NCCL Inspector's files end in .log and Flight Recorder's have no suffix: a missing one is
    not found, not a file whose format cannot be told."""
    (tmp_path / "sub").mkdir()
    missing = tmp_path / name
    assert one_error(whatif(str(missing)), 2) == f"Error: file not found: {missing}"


def test_a_chunk_count_too_few_for_one_group_names_that_group(tmp_path: Path) -> None:
    path = trace(tmp_path, {"small": 4, "big": 8})
    error = one_error(whatif(str(path), "--group-col", "g", "--chunks", "5"), 2)
    assert error == "Error: group 'big': StragglAR needs at least N - 1 = 7 chunks, got 5"


def test_a_chunk_count_too_few_for_a_trace_of_one_group_names_none(tmp_path: Path) -> None:
    error = one_error(whatif(str(trace(tmp_path, {"a": 4})), "--chunks", "2"), 2)
    assert error == "Error: StragglAR needs at least N - 1 = 3 chunks, got 2"


def gzipped(paths: list[Path], folder: Path) -> list[Path]:
    """Each file compressed into ``folder`` as ``<name>.gz``, as logs are kept."""
    folder.mkdir()
    packed = []
    for path in paths:
        packed.append(folder / f"{path.name}.gz")
        packed[-1].write_bytes(gzip.compress(path.read_bytes()))
    return packed


def test_gzip_files_replay_as_the_files_they_hold(tmp_path: Path) -> None:
    inspector = write_inspector(tmp_path / "inspector", "0x7f3a", ARRIVALS, size=4 << 20)
    plain = figures(whatif(tmp_path / "inspector", *ALLREDUCE, *MODEL, "--json", "-"))
    gzipped(inspector, tmp_path / "inspector-gz")
    packed = figures(whatif(tmp_path / "inspector-gz", *ALLREDUCE, *MODEL, "--json", "-"))
    assert packed["groups"] == plain["groups"] and packed["format"] == "nccl-inspector"

    dumps = write_flight_recorder(tmp_path / "fr", "0", ARRIVALS, shape=[256, 256])
    plain = figures(whatif(*dumps, *MODEL, "--json", "-"))
    packed = figures(whatif(*gzipped(dumps, tmp_path / "fr-gz"), *MODEL, "--json", "-"))  # trace_3.gz: rank 3
    assert packed["groups"] == plain["groups"] and packed["format"] == "flight-recorder"

    table = write_csv(tmp_path / "t.csv", {"g": ARRIVALS})
    options = ("--group-col", "group", "--time-col", "time_us", "--time-unit", "us", *MODEL, "--json", "-")
    (packed_table,) = gzipped([table], tmp_path / "csv-gz")  # t.csv.gz: told by its suffix under .gz
    assert figures(whatif(packed_table, *options))["groups"] == figures(whatif(table, *options))["groups"]


def test_a_gzip_file_cut_short_or_corrupt_is_one_line(tmp_path: Path) -> None:
    (packed,) = gzipped([write_csv(tmp_path / "t.csv", {"g": ARRIVALS})], tmp_path / "gz")
    data = packed.read_bytes()
    packed.write_bytes(data[: len(data) // 2])
    assert "the gzip stream ends early (a file cut short)" in one_error(
        whatif(packed, "--time-col", "time_us"), 2
    )
    packed.write_bytes(data[:10] + bytes(len(data) - 10))  # a header, then zeros: no deflate stream
    assert "not a whole gzip file" in one_error(whatif(packed, "--time-col", "time_us"), 2)


def test_an_empty_file_in_a_folder_is_passed_over(tmp_path: Path) -> None:
    """A process that recorded nothing leaves an empty file; the first file in name order used to
    decide the format alone, and an empty one told none."""
    folder = tmp_path / "inspector"
    write_inspector(folder, "0x7f3a", ARRIVALS, size=4 << 20)
    expected = figures(whatif(folder, *ALLREDUCE, *MODEL, "--json", "-"))
    (folder / "node0-pid0001.log").write_bytes(b"")  # first in name order
    assert figures(whatif(folder, *ALLREDUCE, *MODEL, "--json", "-"))["groups"] == expected["groups"]
    empty = tmp_path / "empty.log"
    empty.write_bytes(b"")
    assert "empty.log is empty" in one_error(whatif(empty), 2)


def test_files_of_two_formats_are_refused_naming_both(tmp_path: Path) -> None:
    write_inspector(tmp_path / "inspector", "0x7f3a", ARRIVALS, size=64)
    write_flight_recorder(tmp_path / "fr", "0", ARRIVALS, shape=[4])
    message = one_error(whatif(tmp_path / "inspector", tmp_path / "fr"), 2)
    assert "is NCCL Inspector's JSON and" in message and "trace_0 a Flight Recorder dump" in message


def test_an_inspector_record_is_told_by_its_keys_in_any_order(tmp_path: Path) -> None:
    """``jq -S -c`` sorts the keys: ``header`` comes after ``coll_perf``, past the first 4 KB of a
    record with 64 channels' kernel events."""
    folder = tmp_path / "sorted"
    for path in write_inspector(tmp_path / "inspector", "0x7f3a", ARRIVALS, size=64, others=False):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        for record in records:
            events = record["coll_perf"]["event_trace_ts"]["kernel_events"]
            events += [
                {**events[0], "channel_id": c, "kernel_start_ts": events[0]["kernel_start_ts"] + 50}
                for c in range(3, 64)
            ]
        folder.mkdir(exist_ok=True)
        lines = [json.dumps(record, sort_keys=True, separators=(",", ":")) for record in records]
        assert lines[0].index('"header"') > 4096
        (folder / path.name).write_text("".join(line + "\n" for line in lines))
    ours = figures(whatif(folder, *MODEL, "--json", "-"))
    assert ours["format"] == "nccl-inspector"
    assert ours["groups"] == figures(whatif(tmp_path / "inspector", *MODEL, "--json", "-"))["groups"]


def test_json_over_several_lines_is_refused_saying_what_it_looks_like(tmp_path: Path) -> None:
    pretty = tmp_path / "pretty.log"
    record = inspector_record("0x1", 0, 2, "AllReduce", 1, 64, 5, 1)
    pretty.write_text(json.dumps(record, indent=2) + "\n")
    assert "holds NCCL Inspector's records over several lines (pretty-printed?)" in one_error(
        whatif(pretty), 2
    )
    entries = [flight_recorder_entry("0", 1, 0.5, [4])]
    fr_json = tmp_path / "trace_0.json"
    fr_json.write_text(json.dumps(flight_recorder_dump("0", [0, 1], entries)) + "\n")
    assert "holds Flight Recorder's records as JSON: stragglar reads the pickles" in one_error(
        whatif(fr_json), 2
    )


def test_a_last_line_cut_off_ends_that_file_s_records(tmp_path: Path) -> None:
    """A job killed while the plugin wrote a record: the files' common steps end before it."""
    paths = write_inspector(tmp_path / "inspector", "0x7f3a", ARRIVALS, size=64, others=False)
    text = paths[1].read_text()
    paths[1].write_text(text[: len(text) - 200])  # into the last step's record, no line end
    ours = figures(whatif(tmp_path / "inspector", *MODEL, "--json", "-"))
    (group,) = ours["groups"]
    assert [step["step"] for step in group["per_step"]] == sorted(ARRIVALS)[:-1]
    paths[1].write_text(text[: len(text) - 200] + "\n")  # a whole line that is no JSON: refused
    assert "line 12: not JSON: " in one_error(whatif(tmp_path / "inspector", *MODEL), 2)


def test_the_discovered_start_and_end_are_not_read(tmp_path: Path) -> None:
    """They are when the watchdog's poll found the events done (for a finished collective, the
    poll after its end): a start of 0 (never set) once said a rank was 54 years late, and a real
    one said every rank arrived at its own poll.  Arrivals come from the durations alone."""
    paths = write_flight_recorder(tmp_path / "fr", "0", ARRIVALS, shape=[4])
    before = figures(whatif(*paths, *MODEL, "--json", "-"))
    dump = pickle.loads(paths[1].read_bytes())
    for entry in dump["entries"]:
        entry["time_discovered_started_ns"] = 0
        entry["time_discovered_completed_ns"] = 1
    paths[1].write_bytes(pickle.dumps(dump, protocol=2))
    assert figures(whatif(*paths, *MODEL, "--json", "-"))["groups"] == before["groups"]


def test_a_where_on_a_value_json_cannot_write_is_no_traceback(tmp_path: Path) -> None:
    paths = write_flight_recorder(tmp_path / "fr", "0", ARRIVALS, shape=[4])
    for path in paths:
        dump = pickle.loads(path.read_bytes())
        for entry in dump["entries"]:
            entry["frames"] = {(1, 2): 3}  # a dictionary with tuple keys
        path.write_bytes(pickle.dumps(dump, protocol=2))
    assert "no collective in the 4 Flight Recorder dumps after the --where filters" in one_error(
        whatif(*paths, "--where", "frames=x"), 2
    )


def test_a_recorded_size_past_an_exbibyte_is_refused(tmp_path: Path) -> None:
    paths = write_flight_recorder(tmp_path / "fr", "0", ARRIVALS, shape=[2**31, 2**31])
    assert "reduces 18,446,744,073,709,551,616 bytes at a step: more than 1 EiB" in one_error(
        whatif(*paths), 2
    )
    assert whatif(*paths, "--size", "1MiB").exit_code == 0  # a size given replaces it


def test_the_communicators_labels_are_bounded_before_they_are_made(tmp_path: Path) -> None:
    """Distinct n_ranks near the limit, each a tuple of that many labels: a 200 KB file asked for
    gigabytes."""
    path = tmp_path / "big.log"
    sizes = [MAX_RANKS // 2, MAX_RANKS // 2 - 1, MAX_RANKS // 2 - 2]
    records = [inspector_record(f"c{i}", 0, ranks, "AllReduce", 1, 64, 5, 1) for i, ranks in enumerate(sizes)]
    path.write_text("".join(json.dumps(record) + "\n" for record in records))
    with pytest.raises(Exception, match=r"line 3: n_ranks is 524,286: with 1,048,575 ranks of other sizes"):
        read_inspector([path])


def test_a_table_in_the_wrong_unit_is_warned_of(tmp_path: Path) -> None:
    """Nanoseconds since 1970 read as seconds said a rank was 58 days late, and nothing else."""
    trace = tmp_path / "ns.jsonl"
    rows = [
        {
            "step": step,
            "rank": rank,
            "time": 1_700_000_000 * 10**9 + step * 10**9 + (5 * 10**6 if rank == 2 else rank),
        }
        for step in range(1, 30)
        for rank in range(4)
    ]
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    warned = whatif(trace, *MODEL)
    assert warned.exit_code == 0
    assert (
        "warning: the ranks reach a step 5,000,000 s apart (the median): are the times in s?" in warned.stderr
    )
    assert "warning" not in whatif(trace, *MODEL, "--time-unit", "ns").stderr


def test_a_column_named_for_two_parts_and_an_empty_name_are_refused(tmp_path: Path) -> None:
    table = write_csv(tmp_path / "t.csv", {"g": ARRIVALS})
    assert "the rank and the step column are both 'step'" in one_error(whatif(table, "--rank-col", "step"), 2)
    assert "an empty file name: name a file" in one_error(whatif(""), 2)


@pytest.mark.parametrize("float_type", ["float32", "float64"])
def test_times_a_float32_column_cannot_tell_apart_are_warned_of(tmp_path: Path, float_type: str) -> None:
    """Epoch seconds downcast to float32 are 128 s apart: rank 2's 300 ms vanished, and the
    replay said nobody was late; in float64 the same times name it."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    steps, ranks = range(1, 30), range(4)
    times = [
        1.7e9 + 10 * step + (0.3 if rank == 2 and step > 3 else 0.001 * rank)
        for step in steps
        for rank in ranks
    ]
    path = tmp_path / "t.parquet"
    columns = {
        "step": [step for step in steps for _ in ranks],
        "rank": [rank for _ in steps for rank in ranks],
        "time": pa.array(times, type=getattr(pa, float_type)()),
    }
    pq.write_table(pa.table(columns), path)
    result = whatif(path, *MODEL, "--json", "-")
    warning = (
        "warning: every time is a float32's, which near 1.7e+09 s are 128 s apart: lateness finer than "
        "that is lost (write the times as float64 or whole nanoseconds)"
    )
    (group,) = figures(result)["groups"]
    if float_type == "float32":
        assert warning in result.stderr
        assert group["persistent_straggler"] is None
    else:
        assert "warning" not in result.stderr
        assert group["persistent_straggler"] == 2
