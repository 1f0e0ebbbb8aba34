"""What a hostile user does to the command line: one test per class of failure the project fixed.

Every failure must be one ``Error:`` line with the right exit code (2 bad input, 1 wrong, 3 out of
resources), come before any long work, never lose or overwrite a file, and never hang.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st

from stragglar.cli import cli
from stragglar.commands import terminal
from stragglar.errors import InputError
from stragglar.files import read_text, write_text
from stragglar.formats import schedule_json
from stragglar.synth import synthesize
from stragglar.units import parse_bandwidth, parse_duration, parse_size


def run(*args: str) -> Result:
    return CliRunner().invoke(cli, list(args))


def one_error(result: Result, code: int) -> str:
    """The failure contract: exit ``code``, one ``Error:`` line on stderr, no traceback."""
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    assert isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


def full_disk(fd: int) -> None:
    raise OSError(28, "No space left on device")


# ---------------------------------------------------------------------------- 1. atomic writes


@pytest.mark.parametrize("name", ["keep.json", "keep.xml", "keep.txt"])
def test_a_failed_write_keeps_the_old_file_and_leaves_nothing_partial(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    path = tmp_path / name
    assert run("synth", "--gpus", "4", "-o", str(path)).exit_code == 0
    good = path.read_bytes()
    monkeypatch.setattr(os, "fsync", full_disk)
    assert "No space left" in one_error(run("synth", "--gpus", "6", "-o", str(path)), 3)  # ran out
    one_error(run("synth", "--gpus", "6", "-o", str(tmp_path / f"new-{name}")), 3)
    assert path.read_bytes() == good
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_bench_json_and_plots_are_written_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    monkeypatch.setattr(os, "fsync", full_disk)
    args = ["--backend", "local", "--gpus", "3", "--sizes", "1KiB", "--delays", "0", "--iters", "1"]
    one_error(run("bench", *args, "--json", str(tmp_path / "b.json")), 3)
    one_error(run("cost", "--gpus", "4", "--plot", str(tmp_path / "c.png")), 3)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------------- 2. inputs and formats


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
@pytest.mark.parametrize(
    "args",
    [
        ["synth", "--gpus", "4", "--format", "json", "-o", "{out}"],
        ["export", "{json}", "--format", "json", "-o", "{out}"],
        [
            "bench",
            "--backend",
            "local",
            "-n",
            "2",
            "--sizes",
            "1KB",
            "--delays",
            "0ms",
            "--iters",
            "1",
            "--json",
            "{out}",
        ],
    ],
)
def test_an_output_never_replaces_a_fifo_or_device(tmp_path: Path, args: list[str]) -> None:
    """The atomic rename would put a plain file where the fifo (or /dev/null) was."""
    out = tmp_path / "pipe"
    os.mkfifo(out)
    schedule_json.write(synthesize("stragglar", 4), tmp_path / "s.json")
    filled = [a.format(out=out, json=tmp_path / "s.json") for a in args]
    assert "is not a regular file" in one_error(run(*filled), 2)
    assert out.is_fifo()


def test_bench_checks_its_json_folder_before_measuring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def measured(*args: object, **kwargs: object) -> None:
        raise AssertionError("measured before checking --json")

    monkeypatch.setattr("stragglar.commands.measure.sweep", measured)
    line = one_error(run("bench", "--backend", "local", "--json", str(tmp_path / "no" / "b.json")), 2)
    assert "'--json'" in line and "does not exist" in line


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_a_full_standard_output_is_one_line_and_exit_3() -> None:
    with open("/dev/full", "wb") as full:
        done = subprocess.run(
            [sys.executable, "-c", "from stragglar.cli import main; main()", "synth", "--gpus", "4"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert done.returncode == 3  # a resource ran out
    assert done.stderr.strip().splitlines() == ["Error: cannot write the output: No space left on device"]


@pytest.mark.parametrize("option", ["-o", "--json", "--plot"])
def test_a_file_name_too_long_is_bad_input(tmp_path: Path, option: str) -> None:
    pytest.importorskip("matplotlib")
    name = str(tmp_path / ("n" * 300 + (".png" if option == "--plot" else ".json")))
    command = {
        "-o": ["synth", "--gpus", "4"],
        "--json": ["bench", "--backend", "local", "-n", "2", "--sizes", "1KB", "--delays", "0"],
        "--plot": ["cost", "--gpus", "4"],
    }[option]
    line = one_error(run(*command, option, name), 2)
    assert f"'{option}'" in line and line.endswith("characters): File name too long"), line


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "--gpus", "4", "--iters", "10001"], "'--iters'"),
        (["prove-all", "--max-gpus", "65"], "'--max-gpus'"),
        (["prove-all", "--max-simulated", "4096"], "'--max-simulated'"),
        (["run", "--gpus", "4", "--size", "1001"], "not a whole number of float32 elements"),
        (["bound", "--gpus", "4", "--rounds", "99999999999"], "99999999999 rounds: ask about at most 8,"),
        (["synth", "--method", "smt", "--gpus", "5", "--timeout", "0s"], "a timeout must be more than 0s"),
        (["bound", "--gpus", "4", "--timeout", "0"], "a timeout must be more than 0s and at most a day"),
        (["bench", "--gpus", "4", "--timeout", "100000s"], "at most a day (86400s), got '100000s'"),
    ],
)
def test_work_is_bounded_before_it_starts(args: list[str], message: str) -> None:
    assert message in one_error(run(*args), 2)


def test_the_largest_iteration_count_the_help_offers_runs() -> None:
    """``--iters`` says 1..10000; the warm-up iteration it adds is not counted against it."""
    result = run("run", "--backend", "local", "--gpus", "2", "--size", "4", "--iters", "10000")
    assert result.exit_code == 0, result.output


def test_an_output_that_is_the_input_is_refused(tmp_path: Path) -> None:
    source = tmp_path / "s4.json"
    schedule_json.write(synthesize("stragglar", 4), source)
    before = source.read_bytes()
    (tmp_path / "link.json").symlink_to(source)
    for target in (source, tmp_path / "." / "s4.json", tmp_path / "link.json"):
        line = one_error(run("export", str(source), "-o", str(target)), 2)
        assert "is the input file" in line
    one_error(run("show", str(source), "--plot", str(source)), 2)
    assert source.read_bytes() == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-o", "x.xml", "--format", "json"], "--format json contradicts x.xml"),
        (["-o", "x.json", "--format", "msccl"], "--format msccl contradicts x.json"),
        (["-o", "x.dat"], "cannot tell the format of x.dat"),
    ],
)
def test_the_output_format_follows_the_suffix(tmp_path: Path, args: list[str], message: str) -> None:
    os.chdir(tmp_path)
    assert message in one_error(run("synth", "--gpus", "4", *args), 2)
    assert list(tmp_path.iterdir()) == []


def test_export_writes_what_the_suffix_says(tmp_path: Path) -> None:
    source = tmp_path / "s.json"
    schedule_json.write(synthesize("ring", 3), source)
    assert run("export", str(source), "-o", str(tmp_path / "copy.json")).exit_code == 0
    assert schedule_json.read(tmp_path / "copy.json") == synthesize("ring", 3)
    assert run("export", str(source), "-o", str(tmp_path / "x.xml")).exit_code == 0
    assert (tmp_path / "x.xml").read_text().startswith("<algo ")


# ---------------------------------------------------------------------------- 8. bounded work


def test_sizes_past_the_limits_fail_before_anything_is_allocated(tmp_path: Path) -> None:
    doc = schedule_json.to_document(synthesize("ring", 2))
    doc["num_chunks"] = 3_000_000_000
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(doc))
    assert "stragglar handles at most 65536" in one_error(run("verify", str(path)), 2)
    assert "need 2 to 2048 GPUs" in one_error(run("synth", "--gpus", "100000"), 2)
    assert "need 2 to 2048 GPUs" in one_error(run("cost", "--gpus", "100000"), 2)
    assert "at most 24 GPUs" in one_error(run("bound", "--gpus", "40", "--timeout", "2s"), 2)
    assert "at most 16 GPUs" in one_error(run("synth", "--gpus", "40", "--method", "smt"), 2)


def test_the_bound_honours_its_timeout_while_building_the_model() -> None:
    import time

    start = time.perf_counter()
    line = one_error(run("bound", "--gpus", "24", "--timeout", "500ms"), 3)
    assert time.perf_counter() - start < 5 and "z3 gave no answer" in line


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_only_regular_files_are_read(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    script = shutil.which("stragglar", path=str(Path(sys.executable).parent)) or shutil.which("stragglar")
    assert script is not None
    for target in (str(fifo), "/dev/zero", str(tmp_path)):
        done = subprocess.run([script, "verify", target], capture_output=True, text=True, timeout=60)
        assert (
            done.returncode == 2
            and done.stderr
            == f"Error: {target} is not a regular file (stragglar reads schedules from files)\n"
        )


# ---------------------------------------------------------------------------- 9 and 14. units


@settings(max_examples=60, deadline=None)
@given(st.floats(min_value=0, max_value=6e5, allow_nan=False), st.sampled_from(["us", "ms", "s"]))
def test_any_finite_duration_with_a_unit_reads_back(number: float, unit: str) -> None:
    factor = {"us": 1e-6, "ms": 1e-3, "s": 1.0}[unit]
    assert parse_duration(f"{number!r}{unit}") == pytest.approx(number * factor, rel=1e-12, abs=1e-300)


@pytest.mark.parametrize(
    "text", ["inf", "nan", "-1", "1e400", "-0.5ms", "Infinity", "1e400ms", "1e400GB/s", ""]
)
def test_non_finite_negative_or_huge_numbers_are_refused(text: str) -> None:
    for parse in (parse_size, parse_duration, parse_bandwidth):
        with pytest.raises(InputError):
            parse(text)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["cost", "--gpus", "8", "--delay", "nan"], "'--delay': expected a duration"),
        (["cost", "--gpus", "8", "--alpha", "inf"], "'--alpha': expected a duration"),
        (["cost", "--gpus", "8", "--bandwidth", "1e400GB/s"], "'--bandwidth'"),
        (["cost", "--gpus", "8", "--size", "-16MiB"], "'--size': expected a size"),
        (["run", "--gpus", "4", "--timeout", "60"], "'--timeout': '60' needs a unit: write 60ms or 60s"),
        (["bound", "--gpus", "4", "--timeout", "1e400s"], "'--timeout': '1e400s' is longer than a week"),
        (["synth", "--gpus", "4", "-o", "x.xml", "--max-bytes", "1.5B"], "not a whole number of bytes"),
    ],
)
def test_every_option_follows_the_unit_policy(tmp_path: Path, args: list[str], message: str) -> None:
    os.chdir(tmp_path)
    assert message in one_error(run(*args), 2)


@pytest.mark.parametrize(
    ("parse", "text", "message"),
    [
        (parse_bandwidth, "1Gb/s", "is Gb bits or bytes? write 1Gbit/s or 1GB/s"),
        (parse_bandwidth, "100Mb/s", "write 100Mbit/s or 100MB/s"),
        (parse_bandwidth, "1Gib/s", "Gib reads as bits; write 1GiB/s"),
        (parse_size, "1Kib", "Kib reads as bits; write 1KiB"),
        (parse_size, "64Mb", "Mb reads as bits; write 64MB"),
        (parse_bandwidth, "1Gbps", "needs a unit per second, e.g. 1GB/s or 1Gbit/s"),
        (parse_bandwidth, "450GiB/ms", "needs a unit per second, e.g. 450GiB/s"),
    ],
)
def test_a_bit_style_unit_is_refused_not_read_as_bytes(parse: Any, text: str, message: str) -> None:
    """``1Gb/s`` read as bytes would be 8 times what its writer meant."""
    with pytest.raises(InputError) as caught:
        parse(text)
    assert message in str(caught.value)
    assert parse_bandwidth("1gbit/s") == 125e6 and parse_size("1gb") == 10**9  # case alone is not bits


def test_sizes_take_units_everywhere(tmp_path: Path) -> None:
    out = tmp_path / "x.xml"
    assert (
        run("synth", "--gpus", "4", "-o", str(out), "--min-bytes", "1KiB", "--max-bytes", "1MiB").exit_code
        == 0
    )
    assert 'minBytes="1024" maxBytes="1048576"' in out.read_text()
    assert "Units: a size takes" in run("--help").output


@pytest.mark.parametrize(
    ("size", "shown"),
    [
        ("64MB", "64 MB"),
        ("1.5GB", "1.5 GB"),
        ("64MiB", "64 MiB"),
        ("1000004", "1,000,004 B"),
        ("3KiB", "3 KiB"),
    ],
)
def test_a_size_is_echoed_exactly_in_the_units_it_was_given(size: str, shown: str) -> None:
    """``--size 64MB`` was echoed as 61.04 MiB: another unit, and rounded."""
    assert run("cost", "--gpus", "4", "--size", size).stdout.startswith(
        f"alpha-beta model: 4 GPUs, {shown} buffer"
    )
    ran = run("run", "--gpus", "2", "--size", size if size != "1.5GB" else "1.5MB", "--iters", "1")
    assert f"2 ranks, {shown.replace('GB', 'MB')} float32" in ran.stdout, ran.output


@pytest.mark.parametrize("args", [["run", "--schedule", "{json}"], ["bench", "--backend", "local"]])
def test_a_dtype_the_backend_lacks_is_refused_before_any_work_naming_one_that_has_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    def work(*args: object, **kwargs: object) -> None:
        raise AssertionError("worked before refusing the dtype")

    for name in ("proved", "sweep", "run_benchmark"):
        monkeypatch.setattr(f"stragglar.commands.measure.{name}", work)
    schedule_json.write(synthesize("stragglar", 4), tmp_path / "s.json")
    filled = [a.format(json=tmp_path / "s.json") for a in args]
    line = one_error(run(*filled, "--dtype", "bfloat16"), 2)
    assert line == (
        "Error: the local backend cannot hold bfloat16: NumPy has no such type; the torch backend has it "
        "(--backend torch)"
    )


# ---------------------------------------------------------------------------- 10 and 12. hostile files


@pytest.mark.parametrize(
    "text",
    [
        "<algo>" * 5000,
        "<!-- a -->" * 5000 + "<algo/>",
        '<algo name="x">' + "<gpu>" * 3000 + "</gpu>" * 3000 + "</algo>",
    ],
)
def test_deep_or_long_xml_is_one_line_not_a_recursion_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "deep.xml"
    path.write_text(text)
    one_error(run("verify", str(path)), 2)


def test_malformed_input_of_any_format_exits_2_and_a_wrong_schedule_exits_1(tmp_path: Path) -> None:
    good = tmp_path / "s.xml"
    assert run("synth", "--gpus", "4", "-o", str(good)).exit_code == 0
    text = good.read_text()
    cases = {
        "truncated.xml": (text[: len(text) // 2], 2),
        "no-cnt.xml": (text.replace(' cnt="1"', "", 1), 2),
        "unsigned.xml": (  # gpu 0 tb 1's only step, which tb 3 waits for, never signals
            text.replace(
                'deps="1" hasdep="1"/>\n    </tb>\n    <tb id="2"',
                'deps="1" hasdep="0"/>\n    </tb>\n    <tb id="2"',
                1,
            ),
            1,
        ),
        "dup.json": ('{"format": "stragglar-schedule", "format": "stragglar-schedule"}', 2),
    }
    for name, (content, code) in cases.items():
        path = tmp_path / name
        path.write_text(content)
        one_error(run("verify", str(path)), code)


# ---------------------------------------------------------------------------- 11. plots


@pytest.mark.parametrize("name", ["x.txt", "name", "missing/x.png"])
def test_a_bad_plot_path_fails_before_the_work(tmp_path: Path, name: str) -> None:
    line = one_error(result := run("cost", "--gpus", "8", "--plot", str(tmp_path / name)), 2)
    assert "--plot" in line and result.stdout == ""  # before the table, not after


def test_the_plot_is_written_where_it_says(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "cost.svg"
    result = run("cost", "--gpus", "4", "--plot", str(out))
    assert result.exit_code == 0 and result.stdout.endswith(f"plot written to {out}\n")
    assert out.read_text().lstrip().startswith("<?xml")


# ---------------------------------------------------------------------------- 15. options that do not apply


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["synth", "--gpus", "4", "--proto", "LL"], "--proto does not apply"),
        (["synth", "--gpus", "4", "--format", "json", "--instances", "2"], "--instances does not apply"),
        (["synth", "--gpus", "4", "--timeout", "5s"], "--timeout does not apply"),
        (["verify", "--smt", "{xml}"], "--smt does not apply"),
        (["show", "{xml}", "--plot", "x.png"], "--plot does not apply"),
        (["run", "--schedule", "{json}", "--algorithm", "ring"], "--algorithm does not apply"),
        (["run", "--schedule", "{json}", "--straggler", "1"], "--straggler does not apply"),
        (["run", "--schedule", "{xml}"], "is MSCCL XML: run takes a JSON schedule"),
        (["export", "{xml}"], "is MSCCL XML: export takes a JSON schedule"),
        (["run"], "--gpus is required"),
        (["run", "--gpus", "4", "--timeout", "5s"], "--timeout does not apply"),
        (["bench", "--backend", "local", "--timeout", "5s"], "--timeout does not apply"),
        (["prove-all", "--max-gpus", "4", "{json}"], "--max-gpus does not apply"),
        (["prove-all", "--max-simulated", "4", "{json}"], "--max-simulated does not apply"),
    ],
)
def test_an_option_that_does_not_apply_is_an_error(tmp_path: Path, args: list[str], message: str) -> None:
    os.chdir(tmp_path)
    schedule_json.write(synthesize("stragglar", 4), tmp_path / "s.json")
    assert run("synth", "--gpus", "4", "-o", str(tmp_path / "s.xml")).exit_code == 0
    filled = [a.format(xml=tmp_path / "s.xml", json=tmp_path / "s.json") for a in args]
    assert message in one_error(run(*filled), 2)


def test_files_are_told_apart_by_content_and_run_takes_n_from_the_file(tmp_path: Path) -> None:
    schedule_json.write(synthesize("stragglar", 5), tmp_path / "five.xml")  # JSON, whatever the name
    assert run("verify", str(tmp_path / "five.xml")).output.startswith(
        f"{tmp_path / 'five.xml'}: proved: allreduce"
    )
    xml = tmp_path / "s.xml"
    assert run("synth", "--gpus", "4", "-o", str(xml)).exit_code == 0
    shown = run("show", str(xml))
    assert (
        shown.exit_code == 0
        and "gpu 3: " in shown.output
        and "proved: stragglar-n4-s3-simple" in shown.output
    )
    ran = run("run", "--schedule", str(tmp_path / "five.xml"), "--size", "4KiB", "--iters", "1")
    assert ran.exit_code == 0 and ran.output.startswith("stragglar on local: 5 ranks")


# ---------------------------------------------------------------------------- 16. progress


def test_long_work_shows_progress_on_a_terminal_only(monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    quiet = run("prove-all", "--max-gpus", "3", "--max-simulated", "4")
    assert quiet.exit_code == 0 and quiet.stderr == ""
    shown = io.StringIO()
    monkeypatch.setattr(terminal, "_show_progress", lambda: True)
    monkeypatch.setattr(sys, "stderr", shown)
    with terminal.busy("thinking", after=0.05):
        __import__("time").sleep(0.5)
    assert "thinking: 00:00" in shown.getvalue()
    assert list(terminal.progress(range(3), "counting")) == [0, 1, 2] and "counting" in shown.getvalue()


def on_screen(output: str) -> list[str]:
    """The lines a terminal shows for ``output``: a carriage return writes over its line from the start."""
    lines = []
    for raw in output.split("\n"):
        shown: list[str] = []
        for part in raw.split("\r"):
            shown[: len(part)] = part
        lines.append("".join(shown).rstrip())
    return [line for line in lines if line]


def test_prove_all_rows_never_share_a_line_with_its_bar_and_a_summary_ends_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(terminal, "_show_progress", lambda: True)
    result = run("prove-all", "--max-gpus", "3", "--max-simulated", "4")  # stdout and stderr, as a terminal
    assert result.exit_code == 0 and "proving" in result.stderr  # a bar was drawn ...
    assert on_screen(result.output) == result.stdout.splitlines()  # ... and lifted off every row
    assert (
        result.stdout.splitlines()[-1] == "proved all 11 schedules by the simulator, 7 of them by z3 as well"
    )


def test_run_shows_the_time_spent_on_a_terminal_from_its_own_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    args = ["run", "--backend", "local", "--gpus", "3", "--size", "4KiB", "--delay", "100ms", "--iters", "8"]
    assert run(*args).stderr == ""  # silent in a pipe
    monkeypatch.setattr(terminal, "_show_progress", lambda: True)
    result = run(*args)  # 1.8 s of delays: past the second after which the line shows
    assert result.exit_code == 0 and "running 3 ranks on local: 00:01" in result.stderr, result.stderr


def test_reading_and_writing_a_large_file_show_a_busy_line_on_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 405 MB file of N = 2048 took 16 s to write and 27 s to read, in silence."""
    path = tmp_path / "s.json"

    def slowly(work: Any) -> Any:
        def slow(*args: Any) -> Any:
            time.sleep(1.3)  # past the second after which the line shows
            return work(*args)

        return slow

    monkeypatch.setattr(terminal, "_show_progress", lambda: True)
    monkeypatch.setattr("stragglar.commands.outputs.write_text", slowly(write_text))
    monkeypatch.setattr("stragglar.commands.inputs.read_text", slowly(read_text))
    written = run("synth", "--gpus", "4", "-o", str(path))
    assert written.exit_code == 0 and f"writing {path}: 00:01" in written.stderr, written.stderr
    read = run("verify", str(path))
    assert read.exit_code == 0 and f"reading {path}: 00:01" in read.stderr, read.stderr


