"""stragglar.units: no text costs more than a moment to read, whatever its exponent or length.

Exact arithmetic on ``1e40000000`` builds a number of forty million digits (over a minute), and
the number pattern backtracks quadratically on a long run of digits; both are bounded before any
conversion, with the answers unchanged.  The time bounds are generous guards against unbounded
work, not speed targets.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from stragglar.cli import cli
from stragglar.errors import InputError, quoted
from stragglar.units import MAX_QUANTITY_CHARS, format_ratio, parse_bandwidth, parse_duration, parse_size

PARSERS: list[tuple[Callable[[str], object], str, str]] = [
    (parse_size, "", "is more than 1 EiB"),
    (parse_duration, "s", "is longer than a week"),
    (parse_bandwidth, "GB/s", "a bandwidth must be at least 1 B/s and at most 1 EiB/s"),
]


@pytest.mark.parametrize(("parse", "unit", "message"), PARSERS)
@pytest.mark.parametrize("number", ["1e40000000", "1e9999999", "0.5E+0040000000"])
def test_a_huge_exponent_is_refused_at_once_as_over_the_maximum(
    parse: Callable[[str], object], unit: str, message: str, number: str
) -> None:
    began = time.perf_counter()
    with pytest.raises(InputError) as caught:
        parse(number + unit)
    assert time.perf_counter() - began < 1.0
    assert message in str(caught.value)


def test_a_huge_negative_exponent_reads_as_its_exact_value_would() -> None:
    """Under a byte, a float's least second and 1 B/s, as the exact value is; and zero is zero."""
    began = time.perf_counter()
    with pytest.raises(InputError, match="not a whole number of bytes"):
        parse_size("1e-40000000")
    assert parse_duration("1e-40000000s") == 0.0
    with pytest.raises(InputError, match="at least 1 B/s"):
        parse_bandwidth("1e-40000000GB/s")
    assert parse_size("0e40000000") == 0 and parse_duration("0e40000000s") == 0.0
    assert time.perf_counter() - began < 1.0


def test_exponents_in_range_keep_their_exact_values() -> None:
    assert parse_size("1.5e3KiB") == 1536000
    assert parse_size("1e18") == 10**18
    assert parse_size(f"0.{'0' * 58}1e77") == 10**18  # 64 characters, the longest read
    assert parse_duration("5e-7s") == 5e-7
    assert parse_bandwidth("1e-6TB/s") == 1e6


@pytest.mark.parametrize("parse", [p for p, _, _ in PARSERS])
@pytest.mark.parametrize("text", ["1" * 5000, "1" * 30000 + "!", " " * 100 + "1", "9" * 65])
def test_a_long_text_is_one_error_before_it_is_read(parse: Callable[[str], object], text: str) -> None:
    """5000 digits made int() raise a raw ValueError; 30000 digits and a stray character kept the
    pattern busy for minutes."""
    began = time.perf_counter()
    with pytest.raises(InputError) as caught:
        parse(text)
    assert time.perf_counter() - began < 1.0
    assert f"got {quoted(text)}: at most {MAX_QUANTITY_CHARS} characters" in str(caught.value)
    assert "\n" not in str(caught.value)


def test_the_command_line_refuses_a_huge_size_at_once() -> None:
    began = time.perf_counter()
    result = CliRunner().invoke(cli, ["cost", "--gpus", "8", "--size", "1e40000000"])
    assert time.perf_counter() - began < 5.0
    assert result.exit_code == 2
    assert result.stderr == "Error: Invalid value for '--size': '1e40000000' is more than 1 EiB\n"


