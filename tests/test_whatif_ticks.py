"""whatif's times as whole ticks: read exactly whatever the denominators (decimal places that differ
from row to row, units, floats, nanoseconds since 1970, the largest and smallest times a cell may
hold), replayed to the same figures as the exact fractions they are, and a cell refused as before
however many times its value was read."""

from __future__ import annotations

import json
import random
from fractions import Fraction
from pathlib import Path

import pytest

from stragglar.errors import ArgumentError, InputError
from stragglar.formats.trace_reading import exact_time
from stragglar.formats.traces import TIME_UNITS, Columns, Group, read_trace
from stragglar.model import Network
from stragglar.model.detect import Rule, check_step_figures, event_rank, fresh, observe
from stragglar.model.policy import outlook
from stragglar.model.whatif import Setting, replay
from stragglar.units import common_ticks

SETTING = Setting(Network(1e-5, 25e9), (2**20, 2**24), window=6, rule=Rule(false_alarm=0.01))


def table(tmp_path: Path, rows: list[tuple[int, int, str]], name: str = "t.csv") -> Path:
    path = tmp_path / name
    path.write_text("step,rank,time\n" + "".join(f"{s},{r},{t}\n" for s, r, t in rows))
    return path


def fractions_replayed(group: Group) -> None:
    """The replay on the ticks is the replay on the exact seconds, figure for figure."""
    ticks = replay(group.ticks, group.steps, SETTING, group.per_second)
    exact = replay(group.times, group.steps, SETTING)
    assert ticks == exact
    for row, step in zip(group.times, ticks.steps, strict=True):
        others = [max(t for j, t in enumerate(row) if j != i) for i in range(len(row))]
        assert step.late == tuple(float(t - other) for t, other in zip(row, others, strict=True))


def test_decimal_places_that_differ_share_the_least_common_tick(tmp_path: Path) -> None:
    rows = [(0, 0, "1.5"), (0, 1, "1.25"), (0, 2, "2"), (1, 0, "3.125e0"), (1, 1, "3.1"), (1, 2, "31e-1")]
    (group,) = read_trace(table(tmp_path, rows), "csv", Columns())
    assert group.per_second == 1000
    assert group.ticks == ((1500, 1250, 2000), (3125, 3100, 3100))
    assert group.times[1] == (Fraction(25, 8), Fraction(31, 10), Fraction(31, 10))
    fractions_replayed(group)


def test_a_unit_scales_the_tick_not_the_times(tmp_path: Path) -> None:
    rows = [(0, 0, "7.5"), (0, 1, "7"), (1, 0, "9"), (1, 1, "9.001")]
    (group,) = read_trace(table(tmp_path, rows), "csv", Columns(), (), TIME_UNITS["ms"])
    assert group.times == (
        (Fraction(75, 10**4), Fraction(7, 10**3)),
        (Fraction(9, 10**3), Fraction(9001, 10**6)),
    )
    fractions_replayed(group)


def test_nanoseconds_since_1970_keep_every_nanosecond(tmp_path: Path) -> None:
    start = 1_750_000_000_123_456_789  # past a float's 53 bits: as a float, 256 ns apart
    offsets = [(0, 1, 2), (1, 1, 2)]  # nanoseconds after the step's start: ranks a nanosecond apart
    rows = [(s, r, str(start + s * 10**8 + offsets[s % 2][r])) for s in range(12) for r in range(3)]
    (group,) = read_trace(table(tmp_path, rows), "csv", Columns(), (), TIME_UNITS["ns"])
    assert group.ticks[0] == (start, start + 1, start + 2) and group.per_second == 10**9
    result = replay(group.ticks, group.steps, SETTING, group.per_second)
    assert result.steps[0].late == (-2e-9, -1e-9, 1e-9)  # 1 ns later than the next: 1e-9 s, not 0
    assert result.steps[1].late == (-1e-9, -1e-9, 1e-9)  # the second-latest rank ties with the first
    fractions_replayed(group)


