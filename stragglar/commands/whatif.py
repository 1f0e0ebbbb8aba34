"""``whatif``: would StragglAR have helped this job?  A recorded arrival trace, replayed offline."""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import click

from stragglar.commands.options import (
    BANDWIDTH,
    DURATION,
    INPUT,
    OUTPUT,
    PLOT,
    SIZE,
    Real,
    Whole,
    chunks_option,
    given,
    network_words,
    refuse_given,
)
from stragglar.commands.outputs import check_output, check_plot, dump_json, to_stdout, write_plot
from stragglar.commands.terminal import busy, echo, ticking
from stragglar.commands.whatif_report import document, group_lines, rule_words, step_count
from stragglar.errors import InputError, quoted, shown
from stragglar.files import open_regular, same_file
from stragglar.formats.flight_recorder import read_flight_recorder
from stragglar.formats.inspector import read_inspector
from stragglar.formats.traces import (
    FLIGHT_RECORDER,
    INSPECTOR,
    TABLE_FORMATS,
    TIME_UNITS,
    TRACE_FORMATS,
    Columns,
    Group,
    read_trace,
    trace_files,
    trace_format_of,
)
from stragglar.model import Network
from stragglar.model.detect import FALSE_ALARM, MIN_FALSE_ALARM, SHARE, WINDOW, Rule
from stragglar.model.whatif import GroupReplay, Setting, replay
from stragglar.units import MAX_BYTES, count_of, format_bytes, format_seconds, parse_size

__all__ = ["MAX_PLOT_GROUPS", "whatif"]

MAX_PLOT_GROUPS = 6  # panels side by side that stay readable
DEFAULT_BUCKET = "25MiB"  # DDP's own default bucket (bucket_cap_mb=25)
RECORD_UNITS = {INSPECTOR: "us", FLIGHT_RECORDER: "ns"}  # the times' unit in each library's records
TABLE_OPTIONS = ("rank_col", "step_col", "time_col", "group_col", "time_unit")  # a table's alone


def _where(values: tuple[str, ...]) -> list[tuple[str, str]]:
    pairs = []
    for value in values:
        column, equals, wanted = value.partition("=")
        if not equals or not column.strip():
            raise click.BadParameter(f"expected COLUMN=VALUE, got {quoted(value)}", param_hint="'--where'")
        pairs.append((column.strip(), wanted.strip()))
    return pairs


def _rule(false_alarm: float, share: float, margin: float) -> Rule:
    """The persistent-straggler rule of the options; a value it has no meaning for (NaN: the
    range check lets it through) is that option's error, and so is a false alarm rarer than
    :data:`MIN_FALSE_ALARM`, whose threshold would take long, or overflow, to work out."""
    for option, value in (("--false-alarm", false_alarm), ("--share", share)):
        if not 0 < value < 1:
            raise click.BadParameter(f"must be in (0, 1), got {value}", param_hint=f"'{option}'")
    if false_alarm < MIN_FALSE_ALARM:
        raise click.BadParameter(
            f"must be at least {MIN_FALSE_ALARM:g} (the threshold of a rarer false alarm takes too "
            f"long to work out), got {false_alarm}",
            param_hint="'--false-alarm'",
        )
    return Rule(false_alarm, share, margin)


def _check_readable(path: Path) -> None:
    """Refuse a trace file that cannot be read, as reading it would, before its format is told:
    a missing ``trace.log`` is "file not found", not a name whose format cannot be told."""
    with open_regular(path, "traces"):
        pass


def _replay(group: Group, setting: Setting) -> GroupReplay:
    """A group's replay; what the group's own size refuses (a chunk count under its N - 1)
    names the group, as groups of several sizes may each refuse something else."""
    try:
        return replay(group.ticks, group.steps, setting, group.per_second)
    except InputError as e:
        if group.name is None:
            raise
        raise InputError(f"group {quoted(group.name)}: {e}") from None


def _read(
    files: Sequence[Path], fmt: str, columns: Columns, where: list[tuple[str, str]], unit: str
) -> list[Group]:
    """The trace's groups: a table from its one file, a collective library's records from all."""
    if fmt == INSPECTOR:
        return read_inspector(files, where)
    if fmt == FLIGHT_RECORDER:
        return read_flight_recorder(files, where)
    if len(files) != 1:
        raise InputError(f"a {fmt} trace is one file, and {len(files):,} were given: give one")
    return read_trace(files[0], fmt, columns, where, TIME_UNITS[unit] if given("time_unit") else None)