# ---------------------------------------------------------------------------- 17. prove-all


def test_prove_all_names_each_failing_file_and_ends_with_a_summary(tmp_path: Path) -> None:
    names = []
    for i in range(5):
        path = tmp_path / f"s{i}.json"
        schedule_json.write(synthesize("stragglar", 3 + i), path)
        names.append(str(path))
    (tmp_path / "s1.json").write_text("{")
    broken = schedule_json.to_document(synthesize("ring", 3))
    broken["phases"][0]["rounds"][0][0]["op"] = "copy"
    (tmp_path / "s3.json").write_text(json.dumps(broken))
    result = run("prove-all", *names)
    summary = one_error(result, 2)
    assert f"FAILED {names[1]}" in result.stdout and f"FAILED {names[3]}" in result.stdout
    assert summary.startswith("Error: 2 of 5 files failed: ") and len(summary) < 200
    verbose = run("prove-all", "-v", *names).stdout
    assert f"FAILED {names[1]}: {names[1]}: not JSON" in verbose, verbose
    assert f"FAILED {names[3]}: " in verbose, verbose


# ---------------------------------------------------------------------------- 19. the Python API


@pytest.mark.parametrize(
    ("straggler", "message"),
    [(1.5, "straggler must be an integer, got 1.5 (float)"), (True, "got True (bool)"), ("3", "got '3'")],
)
def test_api_arguments_are_checked_in_api_terms(straggler: object, message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        synthesize("stragglar", 8, straggler)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="num_ranks must be an integer"):
        synthesize("stragglar", 8.0)  # type: ignore[arg-type]
    assert synthesize("stragglar", np.int64(8), np.int64(3)).straggler == 3
    with pytest.raises(InputError, match="has no straggler: leave the straggler out"):
        synthesize("ring", 8, 3)


