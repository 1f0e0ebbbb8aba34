"""Reading arrival traces (CSV, JSON Lines, Parquet) with named columns, filters and units, every
malformed one refused in one line, and the hook's writer appending whole lines."""

from __future__ import annotations

import json
import os
import threading
from fractions import Fraction
from pathlib import Path

import pytest

from stragglar.errors import InputError, ResourceError
from stragglar.files import check_appendable
from stragglar.formats.traces import (
    TIME_UNITS,
    Columns,
    TraceWriter,
    read_trace,
    trace_files,
    trace_format_of,
    trace_lines,
)


def csv_file(tmp_path: Path, text: str, name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


DEFAULT = Columns()


def refused(path: Path, fmt: str = "csv", columns: Columns = DEFAULT, **kwargs: object) -> str:
    with pytest.raises(InputError) as info:
        read_trace(path, fmt, columns, **kwargs)  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message
    return message


def test_columns_filters_groups_and_units_are_read_as_named(tmp_path: Path) -> None:
    lines = ["stage,dp,iter,op,start_us"]
    for stage in (0, 1):
        for it in (7, 8):
            for dp in (3, 1):  # ranks renumbered 0..N-1 in label order: 1 -> 0, 3 -> 1
                lines.append(f"{stage},{dp},{it},allreduce,{1000 * it + dp * (stage + 1)}")
                lines.append(f"{stage},{dp},{it},allgather,5")
    path = csv_file(tmp_path, "\n".join(lines) + "\n")
    columns = Columns(rank="dp", step="iter", time="start_us", group="stage")
    groups = read_trace(path, "csv", columns, [("op", "allreduce")], TIME_UNITS["us"])
    assert [g.name for g in groups] == ["0", "1"]
    assert all(g.ranks == ("1", "3") and g.steps == (7, 8) for g in groups)
    assert groups[1].times[0] == (Fraction(7002, 10**6), Fraction(7006, 10**6))


def test_json_lines_read_numbers_and_strings_alike(tmp_path: Path) -> None:
    rows = [{"step": 1, "rank": "a", "time": 0.5}, {"step": "1", "rank": "b", "time": "2.5e-1"}, {}]
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows[:2]) + "\n\n")
    (group,) = read_trace(path, "jsonl", Columns(), (), TIME_UNITS["ms"])
    assert group.ranks == ("a", "b") and group.times == ((Fraction(1, 2000), Fraction(1, 4000)),)


