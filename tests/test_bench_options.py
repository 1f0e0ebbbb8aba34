"""benchmarks/options.py: the benchmarks' command lines refuse bad values in one line, exit 2,
before any work (a count of 0, a duration without its unit, a --json that cannot be written),
and end on a stragglar error or Ctrl-C as ``stragglar`` ends a command."""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from stragglar.errors import IncorrectError, InputError

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import options  # noqa: E402 - a benchmark's module, found as the benchmarks find it


def refusal(convert: Callable[[str], object], text: str) -> str:
    with pytest.raises(argparse.ArgumentTypeError) as info:
        convert(text)
    return str(info.value)


def test_whole_numbers_are_held_to_their_range_and_to_ascii_digits() -> None:
    calls = options.whole(1, 10**6)
    assert calls("2000") == 2000 and calls("1_000") == 1000 and calls("1") == 1
    assert refusal(calls, "0") == "'0': need a whole number from 1 to 1,000,000"
    assert refusal(calls, "1000001") == "'1000001': need a whole number from 1 to 1,000,000"
    assert refusal(options.whole(0), "-1") == "'-1': need a whole number of 0 or more"
    for text in ("1.5", "x", "", "\u0663"):  # Arabic-Indic 3: int() would take it
        assert refusal(calls, text) == f"{text!r} is not a whole number"
    assert options.ranks("2048") == 2048 and "from 2 to 2,048" in refusal(options.ranks, "2049")


def test_durations_need_their_unit_and_a_timeout_more_than_nothing() -> None:
    timeout = options.duration(positive=True)
    assert timeout("30ms") == pytest.approx(0.03) and timeout("1.5s") == 1.5
    assert refusal(timeout, "5") == "'5' needs a unit: write 5ms or 5s (or us)"
    assert refusal(timeout, "0s") == "'0s': need a duration more than 0"
    assert "expected a duration" in refusal(timeout, "nan")
    assert options.duration()("0s") == 0.0


def test_sizes_and_factors() -> None:
    assert options.byte_size("64MiB") == 64 * 2**20
    assert refusal(options.byte_size, "0B") == "'0B': need a size of 1 byte or more"
    assert options.positive_number("1.5") == 1.5
    for text in ("0", "-1", "inf", "nan"):
        assert refusal(options.positive_number, text) == f"{text!r}: need a number above 0"


def test_json_is_checked_before_the_work(tmp_path: Path) -> None:
    assert options.json_output(str(tmp_path / "out.json")) == tmp_path / "out.json"
    assert refusal(options.json_output, str(tmp_path)) == f"{tmp_path} is a folder: name a file in it"
    missing = tmp_path / "no" / "out.json"
    assert refusal(options.json_output, str(missing)) == f"{missing}: folder {missing.parent} does not exist"
    for stdout in ("-", "/dev/stdout"):
        assert "is standard output, which carries the table" in refusal(options.json_output, stdout)
    os.mkfifo(tmp_path / "fifo")
    assert "is not a regular file" in refusal(options.json_output, str(tmp_path / "fifo"))


@pytest.mark.parametrize(
    ("raised", "said", "code"),
    [
        (InputError("need 2 to 2048 GPUs, got 1"), "Error: need 2 to 2048 GPUs, got 1\n", 2),
        (IncorrectError("the sums differ"), "Error: the sums differ\n", 1),
        (KeyboardInterrupt(), "Aborted!\n", 130),
    ],
)
def test_a_benchmark_ends_on_an_error_as_a_command_does(
    raised: BaseException, said: str, code: int, capsys: pytest.CaptureFixture[str]
) -> None:
    def main() -> None:
        raise raised

    with pytest.raises(SystemExit) as info:
        options.as_command(main)
    assert info.value.code == code and capsys.readouterr().err == said


def test_a_bug_keeps_its_traceback() -> None:
    def main() -> None:
        raise ZeroDivisionError("a bug")

    with pytest.raises(ZeroDivisionError):
        options.as_command(main)


@pytest.mark.parametrize(
    "args",
    [
        ["bench_synth.py", "--gpus", "0"],
        ["bench_runtime.py", "--calls", "0"],
        ["bench_msccl.py", "--repeats", "0"],
        ["bench_mscclpp.py", "--json", "/"],
        ["bench_smt.py", "--bound-timeout", "600"],
        ["bench_tooling.py", "--budget", "0s"],
        ["bench_detect.py", "--gpus", "3"],
        ["bench_chunked.py", "--every", "5", "3"],
        ["bench_local.py", "--calls", "0"],
        ["bench_chunked_gloo.py", "--fit-sizes", "1MiB"],
    ],
)
def test_every_benchmark_refuses_a_bad_value_in_one_line_before_any_work(args: list[str]) -> None:
    """Each used to fail with a traceback, some after minutes of work."""
    refused_at_once(args)


