"""What a hostile user does to the command line: one test per class of failure the project fixed
(what reaches the terminal, and how a command ends: ``tests/test_cli_terminal.py``).

Every failure must be one ``Error:`` line with the right exit code (2 bad input, 1 wrong, 3 out of
resources), come before any long work, never lose or overwrite a file, and never hang.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from cli_results import one_error, run, shell
from hypothesis import given, settings
from hypothesis import strategies as st

from stragglar.errors import InputError
from stragglar.formats import schedule_json
from stragglar.synth import synthesize
from stragglar.units import parse_bandwidth, parse_duration, parse_size


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
        (
            ["run", "--gpus", "4", "--timeout", "700000s"],
            "at most a day (86400s), got '700000s'",
        ),  # not a week's
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
        (["-o", "x.dat"], "cannot tell the format of x.dat: name it *.json, *.txt, *.xml, or give"),
        (
            ["-o", ".json"],
            "cannot tell the format of .json (a name that starts with a dot has a suffix after",
        ),
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
    said = one_error(run("bound", "--gpus", "40", "--timeout", "2s"), 2)
    assert said.endswith(
        "need 2 to 24 GPUs, got 40: the z3 model grows as N^4 (N = 16 took 495 s on 2 cores)"
    )
    assert "at most 16 GPUs" in one_error(run("synth", "--gpus", "40", "--method", "smt"), 2)


def test_the_bound_honours_its_timeout_while_building_the_model() -> None:

    start = time.perf_counter()
    line = one_error(run("bound", "--gpus", "24", "--timeout", "500ms"), 3)
    assert time.perf_counter() - start < 5 and "z3 gave no answer" in line


def test_verify_smt_honours_its_timeout(tmp_path: Path) -> None:
    """64 ranks in 4,000 chunks: z3's proof ran for minutes, with no way to bound it (1,000 here: seconds)."""
    schedule_json.write(synthesize("stragglar", 64, chunks=1000), tmp_path / "c.json")
    start = time.perf_counter()
    line = one_error(run("verify", "--smt", "--timeout", "500ms", str(tmp_path / "c.json")), 3)
    assert time.perf_counter() - start < 20, "reading the file takes a few seconds, z3 half of one"
    assert line.startswith("Error: z3 did not finish the proof within 500 ms ("), line


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["synth", "--gpus", "9" * 20], "'--gpus' / '-n'"),
        (["cost", "--gpus", "9" * 20], "'--gpus' / '-n'"),
        (["bound", "--gpus", "9" * 20], "'--gpus' / '-n'"),
        (["run", "--gpus", "9" * 20], "'--gpus' / '-n'"),
        (["run", "--gpus", "4", "--straggler", "9" * 20, "--delay", "1ms"], "'--straggler'"),
        (["synth", "--gpus", "4", "--format", "msccl", "--instances", "9" * 20], "'--instances'"),
        (
            ["synth", "--gpus", "4", "--format", "mscclpp", "--max-threadblocks", "9" * 20],
            "'--max-threadblocks'",
        ),
    ],
)
def test_a_number_past_64_bits_is_refused_by_its_option(args: list[str], option: str) -> None:
    """It was refused by the API's parameter: "num_ranks must fit in 64 bits", a name never typed."""
    line = one_error(run(*args), 2)
    assert line == f"Error: Invalid value for {option}: {'9' * 20} does not fit in 64 bits", line


@pytest.mark.parametrize("command", ["synth", "cost", "run", "bound", "export"])
def test_help_shows_a_whole_number_option_without_its_64_bit_guard(command: str) -> None:
    """The guard above is no limit a user means: the help showed [x<=9223372036854775807]."""
    text = run(command, "--help").output
    assert "9223372036854775807" not in text


