"""``stragglar whatif`` on NCCL Inspector and Flight Recorder output: the same arrivals replay to
the same figures as the equivalent CSV table; the format is told by the content; options that
do not apply and inputs that cannot be used are one line and exit 2."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from trace_writers import late_rank_arrivals, write_csv, write_flight_recorder, write_inspector

from stragglar.cli import cli

ARRIVALS = late_rank_arrivals(ranks=4, steps=12, late=2, by_us=20_000)
MODEL = ("--alpha", "10us", "--bandwidth", "25GB/s", "--window", "4")


def run(*args: str | Path) -> Result:
    return CliRunner().invoke(cli, ["whatif", *map(str, args)])


def one_error(result: Result) -> str:
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


def figures(result: Result) -> dict[str, Any]:
    assert result.exit_code == 0, (result.output, result.exception)
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def csv_figures(tmp_path: Path, group: str, size: int, collective: str) -> dict[str, Any]:
    """The figures of the same arrivals in a table, which names no collective: ``collective`` is
    put in, the one field a library's records add."""
    table = write_csv(tmp_path / "same.csv", {group: ARRIVALS})
    options = ("--group-col", "group", "--time-col", "time_us", "--time-unit", "us", "--size", str(size))
    document = figures(run(table, *options, *MODEL, "--json", "-"))
    for found in document["groups"]:
        assert found["collective"] is None
        found["collective"] = collective
    return document


def test_inspector_files_replay_as_the_same_arrivals_in_a_table(tmp_path: Path) -> None:
    write_inspector(tmp_path / "inspector", "0x7f3a", ARRIVALS, size=4 << 20)
    ours = figures(run(tmp_path / "inspector", "--where", "coll=AllReduce", *MODEL, "--json", "-"))
    table = csv_figures(tmp_path, "0x7f3a", 4 << 20, "AllReduce")
    assert ours["format"] == "nccl-inspector" and ours["time_unit"] == "us"
    assert ours["groups"] == table["groups"] and ours["buckets"] == table["buckets"] == [4 << 20]
    (group,) = ours["groups"]
    assert group["per_step"][-1]["lateness"][2] > 0.0199  # the GPU's lateness, not the host's (none)
    text = run(tmp_path / "inspector", "--where", "coll=AllReduce", *MODEL)
    assert text.exit_code == 0 and "group '0x7f3a': 4 ranks, 12 steps" in text.output


def test_flight_recorder_dumps_replay_as_the_same_arrivals_in_a_table(tmp_path: Path) -> None:
    paths = write_flight_recorder(tmp_path / "fr", "0", ARRIVALS, shape=[512, 512])
    ours = figures(run(*paths, *MODEL, "--json", "-"))  # the files themselves, not their folder
    table = csv_figures(tmp_path, "0", 512 * 512 * 4, "nccl:all_reduce")
    assert ours["format"] == "flight-recorder" and ours["time_unit"] == "ns"
    assert ours["groups"] == table["groups"] and ours["buckets"] == table["buckets"]
    assert ours["trace"] == f"{paths[0]} and 3 more"


def test_size_comes_from_the_records_unless_given(tmp_path: Path) -> None:
    write_inspector(tmp_path / "i", "0x7f3a", ARRIVALS, size=4 << 20)
    given = figures(run(tmp_path / "i", "--where", "coll=AllReduce", "--size", "1MiB", *MODEL, "--json", "-"))
    assert given["buckets"] == [1 << 20]
    odd = write_inspector(
        tmp_path / "o", "0xaa", {s: t for s, t in ARRIVALS.items() if s % 2}, 1 << 20, others=False
    )
    even = write_inspector(
        tmp_path / "e", "0xaa", {s: t for s, t in ARRIVALS.items() if s % 2 == 0}, 2 << 20, others=False
    )
    folder = tmp_path / "two"  # each rank's file: two buckets' collectives, the odd and the even
    folder.mkdir()
    for one, other in zip(odd, even, strict=True):
        (folder / one.name).write_text(one.read_text() + other.read_text())
    assert "group '0xaa' reduces 2 sizes (1 MiB, 2 MiB)" in one_error(
        run(folder, "--where", "coll=AllReduce")
    )
    assert figures(run(folder, "--where", "coll=AllReduce", "--size", "3MiB", "--json", "-"))["buckets"] == [
        3 << 20
    ]


def test_table_options_do_not_apply_to_a_library_s_records(tmp_path: Path) -> None:
    write_inspector(tmp_path, "0x7f3a", ARRIVALS, size=4 << 20)
    for option, value in (
        ("--time-col", "t"),
        ("--time-unit", "ms"),
        ("--rank-col", "r"),
        ("--group-col", "g"),
    ):
        assert f"{option} does not apply" in one_error(
            run(tmp_path, "--where", "coll=AllReduce", option, value)
        )