@pytest.mark.parametrize("size", [2**50, 3 * 2**60 // 4, 2**60, 10**15, 7 * 10**17, 10**18, 4096])
def test_every_size_a_report_prints_is_one_a_user_may_type_back(size: int) -> None:
    """The limit was quoted as "more than 1 EiB" while EiB was refused as a unit."""
    from stragglar.units import format_bytes

    assert parse_size(format_bytes(size).replace(" ", "")) == size


@pytest.mark.parametrize("text", ["1Pb", "2Eib", "3Pib"])
def test_a_bit_style_spelling_of_the_large_units_is_refused_too(text: str) -> None:
    with pytest.raises(InputError, match="reads as bits"):
        parse_size(text)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1,000,004 B", 1_000_004),
        ("1,000,004B", 1_000_004),
        ("67108864 bytes", 2**26),
        ("1 byte", 1),
        ("64,000KB", 64 * 10**6),
    ],
)
def test_sizes_as_reports_print_them_are_read_back(text: str, size: int) -> None:
    """Reports print ``1,000,004 B`` and a plan's ``67108864 bytes``: both were refused as input."""
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["1,5KiB", "12,34", "1,000.5MB", ",100", "1,00,000", "0,001GiB", "00,100"])
def test_a_comma_that_does_not_group_thousands_is_refused_with_what_commas_may_do(text: str) -> None:
    """``0,001GiB`` (a decimal comma) was read as 1 GiB: no grouping starts with 0."""
    with pytest.raises(InputError, match="commas only group a whole number's digits in threes"):
        parse_size(text)


def test_the_sizes_show_prints_for_a_plan_can_be_typed_back(tmp_path: Path) -> None:
    from cli_results import run

    plan = tmp_path / "p.json"
    assert run("synth", "--gpus", "4", "--format", "mscclpp", "-o", str(plan)).exit_code == 0
    shown = run("show", str(plan), "--size", "64MiB")
    assert shown.exit_code == 0, shown.output
    sizes = re.findall(r"(\d[\d,]*) bytes", shown.stdout)
    assert sizes, shown.stdout
    for text in sizes:
        assert parse_size(f"{text} bytes") == int(text.replace(",", ""))


@pytest.mark.parametrize(
    ("text", "rate"),
    [
        ("7.2Tbit/s", 0.9e12),
        ("1Pbit/s", 1e15 / 8),
        ("1Ebit/s", 1e18 / 8),
        ("8Gibit/s", 2**30),
        ("8Mibit/s", 2**20),
        ("100Gbit/s", 12.5e9),
    ],
)
def test_bits_take_every_prefix_bytes_do(text: str, rate: float) -> None:
    """An NVLink-class 7.2 Tbit/s was refused as an unknown unit while 1 TB/s was read."""
    assert parse_bandwidth(text) == rate


@pytest.mark.parametrize(("text", "seconds"), [("500ns", 5e-7), ("5µs", 5e-6), ("5μs", 5e-6), ("2 us", 2e-6)])
def test_durations_take_every_unit_a_report_prints_and_the_micro_sign(text: str, seconds: float) -> None:
    """Reports print nanoseconds, and whatif's --time-unit took ns, where --delay 500ns was refused;
    5µs was "expected a duration like 20ms" although it is one."""
    assert parse_duration(text) == pytest.approx(seconds, rel=1e-15)


def test_whatif_reads_its_time_unit_as_every_duration_is_read(tmp_path: Path) -> None:
    """--time-unit MS was refused where --delay 5MS is 5 ms."""
    trace = tmp_path / "t.csv"
    trace.write_text(
        "step,rank,time\n" + "".join(f"{s},{r},{s * 1000 + 7 * r}\n" for s in range(1, 9) for r in range(3))
    )
    results = [CliRunner().invoke(cli, ["whatif", str(trace), "--time-unit", unit]) for unit in ("ms", "MS")]
    assert [r.exit_code for r in results] == [0, 0], [r.output for r in results]
    assert results[0].output == results[1].output


@pytest.mark.parametrize(
    ("ratio", "printed"),
    [
        (1.3629, "1.36"),
        (1.0, "1.00"),
        (12.345, "12.35"),
        (0.5888, "0.589"),  # was 0.59
        (0.00925, "0.00925"),  # stragglar run at N = 256, 64 KiB: was 0.01
        (0.0012, "0.00120"),  # was 0.00
        (0.99996, "1.00"),  # rounds up to 1 as two decimals would, not to 1.000
    ],
)
def test_a_ratio_prints_two_decimals_from_1_and_three_digits_below(ratio: float, printed: str) -> None:
    """Every speed-up a report prints goes through format_ratio: two decimals read a small one as
    0.01 or 0.00."""
    assert format_ratio(ratio) == printed