def test_a_whole_number_below_its_least_is_refused_with_the_range_and_garbage_as_no_integer() -> None:
    assert one_error(run("synth", "--gpus", "4", "--format", "msccl", "--instances", "0"), 2) == (
        "Error: Invalid value for '--instances': 0 is not in the range x>=1."
    )
    assert one_error(run("synth", "--gpus", "x"), 2) == (
        "Error: Invalid value for '--gpus' / '-n': 'x' is not a valid integer."
    )
    assert one_error(run("run", "--gpus", "2", "--iters", "abc"), 2) == (
        "Error: Invalid value for '--iters': 'abc' is not a valid integer."  # not "integer range"
    )
    assert one_error(run("run", "--schedule", ""), 2) == (
        "Error: Invalid value for '--schedule': an empty file name: name a file"  # not ". is not a file"
    )


@pytest.mark.parametrize("command", ["synth", "cost", "bound"])
@pytest.mark.parametrize("gpus", ["1", "100000"])
def test_a_gpu_count_out_of_range_is_refused_in_the_same_words_by_every_command(
    command: str, gpus: str
) -> None:
    """``bound`` said ``1 is not in the range x>=2``, and of 100000 "the z3 bound handles at most
    24 GPUs", where the others say how many they take."""
    line = one_error(run(command, "--gpus", gpus), 2)
    assert re.match(rf"Error: need 2 to (2048|24) GPUs, got {gpus}\b", line), line


@pytest.mark.parametrize(
    ("args", "kind"),
    [
        (["verify", "-"], "schedules"),
        (["show", "-"], "schedules"),
        (["export", "-", "-o", "x.xml"], "schedules"),
        (["run", "--schedule", "-"], "schedules"),
        (["whatif", "-"], "traces"),
        (["whatif", "-", "--format", "csv"], "traces"),
    ],
)
def test_standard_input_is_refused_as_such_not_as_a_missing_file(
    tmp_path: Path, args: list[str], kind: str
) -> None:
    """``verify - < s.json`` said "file not found: -"; ``whatif -`` could not tell the format of -."""
    os.chdir(tmp_path)
    line = one_error(run(*args), 2)
    assert (
        line
        == f"Error: stragglar reads {kind} from files, not standard input ('-'; a file of that name: ./-)"
    )


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
        (
            ["bound", "--gpus", "4", "--timeout", "1e400s"],
            "'--timeout': a timeout must be more than 0s and at most a day (86400s), got '1e400s'",
        ),
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
        (parse_bandwidth, "10gb/s", "is gb bits or bytes? write 10Gbit/s or 10GB/s"),  # a rate in lower case
        (parse_bandwidth, "8b/s", "is b bits or bytes? write 8bit/s or 8B/s"),
        (parse_bandwidth, "1kb/s", "write 1Kbit/s or 1KB/s"),
        (parse_bandwidth, "2gib/s", "gib reads as bits; write 2GiB/s"),
        (parse_bandwidth, "1Gbps", "needs a unit per second, e.g. 1GB/s or 1Gbit/s"),
        (parse_bandwidth, "450GiB/ms", "needs a unit per second, e.g. 450GiB/s"),
    ],
)
def test_a_bit_style_unit_is_refused_not_read_as_bytes(parse: Any, text: str, message: str) -> None:
    """``1Gb/s`` read as bytes would be 8 times what its writer meant."""
    with pytest.raises(InputError) as caught:
        parse(text)
    assert message in str(caught.value)
    # a size in lower case is bytes, as most tools read it; a rate spelled out in bits or bytes too
    assert parse_bandwidth("1gbit/s") == 125e6 and parse_bandwidth("1gB/s") == 10**9
    assert parse_size("1gb") == 10**9 and parse_size("64b") == 64