UNLIKELY_SPREAD = 3600.0  # seconds between a step's first and last rank, in the median: a unit mistaken


NAMED_UNIT = re.compile(r"(?:^|[_\-. ])(ns|us|ms)$", re.IGNORECASE)  # start_ms, t-us, time.ns


def _check_named_unit(fmt: str, time_col: str) -> None:
    """A warning where a text table's time column names a unit (``start_ms``) and ``--time-unit``
    is not given: its numbers were read as seconds, and a rank 7 ms late said 7 s (a lateness a
    thousand times too large prices StragglAR's gain as the delay it hides).  Parquet's columns
    may carry their unit in their type, which is read exactly: no word there."""
    named = NAMED_UNIT.search(time_col)
    if named is not None and fmt != "parquet" and not given("time_unit"):
        unit = named.group(1).lower()
        echo(
            f"warning: the time column {quoted(time_col)} is read in seconds (--time-unit's default), "
            f"and its name says {unit}: give --time-unit {unit} if it is",
            err=True,
        )


def _check_unit(groups: Sequence[Group], unit: str) -> None:
    """A warning where the ranks reach a step an hour apart or more, in the median: a table's
    times in nanoseconds read as seconds (--time-unit's default) said a rank was 58 days late."""
    spreads = sorted((max(ticks) - min(ticks)) / g.per_second for g in groups for ticks in g.ticks)
    median = spreads[len(spreads) // 2]
    if median >= UNLIKELY_SPREAD:
        echo(
            f"warning: the ranks reach a step {format_seconds(median)} apart (the median): are the "
            f"times in {unit}? (--time-unit)",
            err=True,
        )


COARSE_TIME = Fraction(1, 1000)  # seconds: a float32 time column no finer than this loses lateness
FLOAT32_SAMPLE = 100_000  # the times the check below looks at: float64 data fails it at the first


def _check_resolution(groups: Sequence[Group], unit: str) -> None:
    """A warning where every time (of the first :data:`FLOAT32_SAMPLE`) is a float32's in the
    trace's unit and float32 holds the largest of them no finer than :data:`COARSE_TIME`: a
    table written with float32 times (pandas' downcast) keeps epoch seconds 128 s apart, so
    every rank reached every step "at once" and the replay says nobody was late."""
    import numpy as np  # here, not at the top: the command's help needs none of it

    per_unit = TIME_UNITS[unit]
    largest = Fraction(0)
    whole = True
    times = (Fraction(tick, group.per_second) for group in groups for step in group.ticks for tick in step)
    for time in itertools.islice(times, FLOAT32_SAMPLE):
        value = time / per_unit
        if Fraction(float(np.float32(float(value)))) != value:
            return
        largest, whole = max(largest, abs(value)), whole and value.denominator == 1
    if whole and largest < 2**24:  # every whole number below 2^24 is a float32's: no sign of one
        return
    spacing = Fraction(float(np.spacing(np.float32(float(largest))))) * per_unit
    if spacing > COARSE_TIME:
        echo(
            f"warning: every time is a float32's, which near {float(largest):.3g} {unit} are "
            f"{format_seconds(float(spacing))} apart: lateness finer than that is lost (write the "
            "times as float64 or whole nanoseconds)",
            err=True,
        )


def _buckets(group: Group, buckets_given: tuple[int, ...] | None) -> tuple[int, ...]:
    """The buckets of a group's steps: those given, else the trace's own size where it records
    one (the same at every step), else DDP's default."""
    if buckets_given:
        return buckets_given
    if group.sizes is None:
        return (parse_size(DEFAULT_BUCKET),)
    sizes = sorted(set(group.sizes))
    title = "the trace" if group.name is None else f"group {quoted(group.name)}"
    if sizes[-1] > MAX_BYTES:  # a record's counter gone wrong: --size would refuse it too
        raise InputError(
            f"{title} reduces {sizes[-1]:,} bytes at a step: more than {format_bytes(MAX_BYTES)}, "
            "stragglar prices up to that; give --size"
        )
    if len(sizes) > 1:
        raise InputError(
            f"{title} reduces {len(sizes)} sizes ({', '.join(format_bytes(s) for s in sizes[:3])}"
            f"{', ...' if len(sizes) > 3 else ''}) where whatif replays one bucket: keep one size's "
            "collectives with --where, or give --size"
        )
    return (sizes[0],)


def _check_outputs(
    json_file: Path | None, plot_file: Path | None, files: Sequence[Path], paths: Sequence[Path]
) -> None:
    """The outputs, checked before any work: none may overwrite an input, nor each other, nor go
    into a trace folder (``paths``' folders), whose every file the next run would read as a trace."""
    folders = [path for path in paths if path.is_dir()]
    for output, option in ((json_file, "--json"), (plot_file, "--plot")):
        if output is None or str(output) == "-":
            continue
        for folder in folders:
            if same_file(output.parent, folder):
                raise click.BadParameter(
                    f"{shown(output)} is in the trace folder {shown(folder)}, whose every file is read "
                    "as a trace: write it somewhere else",
                    param_hint=f"'{option}'",
                )
    check_output(Path("-"), *files)  # the report to standard output must not append to the trace
    if json_file is not None:
        check_output(json_file, *files, option="--json")
    check_plot(plot_file, *files)
    if json_file is not None and plot_file is not None and same_file(json_file, plot_file):
        raise click.BadParameter(
            f"{shown(plot_file)} is the --json file too: name two files", param_hint="'--plot'"
        )


@click.command()
@click.argument("paths", metavar="TRACE...", nargs=-1, required=True, type=INPUT)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(TRACE_FORMATS),
    help="The trace's format (default: told by its content, else by its suffix).",
)
@click.option("--rank-col", default="rank", show_default=True, help="The column of each row's rank.")
@click.option("--step-col", default="step", show_default=True, help="The column of each row's step.")
@click.option("--time-col", default="time", show_default=True, help="When the rank reached the collective.")
@click.option("--group-col", help="The column of each row's group, its own collective (default: one group).")
@click.option(
    "--where",
    "where_values",
    multiple=True,
    metavar="COLUMN=VALUE",
    help="Keep only rows with this value (repeatable; e.g. the op type of the gradient collective).",
)
@click.option(
    "--time-unit",
    type=click.Choice(tuple(TIME_UNITS), case_sensitive=False),
    default="s",
    show_default=True,
    help="The times' unit.",
)
@click.option("--size", type=SIZE, help=f"The bucket reduced each step (a size; default {DEFAULT_BUCKET}).")
@click.option("--bucket", "buckets", type=SIZE, multiple=True, help="A bucket of each step (repeatable).")
@click.option("--alpha", type=DURATION, default="3us", show_default=True, help="Latency of one round.")
@click.option(
    "--bandwidth", type=BANDWIDTH, default="450GiB/s", show_default=True, help="A link's bandwidth."
)
@click.option(
    "--window",
    type=Whole(1, 10_000),
    default=WINDOW,
    show_default=True,
    help="Recent steps the auto policy judges a named straggler over (the hook's detect=).",
)
@click.option(
    "--false-alarm",
    type=Real(0, 1, min_open=True, max_open=True),
    default=FALSE_ALARM,
    show_default=True,
    help=(
        "The persistent-straggler test's false-alarm rate: the most probability that a false alarm "
        f"begins at a step where steps are independent (at least {MIN_FALSE_ALARM:g}; one lasts "
        "until its evidence is gone; lateness that lasts a few steps is named more often)."
    ),
)
@click.option(
    "--share",
    type=Real(0, 1, min_open=True, max_open=True),
    default=SHARE,
    show_default=True,
    help=(
        "The share of steps a persistent straggler is last at that the test is tuned to find: lower "
        "finds a rank last less often, and every one more slowly (each last step is less evidence)."
    ),
)
@click.option(
    "--margin",
    type=DURATION,
    default="0s",
    show_default=True,
    help="How much later than every other rank the last rank must be for its step to count.",
)
@chunks_option("per bucket, the cost model's fastest (the hook's chunks= under the auto policy)")
@click.option("--steps", "per_step", is_flag=True, help="Also print a line per step.")
@click.option("--json", "json_file", type=OUTPUT, help="Write every figure, per step, to this JSON file.")
@PLOT
def whatif(
    paths: tuple[Path, ...],
    fmt: str | None,
    rank_col: str,
    step_col: str,
    time_col: str,
    group_col: str | None,
    where_values: tuple[str, ...],
    time_unit: str,
    size: int | None,
    buckets: tuple[int, ...],
    alpha: float,
    bandwidth: float,
    window: int,
    false_alarm: float,
    share: float,
    margin: float,
    chunks: int | str | None,
    per_step: bool,
    json_file: Path | None,
    plot_file: Path | None,
) -> None:
    """Replay a recorded arrival trace (CSV, JSON Lines or Parquet: one row per group, step and
    rank, with the time that rank reached the gradient collective; or NCCL Inspector's verbose
    JSON, or PyTorch Flight Recorder's dumps: their files, or a folder of them) through the DDP
    hook's policy and the alpha-beta model: is there a persistent straggler, how late is it, and
    what would StragglAR, chunked StragglAR and the auto policy have saved over Ring at each step?

    A model, not a measurement: each bucket is priced as if it alone met the step's arrivals.
    """
    if size is not None and buckets:
        raise click.UsageError("--size and --bucket both give the buckets: use one")
    chosen_sizes = buckets or ((size,) if size is not None else None)
    if chosen_sizes and any(s <= 0 for s in chosen_sizes):
        option = "'--bucket'" if buckets else "'--size'"
        raise click.BadParameter("a bucket must be more than 0 bytes", param_hint=option)
    where = _where(where_values)
    rule = _rule(false_alarm, share, margin)
    files = trace_files(paths)
    _check_outputs(json_file, plot_file, files, paths)
    _check_readable(files[0])
    fmt = trace_format_of(files, fmt)
    if fmt not in TABLE_FORMATS:
        refuse_given(TABLE_OPTIONS, f"the {fmt} records name their own fields and unit")
        time_unit = RECORD_UNITS[fmt]
    trace = str(paths[0]) if len(paths) == 1 else f"{paths[0]} and {len(paths) - 1:,} more"
    columns = Columns(rank_col, step_col, time_col, group_col)
    with busy(f"reading {shown(trace)}"):
        groups = _read(files, fmt, columns, where, time_unit)
    if fmt in TABLE_FORMATS:
        _check_named_unit(fmt, time_col)
        _check_unit(groups, time_unit)
        _check_resolution(groups, time_unit)
    per_group = [_buckets(g, chosen_sizes) for g in groups]
    # the buckets given, each (two of 1 MiB are two buckets); else each size the groups' own have
    sizes = chosen_sizes or tuple(dict.fromkeys(bucket for chosen in per_group for bucket in chosen))
    if plot_file is not None and len(groups) > MAX_PLOT_GROUPS:
        raise InputError(
            f"--plot draws at most {MAX_PLOT_GROUPS} groups and the trace has {len(groups)}: "
            "pick some with --where"
        )
    setting = Setting(Network(alpha, bandwidth), tuple(sizes), window, rule, chunks)
    replays = [
        _replay(g, dataclasses.replace(setting, buckets=chosen))
        for g, chosen in ticking(list(zip(groups, per_group, strict=True)), "replaying the groups")
    ]
    err = json_file is not None and to_stdout(json_file)  # stdout carries the JSON document
    echo(
        f"trace {shown(trace, limit=None)}: {count_of(len(groups), 'group')}, "
        f"{step_count(sum(len(g.steps) for g in groups))}, times in {time_unit}",
        err,
    )
    echo(
        f"model: {network_words(setting.network)}; "
        f"{'bucket' if len(sizes) == 1 else 'buckets'} {', '.join(format_bytes(s) for s in sizes)}",
        err,
    )
    echo(f"rule: {rule_words(setting.rule)}", err)
    for group, result in zip(groups, replays, strict=True):
        echo("", err)
        for line in group_lines(group, result, setting.rule, per_step):
            echo(line, err)
    if json_file is not None:
        dump_json(json_file, document(trace, fmt, time_unit, setting, groups, replays))
        if not err:
            echo(f"figures written to {shown(json_file, limit=None)}")
    if plot_file is not None:
        named = [(g.name or "", result) for g, result in zip(groups, replays, strict=True)]
        write_plot(plot_file, lambda plot: plot.whatif_figure(named))