def test_floats_of_json_lines_mix_with_decimals_and_integers(tmp_path: Path) -> None:
    rows: list[dict[str, object]] = [
        {"step": 0, "rank": 0, "time": 0.1},
        {"step": 0, "rank": 1, "time": "0.1"},  # the decimal, not the float nearest it
        {"step": 0, "rank": 2, "time": 1},
        {"step": 1, "rank": 0, "time": 2.000000001},
        {"step": 1, "rank": 1, "time": "2.0000000011"},
        {"step": 1, "rank": 2, "time": 2},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    (group,) = read_trace(path, "jsonl", Columns())
    assert group.times[0] == (Fraction(0.1), Fraction(1, 10), Fraction(1))
    assert group.times[0][0] != group.times[0][1]  # the float is 5.55e-18 above a tenth
    fractions_replayed(group)


def test_the_largest_and_smallest_times_a_cell_holds_replay_exactly(tmp_path: Path) -> None:
    big = "9" * 30  # below MAX_TIME (1e30) by one
    rows = [(0, 0, big), (0, 1, "1e-999"), (1, 0, big), (1, 1, f"{big}.{'0' * 39}1")]
    (group,) = read_trace(table(tmp_path, rows), "csv", Columns())
    assert group.per_second == 10**999  # the tick of the smallest cell: every other time a multiple
    assert group.ticks[1][1] - group.ticks[1][0] == 10 ** (999 - 40)
    fractions_replayed(group)
    assert refused(table(tmp_path, [(0, 0, "1" + "0" * 30), (0, 1, "0")])).endswith(
        "line 2: time is '1000000000000000000000000000000': at most 1e+30 of its unit"
    )
    assert refused(table(tmp_path, [(0, 0, "-1e30"), (0, 1, "0")])).endswith("at most 1e+30 of its unit")


def refused(path: Path, fmt: str = "csv") -> str:
    with pytest.raises(InputError) as info:
        read_trace(path, fmt, Columns())
    return str(info.value)


def test_exact_time_reads_every_kind_of_cell_as_its_fraction() -> None:
    cells: list[str | int | float] = [
        "0",
        "-0.0",
        "+.5",
        "5.",
        "12.3400",
        "1e3",
        "-2.5E-3",
        "  7.25  ",
        3,
        2.5,
        0.1,
        -(2**70),
    ]
    for cell in cells:
        numerator, denominator = exact_time(cell, "t", "here")
        expected = Fraction(cell.strip()) if isinstance(cell, str) else Fraction(cell)
        assert denominator > 0 and Fraction(numerator, denominator) == expected, cell
    assert exact_time("12.3400", "t", "here") == (123400, 10**4)  # not reduced: a column shares it
    for bad in ["", "1_000", "0x10", "1e", "nan", "inf", "٣", True, None, float("nan")]:
        with pytest.raises(InputError, match=r"^here: t is .*, not a number$"):
            exact_time(bad, "t", "here")


def test_common_ticks_of_one_denominator_keep_the_numerators() -> None:
    rows = [[(3, 10**6), (-5, 10**6)], [(7, 10**6), (11, 10**6)]]
    assert common_ticks(rows) == (((3, -5), (7, 11)), 10**6)
    random.seed(7)
    mixed = [[(random.randrange(-(10**9), 10**9), random.choice([1, 2**40, 10**6, 3])) for _ in range(4)]]
    ticks, per_second = common_ticks(mixed)
    assert [Fraction(t, per_second) for t in ticks[0]] == [Fraction(n, d) for n, d in mixed[0]]


def test_a_cell_read_once_is_still_refused_where_its_type_differs(tmp_path: Path) -> None:
    """A rank of 1 read and kept does not make a later ``true`` (equal to 1 in Python) a rank."""
    rows: list[dict[str, object]] = [
        {"step": 0, "rank": 1, "time": 0},
        {"step": 0, "rank": 0, "time": 0},
        {"step": 1, "rank": True, "time": 1},
    ]
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert refused(path, "jsonl") == f"{path} line 3: rank is true: name a rank or group"
    rows[2] = {"step": 1.0, "rank": 1.0, "time": 1}  # a whole float is the int's rank and step
    rows.append({"step": 1, "rank": 0, "time": 1})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    (group,) = read_trace(path, "jsonl", Columns())
    assert group.ranks == ("0", "1") and group.steps == (0, 1)


def test_replay_refuses_a_tick_that_is_no_whole_number_above_zero() -> None:
    for per_second in (0, -3, 1.5, True):
        with pytest.raises(ArgumentError, match="per_second must be a whole number of ticks above 0"):
            replay([(0, 1)], [1], SETTING, per_second)  # type: ignore[arg-type]


def test_figures_past_a_floats_range_are_finite_ints_and_a_nan_is_still_refused() -> None:
    check_step_figures([10**400, -(10**400), 0], "waits")  # no OverflowError from isfinite
    with pytest.raises(InputError, match=r"^waits must be finite numbers"):
        check_step_figures([10**400, float("nan")], "waits")
    with pytest.raises(ArgumentError, match=r"waits must be numbers, got True \(bool\)"):
        check_step_figures([1, True], "waits")


def test_an_outlook_with_the_events_given_is_the_one_worked_out() -> None:
    rule, rows = Rule(false_alarm=0.01), []
    random.seed(3)
    state = fresh(4)
    for step in range(40):
        row = [random.uniform(-0.02, 0.0) for _ in range(4)]
        row[1 if step % 5 else 2] = 0.01
        rows.append(tuple(row))
        state = observe(rule, state, row)
        recent = rows[-8:]
        events = [event_rank(rule, r) for r in recent]
        for fixed in (None, 3):
            assert outlook(rule, state, recent, fixed, None, None, events) == outlook(
                rule, state, recent, fixed, None, None
            )
    with pytest.raises(ArgumentError, match=r"^7 events for 8 rows of latenesses"):
        outlook(rule, state, rows[-8:], 1, None, None, events[:7])