def test_sizes_take_units_everywhere(tmp_path: Path) -> None:
    out = tmp_path / "x.xml"
    assert (
        run("synth", "--gpus", "4", "-o", str(out), "--min-bytes", "1KiB", "--max-bytes", "1MiB").exit_code
        == 0
    )
    assert 'minBytes="1024" maxBytes="1048576"' in out.read_text()
    assert "Units: a size takes" in run("--help").output


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        (
            "--sizes",
            "4,096",
            "'4,096': a comma separates the sizes here, so this would be 4 and 096: write 4096",
        ),
        ("--sizes", "1KiB,1,000,004", "so this would be 1, 000 and 004: write 1000004 for one"),
        ("--sizes", "2,048KiB", "so this would be 2 and 048KiB: write 2048KiB for one"),
        ("--delays", "1,500ms", "'1,500ms': a comma separates the durations here"),
    ],
)
def test_digits_grouped_with_commas_in_a_list_are_refused_not_read_as_two(
    option: str, value: str, message: str
) -> None:
    """A list's commas separate its items, where ``1,000,004 B`` (as reports print a size) groups
    digits: ``--sizes 4,096`` ran two settings, 4 B and 96 B."""
    args = {"--sizes": "1KiB", "--delays": "0ms", option: value}
    line = one_error(
        run("bench", "--backend", "local", "-n", "2", *(x for kv in args.items() for x in kv)), 2
    )
    assert line.startswith(f"Error: Invalid value for '{option}': ") and message in line


def test_a_list_item_of_zero_is_no_grouping() -> None:
    """``--delays 0,100ms`` was refused as a grouping of 0100ms (and the advice said so)."""
    ran = run(
        "bench", "--backend", "local", "-n", "2", "--sizes", "1KiB", "--delays", "0,100ms", "--iters", "1"
    )
    assert ran.exit_code == 0, ran.output
    delays = [line.split("|")[3].strip() for line in ran.stdout.splitlines() if line.startswith("| 2 |")]
    assert delays == ["0", "100"]


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--gpus", "3,3", "'--gpus': '3' is there twice: give each once"),
        ("--sizes", "64KiB,65536", "'--sizes': '64KiB' and '65536' are the same size: give each once"),
        ("--delays", "0,0ms", "'--delays': '0' and '0ms' are the same duration: give each once"),
    ],
)
def test_a_setting_given_twice_is_refused_not_measured_twice_and_shown_once(
    option: str, value: str, message: str
) -> None:
    args = {"--gpus": "2", "--sizes": "1KiB", "--delays": "0ms", option: value}
    line = one_error(run("bench", "--backend", "local", *(x for kv in args.items() for x in kv)), 2)
    assert line == f"Error: Invalid value for {message}"