# ---------------------------------------------------------------------------- 22. rounds mean steps


def test_several_chunks_on_one_link_count_as_that_many_steps(tmp_path: Path) -> None:
    """Direct's whole-buffer rounds, labelled StragglAR: 2 rounds after the straggler arrives, below
    R*(4) = 4 if rounds were counted, but 6 chunk-steps, which is what the bound is about."""
    s = replace(synthesize("direct", 4), algorithm="stragglar")
    path = tmp_path / "fat.json"
    schedule_json.write(s, path)
    result = run("show", str(path))
    assert result.exit_code == 0, result.output
    summary = result.stdout.splitlines()[-1]
    assert "2 rounds (6 chunk-steps) after the straggler arrives (lower bound R*(4) = 4: +2)" in summary


# ---------------------------------------------------------------------------- 23. resources


def test_running_out_of_memory_is_one_line_with_its_own_exit_code(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_memory(*args: object, **kwargs: object) -> None:
        raise MemoryError

    monkeypatch.setattr("stragglar.commands.schedules.generate", no_memory)
    assert "out of memory" in one_error(run("synth", "--gpus", "8"), 3)


# ---------------------------------------------------------------------------- 20. plots people can read


def _boxes_overlap(a: object, b: object) -> bool:
    from matplotlib.transforms import BboxBase

    assert isinstance(a, BboxBase) and isinstance(b, BboxBase)
    return bool(a.overlaps(b))


@pytest.mark.parametrize("n", [8, 64, 128])
def test_the_schedule_chart_stays_readable_up_to_128_ranks(n: int) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from stragglar.plot import schedule_figure

    fig = schedule_figure(synthesize("stragglar", n))
    renderer = FigureCanvasAgg(fig).get_renderer()  # type: ignore[no-untyped-call]
    fig.draw(renderer)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(labels) <= 33 and labels[-1] == f"{n - 1} (straggler)"
    title = ax.title.get_window_extent(renderer)
    phase_names = [t for extra in ax.child_axes for t in extra.get_xticklabels() if t.get_text()]
    assert [t.get_text() for t in phase_names] == ["reduce-scatter", "exchange"]
    assert not any(_boxes_overlap(title, t.get_window_extent(renderer)) for t in phase_names)
    assert fig.bbox.contains(title.x0, title.y0) and fig.bbox.contains(title.x1, title.y1)  # not cut off


def test_the_cost_chart_keeps_its_legends_off_the_curves() -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from stragglar.model import PAPER_NETWORK
    from stragglar.plot import cost_figure

    fig = cost_figure(8, 2**30, 5e-3, PAPER_NETWORK, sizes=[2, 4, 8, 16])
    renderer = FigureCanvasAgg(fig).get_renderer()  # type: ignore[no-untyped-call]
    fig.draw(renderer)
    for ax in fig.axes:
        legend = ax.get_legend()
        assert legend is not None
        assert not _boxes_overlap(legend.get_window_extent(renderer), ax.get_window_extent(renderer))


def test_bench_and_run_label_their_ratios_and_count_in_words() -> None:
    ran = run("run", "--gpus", "3", "--size", "4KiB", "--iters", "1")
    assert ran.exit_code == 0 and "1 iteration (medians)" in ran.output and "4 KiB float32" in ran.output
    assert "speed-up (ratio of the medians)" in ran.output
    bench = run(
        "bench", "--backend", "local", "--gpus", "3", "--sizes", "1KiB", "--delays", "0", "--iters", "2"
    )
    assert bench.exit_code == 0
    assert "ratio of the medians | per-iteration ratio: median [min-max]" in bench.output.splitlines()[0]


def test_ctrl_c_ends_a_z3_command_in_one_line() -> None:
    """The whole command: SIGINT while ``bound`` builds or solves its model ends it at once."""
    # Python's handler restored first: a shell's background job (CI's, say) starts with SIGINT ignored
    code = (
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from stragglar.cli import main; main()"
    )
    command = [sys.executable, "-c", code, "bound", "--gpus", "14"]  # z3 needs minutes for N = 14
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(2.5)
        assert child.poll() is None, child.communicate()
        child.send_signal(signal.SIGINT)
        start = time.perf_counter()
        out, err = child.communicate(timeout=30)
    finally:
        child.kill()
    assert time.perf_counter() - start < 3.0
    assert child.returncode == 130 and err.strip() == "Aborted!" and out == "", (out, err)  # 128 + SIGINT


def test_ctrl_c_interrupts_z3_inside_check(monkeypatch: pytest.MonkeyPatch) -> None:
    """z3's check() is one long C call, in which Python cannot run its SIGINT handler."""
    import threading

    import z3

    from stragglar.commands.interrupts import ctrl_c_stops_z3

    holes = 12  # 13 pigeons in 12 holes: unsat, and minutes for z3 (11 in 10: 5 s)
    var = [[z3.Bool(f"p{i}_{h}") for h in range(holes)] for i in range(holes + 1)]
    solver = z3.Solver()
    solver.set("timeout", 60_000)  # without the fix the test fails after a minute, never hangs
    for row in var:
        solver.add(z3.Or(row))
    for h in range(holes):
        for i in range(holes + 1):
            for j in range(i):
                solver.add(z3.Not(z3.And(var[i][h], var[j][h])))
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
        start = time.perf_counter()
        with pytest.raises(KeyboardInterrupt), ctrl_c_stops_z3():
            solver.check()
        assert time.perf_counter() - start < 5.0
    finally:
        signal.signal(signal.SIGINT, previous)


# ---------------------------------------------------------------------------- lone surrogates
@pytest.mark.parametrize("kind", ["schedule", "plan"])
def test_a_string_that_is_not_unicode_is_refused_when_read_not_when_printed(
    kind: str, tmp_path: Path
) -> None:
    """``"\\ud800"`` parses as JSON but cannot be printed or written: refused on reading, so
    ``export`` neither writes a file nor fails half way through its output."""
    made, bad = tmp_path / "made.json", tmp_path / "bad.json"
    assert run("synth", "--gpus", "4", "-o", str(made)).exit_code == 0
    if kind == "plan":
        plan = tmp_path / "plan.json"
        assert run("export", str(made), "--format", "mscclpp", "-o", str(plan)).exit_code == 0
        made = plan
    document = json.loads(made.read_text())
    document["name" if kind == "plan" else "algorithm"] = "late\ud800"
    bad.write_text(json.dumps(document))  # ensure_ascii: the surrogate as an escape, as a hostile file has it
    out = tmp_path / "out.json"
    for args in (
        ["show", str(bad)],
        ["verify", str(bad)],
        ["export", str(bad), "--format", "json", "-o", str(out)],
    ):
        if kind == "plan" and args[0] == "export":
            continue  # plans are not exported again
        line = one_error(run(*args), 2)
        assert line.endswith("not valid Unicode: the string 'late\\\\ud800' has half of a surrogate pair"), (
            line
        )
    assert not out.exists()
    document["name" if kind == "plan" else "algorithm"] = "late \U0001f600"  # a pair is fine
    bad.write_text(json.dumps(document))
    assert run("verify", str(bad)).exit_code == 0


# ---------------------------------------------------------------------------- what messages echo


def test_control_characters_from_a_file_are_escaped_not_sent_to_the_terminal(tmp_path: Path) -> None:
    document = schedule_json.to_document(synthesize("stragglar", 4))
    document["algorithm"] = "late\x00\x1b[2J"
    path = tmp_path / "s.json"
    path.write_text(json.dumps(document))
    shown = run("show", str(path))
    assert shown.exit_code == 0 and "late\\x00\\x1b[2J: 4 GPUs" in shown.stdout
    assert "\x1b" not in shown.output and "\x00" not in shown.output
    escape = tmp_path / "\x1b[31m.json"
    assert "\x1b" not in one_error(run("verify", str(escape)), 2)
    exported = run("export", str(path))  # the XML name is made from the algorithm: raw ESC was in it
    assert exported.exit_code == 0 and '<algo name="late___2J-n4-s3-simple"' in exported.stdout
    assert "\x1b" not in exported.output and "\x00" not in exported.output


@pytest.mark.parametrize(
    "args",
    [
        ["synth", "--gpus", "{long}"],
        ["synth", "--gpus", "4", "--algorithm", "{long}"],
        ["cost", "--gpus", "4", "--size", "{long}"],
        ["cost", "--gpus", "4", "--delay", "1{long}"],
        ["cost", "--gpus", "4", "--size", "1{long}"],
        ["cost", "--gpus", "4", "--chunks", "{long}"],
        ["verify", "{long}"],
        ["synth", "--gpus", "4", "-o", "{long}.dat"],
        ["synth", "--gpus", "4", "-o", "{long}/x.json"],
        ["bench", "--gpus", "{long}"],
    ],
)
def test_an_error_quotes_at_most_a_few_words_of_what_it_was_given(args: list[str]) -> None:
    line = one_error(run(*(a.format(long="y" * 100_000) for a in args)), 2)
    assert "characters)" in line and len(line) < 400, line[:400]


def test_an_error_line_is_bounded_whatever_the_message_echoes_unquoted(tmp_path: Path) -> None:
    """click's "unexpected extra argument" and a JSON file's unknown key echoed 100,000 characters."""
    line = one_error(run("synth", "--gpus", "4", "z" * 100_000), 2)
    assert "z" * 50 in line and "characters)" in line and len(line) < 440, line[:500]
    document = schedule_json.to_document(synthesize("stragglar", 4))
    document["k" * 100_000] = 1
    (tmp_path / "s.json").write_text(json.dumps(document))
    line = one_error(run("verify", str(tmp_path / "s.json")), 2)
    assert line.endswith(
        "... (100,002 characters)]: unknown key (allowed: format, version, collective, "
        "algorithm, num_ranks, num_chunks, straggler, phases, metadata)"
    ), line[:500]


def test_an_empty_file_is_called_empty_whatever_its_name(tmp_path: Path) -> None:
    for name in ("e.xml", "e.json"):
        (tmp_path / name).write_text(" \n")
        assert one_error(run("verify", str(tmp_path / name)), 2).endswith(
            f"{tmp_path / name} is empty: no schedule, MSCCL XML or MSCCL++ plan in it"
        )


# ---------------------------------------------------------------------------- signals and ranks


@pytest.mark.skipif(shutil.which("sh") is None, reason="needs a shell")
@pytest.mark.parametrize(
    ("sig", "code", "line"),
    [
        (signal.SIGHUP, 129, "Error: stopped by SIGHUP: every rank was ended"),
        (signal.SIGTERM, 143, "Error: stopped by SIGTERM: every rank was ended"),
        (signal.SIGINT, 130, "Aborted!"),
    ],
)
def test_a_signal_to_run_cleans_up_and_ends_in_one_line_with_its_own_code(
    tmp_path: Path, sig: signal.Signals, code: int, line: str
) -> None:
    """A closed terminal (SIGHUP) is SIGTERM's twin: it left /tmp/stragglar-* and exited 129 silently."""
    pytest.importorskip("torch")
    code_line = (
        "import signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from stragglar.cli import main; main()"
    )
    args = ["run", "--backend", "torch", "-n", "2", "--size", "4", "--delay", "20ms", "--iters", "10000"]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    child = subprocess.Popen(
        [sys.executable, "-c", code_line, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("stragglar-*")):  # the ranks' rendezvous: they are running
            assert child.poll() is None and time.monotonic() < deadline, child.communicate()
            time.sleep(0.05)
        time.sleep(0.5)
        child.send_signal(sig)
        out, err = child.communicate(timeout=30)
    finally:
        child.kill()
    assert child.returncode == code and err.strip().splitlines() == [line] and out == "", (out, err)
    assert list(tmp_path.iterdir()) == []


def test_ranks_out_of_memory_are_a_resource_that_ran_out(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("torch")

    def no_memory(*args: object) -> None:
        raise MemoryError

    monkeypatch.setattr("stragglar.measure.run_torch.payload", no_memory)  # the forked ranks inherit it
    line = one_error(run("run", "--backend", "torch", "-n", "2", "--size", "4", "--iters", "1"), 3)
    # both ranks raise it; under load one may see the other leave first ("lost the connection")
    assert line.startswith("Error: 2 of 2 ranks failed: ") and "raised MemoryError" in line, line


def shell(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``command`` in bash, ``stragglar`` being this interpreter's (descriptors the shell opens)."""
    stragglar = f"{sys.executable} -m stragglar"
    return subprocess.run(
        ["bash", "-c", command.replace("stragglar", stragglar)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    "command",
    [
        "stragglar export in.json --format msccl -o /proc/self/fd/3 3<>in.json",
        "stragglar export in.json --format msccl -o /dev/stdout 1<>in.json",
        "stragglar export in.json --format msccl -o /dev/stdout >>in.json",
        "stragglar export in.json --format mscclpp >>in.json",
    ],
)
def test_an_output_descriptor_open_on_the_input_is_refused(tmp_path: Path, command: str) -> None:
    """The input was overwritten in place or appended to (exit 0): refused by name only before."""
    schedule_json.write(synthesize("stragglar", 4), tmp_path / "in.json")
    before = (tmp_path / "in.json").read_bytes()
    done = shell(command, tmp_path)
    assert done.returncode == 2 and done.stderr.startswith("Error: "), done.stderr
    assert "is the input file in.json: write the output somewhere else" in done.stderr
    assert (tmp_path / "in.json").read_bytes() == before


def test_an_output_folder_that_takes_no_file_is_refused_before_the_work(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """/proc passes a permission check as root: N = 1024 ran 25 s before the write failed."""
    monkeypatch.setattr("stragglar.commands.schedules.generate", never_called)
    assert "cannot write in /proc" in one_error(run("synth", "--gpus", "1024", "-o", "/proc/x.json"), 2)


def never_called(*args: object, **kwargs: object) -> None:
    raise AssertionError("the work started")


def test_a_full_standard_error_is_a_resource_that_ran_out(tmp_path: Path) -> None:
    """Its own error line could not be written: exit 1 and a traceback nobody saw, before."""
    done = shell("stragglar synth --gpus 1 2>/dev/full; echo $?", tmp_path)
    assert done.stdout.strip() == "3"


def test_stragglar_alone_prints_its_help_and_exits_0() -> None:
    result = run()
    assert result.exit_code == 0 and result.stdout.startswith("Usage: ") and result.stderr == ""
    assert "Commands:" in result.stdout