def test_parquet_is_read_with_pyarrow(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    path = tmp_path / "t.parquet"
    columns = {"rank": [0, 1, 0, 1], "step": [1, 1, 2, 2], "time": [0.0, 0.25, 1.0, 1.5], "op": ["x"] * 4}
    table = pa.table(columns)
    pq.write_table(table, path)
    (group,) = read_trace(path, "parquet", Columns(), [("op", "x")])
    assert group.steps == (1, 2) and group.times[1] == (Fraction(1), Fraction(3, 2))
    assert "no column 'when'" in refused(path, "parquet", Columns(time="when"))
    assert "not a Parquet file" in refused(csv_file(tmp_path, "step,rank,time\n"), "parquet")


def test_parquet_without_pyarrow_says_how_to_get_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    message = refused(csv_file(tmp_path, "x", "t.parquet"), "parquet")
    assert "pip install pyarrow" in message


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("", "is empty: no header row"),
        ("step,rank,time\n", "has no rows in it"),
        ("step,rank\n1,0\n", "has no column 'time' (its columns: 'step', 'rank')"),
        ("step,rank,time\n1,0,soon\n1,1,2\n", "line 2: time is 'soon', not a number"),
        ("step,rank,time\n1,0,nan\n1,1,2\n", "time is 'nan', not a number"),
        ("step,rank,time\n1,0,1e99999\n1,1,2\n", "time is '1e99999', not a number"),
        ("step,rank,time\n1,0,1e300\n1,1,2\n", "time is '1e300': at most 1e+30 of its unit"),
        ("step,rank,time\n1.5,0,1\n", "line 2: step is '1.5', not a whole number of steps"),
        (
            "step,rank,time\r1,0,1\r1,1,2\r",
            "line 1: a carriage return alone ends lines: make them line feeds",
        ),
        # whole, but more digits than any trace's steps: said so, not "not a whole number"
        (
            "step,rank,time\n" + "1" * 31 + ",0,1\n",
            "line 2: step is '" + "1" * 31 + "': a step has at most 18",
        ),
        # Arabic-Indic digits: Python's int() reads them, the XML and every other reader here do not
        ("step,rank,time\n\u0661,0,1\n", "line 2: step is '\u0661', not a whole number of steps"),
        ("step,rank,time\n1,0,\u06617\n", "line 2: time is '\u06617', not a number"),
        ("step,rank,time\n1,0,1\n1,1,2\n2,0,3\n", "step 2 has no row for rank '1'"),
        (
            "step,rank,time\n1,0,1\n1,1,2\n1,0,3\n",
            "line 4: rank '0' at step 1 is there twice: a row per operation? keep one with --where",
        ),
        ("step,rank,time\n1,0,1\n", "only one rank"),
        ("step,rank,time\n1,0\n", "line 2: 2 fields, the header has 3"),
        ("step,rank,time,rank\n1,0,1,0\n", "two columns named 'rank'"),
        ("step,rank,time\n1,,1\n", "line 2: rank is '': name a rank or group"),
    ],
)
def test_a_malformed_csv_is_one_line_naming_the_place(tmp_path: Path, text: str, words: str) -> None:
    assert words in refused(csv_file(tmp_path, text))


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('{"step": 1, "rank": 0}\n', "line 1 has no 'time'"),
        ("[1, 2]\n", "line 1: not a JSON object"),
        ('{"step": 1, "rank": 0, "time": NaN}\n', "line 1: not JSON"),
        ('{"step": 1, "rank": 0, "time": true}\n', "time is true, not a number"),
        ('{"step": 1, "rank": 0, "time": 1' + "0" * 400 + "}\n", "at most 1e+30 of its unit"),
        ('{"step": 1, "rank": 0, "time": 1}\n{"step": 1, "rank": 1, "time": [1]}\n', "line 2: time is [1]"),
        ('{"step": 1, "rank": 0, "ti', "line 1: not JSON"),
        ('{"step": 1, "rank": 0, "time": ' + "7" * 5000 + "}\n", "a number has 5000 digits; at most 4300"),
        ("[" * 100_000 + "\n", "line 1: not JSON: nested too deeply"),
    ],
)
def test_malformed_json_lines_are_one_line_naming_the_place(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(text)
    assert words in refused(path, "jsonl")


def test_filters_that_keep_nothing_and_unknown_filter_columns_are_refused(tmp_path: Path) -> None:
    path = csv_file(tmp_path, "step,rank,time,op\n1,0,1,x\n1,1,1,x\n")
    assert "no rows after the --where filters" in refused(path, where=[("op", "y")])
    assert "no column 'kind'" in refused(path, where=[("kind", "x")])
    assert "no column 'stage'" in refused(path, columns=Columns(group="stage"))


def test_a_huge_trace_is_refused_after_a_bounded_number_of_rows(tmp_path: Path) -> None:
    path = tmp_path / "big.csv"
    with path.open("w") as out:
        out.write("step,rank,time\n")
        out.writelines(f"{step},{rank},{step}\n" for step in range(5_000) for rank in range(4))
    assert "more than 1,000 rows to replay" in refused(path, max_rows=1_000)
    long_line = csv_file(tmp_path, "step,rank,time\n1,0," + "1" * (2**20 + 10) + "\n", "long.csv")
    assert "line 2 is longer than 1,048,576 bytes" in refused(long_line)


def test_rows_read_are_bounded_too_not_only_rows_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--where reads every row: a 1.5 MB Parquet file of 100,000,000 rows that a filter drops kept
    whatif busy for 8 minutes.  The rows read stop at MAX_READ_ROWS (here 2,000)."""
    monkeypatch.setattr("stragglar.formats.traces.MAX_READ_ROWS", 2_000)
    path = tmp_path / "ops.csv"
    with path.open("w") as out:
        out.write("step,rank,time,op\n")
        out.writelines(f"{step},{rank},{step},x\n" for step in range(1_000) for rank in range(4))
    assert refused(path, where=[("op", "allreduce")]) == (
        f"{path} has more than 2,000 rows: cut the trace to the steps to replay (--where reads every row)"
    )


def test_a_last_line_without_its_end_is_refused_as_a_file_cut_short(tmp_path: Path) -> None:
    """A CSV cut in its last number still read as CSV: 1750000003900 us for 1750000003900020, 55
    years early, and every saving printed as 0.0%, without a word."""
    whole = "step,rank,time\n1,0,1750000003900000\n1,1,1750000003900020\n"
    assert read_trace(csv_file(tmp_path, whole, "whole.csv"), "csv", DEFAULT)
    cut = csv_file(tmp_path, whole[:-4], "cut.csv")
    assert refused(cut) == (
        f"{cut} line 3 has no line end: was the file cut while it was written? (end the line to replay "
        "it as it is)"
    )


def test_a_fifo_or_a_folder_is_refused_before_reading(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    assert "not a regular file (stragglar reads traces from files)" in refused(fifo)
    assert "file not found" in refused(tmp_path / "missing.csv")


def test_the_format_is_told_by_the_suffix_or_given(tmp_path: Path) -> None:
    assert (
        trace_format_of([Path("a.CSV")], None) == "csv"
        and trace_format_of([Path("a.ndjson")], None) == "jsonl"
    )
    assert trace_format_of([Path("a.txt")], "parquet") == "parquet"
    text = tmp_path / "a.txt"
    text.write_text("step rank time\n")
    with pytest.raises(InputError, match=r"cannot tell the format of .*a\.txt from its content"):
        trace_format_of([text], None)
    unreadable = tmp_path / "trace_2"  # a file it cannot open was said to tell no format
    unreadable.symlink_to(tmp_path / "gone")
    with pytest.raises(InputError, match=r"^file not found: .*trace_2$"):
        trace_format_of([unreadable], None)


def test_the_writer_appends_whole_steps_that_read_back_exactly(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_bytes(trace_lines(1, [-1.0, 0.0, -0.5]))  # an earlier run's first step
    writer = TraceWriter(path)
    waits = [[0.1 * k + 1e-17, 0.3 / (k + 1), 1 / 3] for k in range(40)]
    threads = [
        threading.Thread(target=writer.append, args=(k + 1, [-w for w in row])) for k, row in enumerate(waits)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    writer.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 3 + 40 * 3 and all(line.endswith("}") for line in lines)
    with pytest.raises(InputError, match="rank '0' at step 1 is there twice"):
        read_trace(path, "jsonl", Columns(), ())
    rows = [json.loads(line) for line in lines[3:]]  # every line whole, each step's three together
    assert all(rows[i]["step"] == rows[i + 1]["step"] == rows[i + 2]["step"] for i in range(0, 120, 3))
    kept = tmp_path / "kept.jsonl"
    kept.write_bytes(b"".join(trace_lines(k + 1, [-w for w in row]) for k, row in enumerate(waits)))
    (read,) = read_trace(kept, "jsonl", Columns(), ())
    assert [tuple(-float(t) for t in row) for row in read.times] == [tuple(row) for row in waits]


def test_the_writer_names_a_file_it_cannot_open(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=r"cannot write traces to .*: No such file"):
        TraceWriter(tmp_path / "no" / "such" / "folder.jsonl")


def test_the_writer_refuses_what_is_no_regular_file_without_blocking(tmp_path: Path) -> None:
    """A FIFO with no reader blocked the writer's open for ever (and the DDP job with it)."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path, Path("/dev/full")):
        with pytest.raises(InputError, match="is not a regular file"):
            TraceWriter(path)
        with pytest.raises(InputError, match="is not a regular file"):
            check_appendable(path, "traces")
    with pytest.raises(InputError, match="its folder does not exist"):
        check_appendable(tmp_path / "no" / "trace.jsonl", "traces")
    check_appendable(tmp_path / "new.jsonl", "traces")  # to be made: fine, and not made yet
    assert not (tmp_path / "new.jsonl").exists()


def test_a_short_write_is_cut_off_again_and_said(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "trace.jsonl"
    writer = TraceWriter(path)
    writer.append(1, [-0.5, 0.0])
    whole = path.read_bytes()
    real = os.write

    def short(fd: int, data: bytes) -> int:  # a disk that fills part-way through the step
        return real(fd, bytes(data)[:10]) if fd == writer._fd else real(fd, data)

    monkeypatch.setattr(os, "write", short)
    with pytest.raises(ResourceError, match=r"cannot write the trace .*: wrote 10 of"):
        writer.append(2, [-0.5, 0.0])
    monkeypatch.undo()
    writer.close()
    assert path.read_bytes() == whole  # no partial line left behind


def test_a_csv_that_starts_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    """A spreadsheet's UTF-8 export starts with a BOM: it was refused as "no column 'step'"."""
    path = tmp_path / "excel.csv"
    path.write_bytes("step,rank,time\n1,0,0.5\n1,1,0.25\n".encode("utf-8-sig"))
    (group,) = read_trace(path, "csv", Columns())
    assert group.times == ((Fraction(1, 2), Fraction(1, 4)),)
    assert trace_format_of([path], None) == "csv"
    jsonl = tmp_path / "bom.jsonl"
    jsonl.write_bytes(
        '{"step": 1, "rank": 0, "time": 1}\n{"step": 1, "rank": 1, "time": 2}\n'.encode("utf-8-sig")
    )
    assert trace_format_of([jsonl.rename(tmp_path / "bom.txt")], None) == "jsonl"  # told by content
    (group,) = read_trace(tmp_path / "bom.txt", "jsonl", Columns())
    assert group.steps == (1,)


def test_a_json_lines_row_with_a_repeated_key_is_refused(tmp_path: Path) -> None:
    """It silently took the last value: which one the writer meant is unknown."""
    path = tmp_path / "t.jsonl"
    path.write_text('{"step": 1, "rank": 0, "time": 1}\n{"step": 1, "rank": 1, "time": 2, "time": 3}\n')
    assert "line 2: not JSON: the key 'time' is there twice" in refused(path, "jsonl")


def test_where_values_and_cells_are_both_compared_stripped(tmp_path: Path) -> None:
    path = csv_file(
        tmp_path, "step, rank, time, op\n1, 0, 1, allreduce\n1, 1, 2, allreduce \n1, 0, 5, other\n"
    )
    (group,) = read_trace(path, "csv", Columns(), [("op", " allreduce")])
    assert group.times == ((Fraction(1), Fraction(2)),)


@pytest.mark.parametrize(
    ("kind", "values", "unit", "seconds"),
    [
        (
            "timestamp[ns]",
            [1_750_000_000_123_456_789, 1_750_000_000_123_456_790],
            None,
            [Fraction(1_750_000_000_123_456_789, 10**9), Fraction(1_750_000_000_123_456_790, 10**9)],
        ),
        ("timestamp[us, tz=UTC]", [5, 7], None, [Fraction(5, 10**6), Fraction(7, 10**6)]),
        ("duration[ms]", [250, 1500], None, [Fraction(1, 4), Fraction(3, 2)]),
        ("decimal128(20, 6)", ["1.000001", "2.5"], "ms", [Fraction(1_000_001, 10**9), Fraction(1, 400)]),
    ],
)
def test_parquet_times_of_timestamp_duration_or_decimal_are_read_exactly(
    tmp_path: Path, kind: str, values: list[object], unit: str | None, seconds: list[Fraction]
) -> None:
    """Profilers write timestamps: such a column was a traceback.  A unit given for one is refused,
    seconds too (``--time-unit s``, the default written out, was ignored)."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    from decimal import Decimal

    types = {
        "timestamp[ns]": pa.timestamp("ns"),
        "timestamp[us, tz=UTC]": pa.timestamp("us", tz="UTC"),
        "duration[ms]": pa.duration("ms"),
        "decimal128(20, 6)": pa.decimal128(20, 6),
    }
    cells = [Decimal(v) for v in values] if kind.startswith("decimal") else values  # type: ignore[arg-type]
    path = tmp_path / "t.parquet"
    pq.write_table(
        pa.table({"step": [1, 1], "rank": [0, 1], "time": pa.array(cells, type=types[kind])}), path
    )
    (group,) = read_trace(path, "parquet", Columns(), (), None if unit is None else TIME_UNITS[unit])
    assert group.times == (tuple(seconds),)
    if not kind.startswith("decimal"):
        for given in ("ms", "s"):
            assert "time is a timestamp or duration, in its own unit: drop --time-unit" in refused(
                path, "parquet", unit=TIME_UNITS[given]
            )


def test_the_format_is_told_by_the_content_before_the_name(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    parquet = tmp_path / "export.dat"
    pq.write_table(pa.table({"step": [1]}), parquet)
    assert trace_format_of([parquet], None) == "parquet"
    assert trace_format_of([csv_file(tmp_path, "step,rank,time\n", "t.csv")], None) == "csv"
    assert trace_format_of([csv_file(tmp_path, '{"a": 1}\n', "rows.csv")], "csv") == "csv"  # given wins


def test_a_folder_stands_for_its_files(tmp_path: Path) -> None:
    for name in ("b", "a", ".hidden"):
        (tmp_path / name).write_text("x")
    (tmp_path / "sub").mkdir()
    assert trace_files([tmp_path, tmp_path / "a"]) == [tmp_path / "a", tmp_path / "b", tmp_path / "a"]
    with pytest.raises(InputError, match="is a folder with no file in it"):
        trace_files([tmp_path / "sub"])
    with pytest.raises(InputError, match="more than 3 trace files"):
        trace_files([tmp_path, tmp_path], max_files=3)
    with pytest.raises(InputError, match=r"^cannot read a{80}\.\.\. \(304 characters\): File name too long$"):
        trace_files([Path("a" * 300 + ".csv")])  # is_dir raised an OSError: "cannot write the output"


def test_a_quote_left_open_and_a_control_character_are_named_where_they_are(tmp_path: Path) -> None:
    """An open quote took the lines after it into one field, and the error named the file's last
    line; a NUL after a rank made a rank of its own, missing at every other step."""
    open_quote = csv_file(tmp_path, 'step,rank,time\n1,0,1\n1,"1,2\n2,0,1\n2,1,2\n')
    assert refused(open_quote).endswith(
        "t.csv lines 3 to 5: 2 fields, the header has 3 (a quoted field runs from line 3: a quote left open?)"
    )
    nul = csv_file(tmp_path, "step,rank,time\n1,0,1\n1,1\x00,2\n", "nul.csv")
    assert refused(nul).endswith(r"nul.csv line 3: rank is '1\x00': a control character in a label")