def test_a_size_a_setting_could_not_run_is_refused_before_the_first_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--sizes 16MiB,1000001`` measured 16 MiB for 18 s, then refused 1000001 (a quarter of an
    element short) and lost the figures."""
    import stragglar.measure.sweep

    def measured(*args: object, **kwargs: object) -> None:
        raise AssertionError("a setting was measured")

    monkeypatch.setattr(stragglar.measure.sweep, "run_benchmark", measured)
    for sizes, message in (
        ("16MiB,1000001", "1,000,001 bytes is not a whole number of float32 elements (4 bytes each)"),
        ("16MiB,3", "need size >= one element: 3 bytes hold no float32 element"),
    ):
        line = one_error(run("bench", "--backend", "local", "-n", "2", "--sizes", sizes, "--delays", "0"), 2)
        assert line == f"Error: {message}"


@pytest.mark.parametrize(
    "args",
    [
        ["cost", "--gpus", "1_6"],
        ["cost", "--gpus", "\u0668"],
        ["bench", "--backend", "local", "--gpus", "4_0"],
        ["run", "--gpus", "2", "--iters", "1_0"],
        ["prove-all", "--max-gpus", "0_2"],  # these two options took them until 2026-12-01
        ["prove-all", "--max-simulated", "\u0668"],
        ["synth", "--gpus", "+4"],  # --chunks refused the sign, --gpus took it
    ],
)
def test_a_whole_number_is_ascii_digits_as_everywhere(args: list[str]) -> None:
    """``int()`` took ``1_6`` as 16 and an Arabic-Indic eight as 8; --chunks and sizes refuse both."""
    line = one_error(run(*args), 2)
    assert "is not a valid integer" in line or "expected rank counts like 4,8" in line, line


def test_a_list_of_small_sizes_is_still_a_list() -> None:
    ran = run("bench", "--backend", "local", "-n", "2", "--sizes", "16,64", "--delays", "0ms", "--iters", "1")
    assert ran.exit_code == 0, ran.output
    sizes = [line.split("|")[2].strip() for line in ran.stdout.splitlines() if line.startswith("| 2 |")]
    assert sizes == ["16 B", "64 B"]


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
        (["verify", "--timeout", "5s", "{json}"], "--timeout does not apply: it bounds z3's proof (--smt)"),
        (["show", "{xml}", "--plot", "x.png"], "--plot does not apply"),
        (["run", "--schedule", "{json}", "--algorithm", "ring"], "--algorithm does not apply"),
        (["run", "--schedule", "{json}", "--straggler", "1"], "--straggler does not apply"),
        (["run", "-n", "4", "-a", "ring", "--straggler", "1"], "ring has no straggler and with --delay 0 no"),
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
    assert ran.exit_code == 0 and ran.output.startswith("stragglar against sum of buffers on local: 5 ranks")


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({}, "is JSON, but not a stragglar schedule (no 'format' key) nor an MSCCL++ plan (no 'gpus' list)"),
        ({"backend": "local", "gpus": None, "settings": []}, "is JSON, but not a stragglar schedule"),
        ({"name": "p", "collective": "allreduce"}, "nor an MSCCL++ plan (no 'gpus' list)"),
        ({"trace": "t.csv", "format": "csv"}, 'format: expected "stragglar-schedule", got "csv"'),
    ],
)
def test_other_json_is_named_as_what_it_is_not(tmp_path: Path, document: object, message: str) -> None:
    """``bench --json``'s output (a ``gpus`` key, null) was read as an MSCCL++ plan, ``{}`` got
    "format: missing required key", and ``whatif --json``'s a complaint about a version."""
    path = tmp_path / "other.json"
    path.write_text(json.dumps(document))
    for command in ("verify", "show"):
        assert message in one_error(run(command, str(path)), 2)


# ---------------------------------------------------------------------------- empty files, descriptors


def test_an_empty_file_is_called_empty_whatever_its_name(tmp_path: Path) -> None:
    for name in ("e.xml", "e.json"):
        (tmp_path / name).write_text(" \n")
        assert one_error(run("verify", str(tmp_path / name)), 2).endswith(
            f"{tmp_path / name} is empty: no schedule, MSCCL XML or MSCCL++ plan in it"
        )


@pytest.mark.parametrize(
    "command",
    [
        "stragglar export in.json --format msccl -o /proc/self/fd/3 3<>in.json",
        "stragglar export in.json --format msccl -o /dev/stdout 1<>in.json",
        "stragglar export in.json --format msccl -o /dev/stdout >>in.json",
        "stragglar export in.json --format mscclpp >>in.json",
        "stragglar show in.json >>in.json",
        "stragglar verify in.json 1<>in.json",
        "stragglar run --schedule in.json --size 4KiB --iters 1 >>in.json",
        "stragglar run --schedule in.json --size 4KiB --iters 1 1<>in.json",
    ],
)
def test_an_output_descriptor_open_on_the_input_is_refused(tmp_path: Path, command: str) -> None:
    """The input was overwritten in place or appended to (exit 0): refused by name only before;
    show, verify and run --schedule appended their report to the file they read."""
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