def refused_at_once(args: list[str]) -> str:
    """The line ``bench_x.py`` printed when run with ``args``: its one line (argparse printed
    its usage before it), exit 2, nothing on stdout, no traceback."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / args[0]), *args[1:]],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(BENCHMARKS.parent)},
    )
    assert done.returncode == 2 and done.stdout == "", (done.stdout, done.stderr)
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{args[0]}: error: "), done.stderr  # no usage block
    return lines[0]


def test_bench_gloo_says_what_it_runs_and_keeps_its_backend() -> None:
    """Its --help was `stragglar bench`'s, with that command's defaults, not the grid's; a
    --backend of another engine failed on an option the user never gave (the grid's --timeout)."""
    env = {**os.environ, "PYTHONPATH": str(BENCHMARKS.parent)}
    script = [sys.executable, str(BENCHMARKS / "bench_gloo.py")]
    shown = subprocess.run([*script, "--help"], capture_output=True, text=True, timeout=60, env=env)
    assert shown.returncode == 0 and "--sizes 16MiB,64MiB,256MiB" in shown.stdout.replace("\n", " ")
    passed_on = " ".join(shown.stdout.partition("Options passed on to stragglar bench")[2].split())
    for option in ("--gpus/-n", "--sizes", "--delays", "--iters", "--timeout", "--chunks", "--json"):
        assert option in passed_on, passed_on  # what may be given: it said only the grid
    assert "--backend" not in passed_on
    refused = subprocess.run(
        [*script, "--backend", "local"], capture_output=True, text=True, timeout=60, env=env
    )
    assert refused.returncode == 2 and refused.stderr == (
        "bench_gloo.py: error: --backend: this grid is gloo's; use stragglar bench\n"
    )


NEEDS_TORCH = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="bench_ddp imports torch")
SCRIPTS = [
    pytest.param(name, marks=NEEDS_TORCH) if name == "bench_ddp.py" else name
    for name in sorted(path.name for path in BENCHMARKS.glob("bench_*.py") if path.name != "bench_gloo.py")
]
NO_DEFAULT = {"--json", "--link-rate", "--every"}  # absent unless given: nothing to show


def help_entries(script: str) -> dict[str, str]:
    """``script --help``'s options, each its invocation (``--gpus N [N ...]``) and its help text."""
    env = {**os.environ, "PYTHONPATH": str(BENCHMARKS.parent)}
    shown = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert shown.returncode == 0, shown.stderr
    entries: dict[str, str] = {}
    invocation = ""
    for line in shown.stdout.partition("\noptions:\n")[2].splitlines():
        if line.startswith("  -"):
            invocation, _, text = line.strip().partition("  ")
            entries[invocation] = text.strip()
        else:
            entries[invocation] = f"{entries[invocation]} {line.strip()}".strip()
    return entries


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_option_says_what_it_is_and_its_default_as_typed(script: str) -> None:
    """The help of most options was its name alone, a default in none but a few, and the rank
    lists were ``--sizes SIZES [SIZES ...]`` in one script, ``N [N ...]`` in another."""
    entries = help_entries(script)
    for invocation, text in entries.items():
        option, _, metavar = invocation.partition(" ")
        assert text, f"{script} {option}: no help"
        if metavar and option.rstrip(",") not in NO_DEFAULT and "-h" not in option:
            assert "default" in text, f"{script} {invocation}: no default shown: {text!r}"
        assert "[" not in text.partition("default")[2], f"{script} {option}: a Python list: {text!r}"
    assert "--json FILE" in entries, (script, list(entries))
    lists = [i for i in entries if i.startswith(("--gpus", "--sizes", "--fit-sizes"))]
    for invocation in lists:
        option, _, metavar = invocation.partition(" ")
        assert metavar in ("N", "N [N ...]", "SIZE [SIZE ...]"), invocation
        assert (metavar[0] == "N") == (option == "--gpus"), invocation


def test_defaults_are_shown_in_the_units_the_options_take() -> None:
    entries = help_entries("bench_chunked_gloo.py")
    assert entries["--sizes SIZE [SIZE ...]"].endswith("(default: 64MiB 256MiB)")
    assert entries["--timeout TIMEOUT"].endswith("(default: 300s)")
    assert help_entries("bench_smt.py")["--bound-timeout BOUND_TIMEOUT"].endswith("(default: 600s)")


def test_round_tables_help_is_its_whole_first_paragraph() -> None:
    """It ended mid-sentence: "... against R*(N), and chunked"."""
    env = {**os.environ, "PYTHONPATH": str(BENCHMARKS.parent)}
    shown = subprocess.run(
        [sys.executable, str(BENCHMARKS / "round_table.py"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert "generated, not typed." in " ".join(shown.stdout.split())


@pytest.mark.parametrize(
    "args",
    [
        ["bench_smt.py", "--bound-timeout", "-1s"],
        ["bench_tooling.py", "--budget", "-5s"],
        ["bench_chunked.py", "--every", "2", "3", "--limit", "-1s"],
        pytest.param(["bench_ddp.py", "--delay", "-30ms"], marks=NEEDS_TORCH),
    ],
)
def test_a_negative_duration_is_refused_by_the_duration_type(args: list[str]) -> None:
    """argparse took ``-1s`` for an option and said "expected one argument", not why."""
    line = refused_at_once(args)
    assert f"argument {args[-2]}: expected a duration" in line and f"got '{args[-1]}'" in line, line
    assert "no sign" in line


def test_bench_smt_needs_a_size_for_its_checker_or_no_checker() -> None:
    """``--sizes`` with no value ran no checker table, which its help did not say."""
    assert refused_at_once(["bench_smt.py", "--gpus"]).endswith(
        "argument --gpus: expected at least one argument"
    )
    line = refused_at_once(["bench_smt.py", "--no-checker", "--gpus", "8"])
    assert line.endswith("--gpus applies to the checker's table, which --no-checker leaves out")