def test_bad_record_inputs_are_one_line_and_exit_2(tmp_path: Path) -> None:
    plain = write_inspector(tmp_path / "plain", "0x7f3a", ARRIVALS, size=64, verbose=False)
    assert "NCCL_INSPECTOR_DUMP_VERBOSE=1" in one_error(run(tmp_path / "plain", "--where", "coll=AllReduce"))
    assert "holds Broadcast and AllReduce" in one_error(
        run(*write_inspector(tmp_path / "v", "0x1", ARRIVALS, 64))
    )
    named = tmp_path / "named" / "trace_0"
    named.parent.mkdir()
    named.write_bytes(plain[0].read_bytes())
    assert "not a Flight Recorder dump stragglar reads" in one_error(
        run(named, "--format", "flight-recorder")
    )
    hostile = tmp_path / "dumps" / "trace_0"
    hostile.parent.mkdir()
    hostile.write_bytes(pickle.dumps(Path("x"), protocol=2))  # names pathlib's class
    assert "which is no plain data" in one_error(run(hostile))
    (tmp_path / "empty").mkdir()
    assert "is a folder with no file in it" in one_error(run(tmp_path / "empty"))
    table = write_csv(tmp_path / "t.csv", {"a": ARRIVALS})
    assert "a csv trace is one file, and 2 were given" in one_error(
        run(table, table, "--time-col", "time_us")
    )


def test_steps_only_some_ranks_recorded_are_said_to_be_left_out(tmp_path: Path) -> None:
    """Rank 0's buffer wrapped (its first 3 steps gone): the replay kept the 9 steps every rank has
    and said nothing of the 3 it left out."""
    paths = write_flight_recorder(tmp_path / "fr", "0", ARRIVALS, shape=[512, 512])
    dump = pickle.loads(paths[0].read_bytes())
    dump["entries"] = [e for e in dump["entries"] if e["is_p2p"] or e["collective_seq_id"] >= 13]
    paths[0].write_bytes(pickle.dumps(dump, protocol=2))
    result = run(tmp_path / "fr", *MODEL)
    assert result.exit_code == 0, result.output
    assert "group '0': 4 ranks, 9 steps (3 more that only some ranks recorded are left out)" in result.output
    (group,) = figures(run(tmp_path / "fr", *MODEL, "--json", "-"))["groups"]
    assert (group["steps"], group["steps_left_out"]) == (9, 3)
    whole = run(*write_flight_recorder(tmp_path / "whole", "0", ARRIVALS, shape=[512, 512]), *MODEL)
    assert "group '0': 4 ranks, 12 steps\n" in whole.output


def test_a_group_of_another_collective_is_said_to_be_priced_as_an_allreduce(tmp_path: Path) -> None:
    """An FSDP job's communicator that only reduce-scatters: its arrivals tell who is late, but
    whatif prices AllReduces, and said nothing of it."""
    for path in write_inspector(tmp_path / "rs", "0x7f3a", ARRIVALS, size=4 << 20, others=False):
        path.write_text(path.read_text().replace('"coll":"AllReduce"', '"coll":"ReduceScatter"'))
    result = run(tmp_path / "rs", *MODEL)
    assert result.exit_code == 0, result.output
    assert (
        "group '0x7f3a': 4 ranks, 12 steps\n  its collectives are ReduceScatter: priced here as "
        in result.output
    )
    assert figures(run(tmp_path / "rs", *MODEL, "--json", "-"))["groups"][0]["collective"] == "ReduceScatter"
    plain = run(
        write_inspector(tmp_path / "ar", "0x7f3a", ARRIVALS, size=4 << 20, others=False)[0].parent, *MODEL
    )
    assert "priced here as" not in plain.output


def test_a_unit_given_for_a_timestamp_column_is_refused_seconds_too(tmp_path: Path) -> None:
    """A timestamp carries its unit: ``--time-unit ms`` was refused, ``--time-unit s`` (the default
    written out) silently ignored."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    steps = [s for s in range(12) for _ in range(4)]
    ranks = [r for _ in range(12) for r in range(4)]
    times = [10**9 * s + (20_000_000 if r == 2 else 0) for s, r in zip(steps, ranks, strict=True)]
    trace = tmp_path / "t.parquet"
    pq.write_table(
        pa.table({"step": steps, "rank": ranks, "time": pa.array(times, pa.timestamp("ns"))}), trace
    )
    assert run(trace, *MODEL).exit_code == 0
    for unit in ("s", "ms"):
        assert "time is a timestamp or duration, in its own unit: drop --time-unit" in one_error(
            run(trace, *MODEL, "--time-unit", unit)
        )