def test_an_xml_file_holding_no_markup_is_called_no_xml_not_no_json(tmp_path: Path) -> None:
    """``hello world`` in x.xml was "not JSON: Expecting value": true, but not of an XML file."""
    path = tmp_path / "x.xml"
    path.write_text("hello world\n")
    line = one_error(run("verify", str(path)), 2)
    assert line == f"Error: {path} is not valid MSCCL XML: it starts with no '<' (nor is it JSON)"
    other = tmp_path / "x.json"
    other.write_text("hello world\n")
    assert one_error(run("verify", str(other)), 2).startswith(f"Error: {other}: not JSON: Expecting value")


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["synth", "--gpus", "4", "--gpus", "8"], "Error: --gpus/-n is given 2 times: give it once"),
        (["synth", "-n", "4", "--gpus", "8", "-n", "9"], "Error: --gpus/-n is given 3 times: give it once"),
        (
            ["show", "s.json", "--plot", "a.png", "--plot", "b.png"],
            "Error: --plot is given 2 times: give it once",
        ),
        (["bench", "--sizes", "4KiB", "--sizes", "8KiB"], "Error: --sizes is given 2 times: give it once"),
    ],
)
def test_an_option_of_one_value_given_twice_is_refused(args: list[str], line: str) -> None:
    """click kept the last: --gpus 4 --gpus 8 built for 8, and --plot wrote b.png alone."""
    result = run(*args)
    assert (result.exit_code, result.stderr) == (2, line + "\n")


def test_options_that_take_several_and_a_switch_may_repeat(tmp_path: Path) -> None:
    assert run("synth", "--gpus", "4", "-v", "-v").exit_code == 0
    trace = tmp_path / "t.csv"
    trace.write_text(
        "step,rank,time\n" + "".join(f"{s},{r},{s + r / 100}\n" for s in range(1, 9) for r in range(3))
    )
    twice = run("whatif", str(trace), "--bucket", "1MiB", "--bucket", "2MiB", "--bucket", "1MiB")
    assert twice.exit_code == 0, twice.stderr


@pytest.mark.parametrize("command", ["verify", "show", "export", "prove-all"])
def test_a_file_name_with_a_line_break_is_shown_escaped_in_its_one_line(tmp_path: Path, command: str) -> None:
    """The error line is a message's first line: a name with a line break cut it to "Error: bad"."""
    empty = tmp_path / "bad\nname.json"
    empty.write_text("")
    args = [command, str(empty)] + (["-o", str(tmp_path / "out.xml")] if command == "export" else [])
    line = one_error(run(*args), 2)
    assert "bad\\nname.json" in line and ("is empty" in line or "files failed" in line), line


def test_a_file_name_with_a_line_break_stays_on_the_line_verify_prints(tmp_path: Path) -> None:
    path = tmp_path / "bad\nname.json"
    schedule_json.write(synthesize("ring", 3), path)
    result = run("verify", str(path))
    assert result.exit_code == 0 and result.stdout.count("\n") == 1, result.stdout
    assert result.stdout.startswith(str(tmp_path) + "/bad\\nname.json: proved"), result.stdout
    table = run("prove-all", str(path))  # its row named the file raw, split in two lines
    assert table.exit_code == 0 and "bad\\nname.json" in table.stdout, table.stdout
    assert not any(line.startswith("name.json") for line in table.stdout.splitlines()), table.stdout


INTERRUPTED_WHILE_LOADING = """
import importlib.abc, runpy, sys
from importlib.metadata import entry_points

class CtrlC(importlib.abc.MetaPathFinder):  # Ctrl-C arrives while {module} loads
    def find_spec(self, name, path=None, target=None):
        if name == "{module}":
            raise KeyboardInterrupt
        return None

sys.meta_path.insert(0, CtrlC())
if sys.argv[1] == "script":  # what the console script does: load the entry point, call it
    sys.argv[1:] = ["synth", "--gpus", "4"]
    (command,) = entry_points(group="console_scripts", name="stragglar")
    sys.exit(command.load()())
sys.argv[1:] = ["synth", "--gpus", "4"]
runpy.run_module("stragglar", run_name="__main__", alter_sys=True)  # python -m stragglar
"""


@pytest.mark.parametrize("module", ["click", "stragglar.cli", "stragglar.commands"])
@pytest.mark.parametrize("how", ["script", "module"])
def test_ctrl_c_while_the_command_loads_is_aborted_not_a_traceback(how: str, module: str) -> None:
    """Ctrl-C in the first tenth of a second (the command's modules loading) printed a traceback
    from the middle of an import: it ends the command as Ctrl-C does later."""
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPTED_WHILE_LOADING.format(module=module), how],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "Aborted!\n")
