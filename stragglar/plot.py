"""Pictures for people: the cost model's speed-ups and a schedule's rank x round chart.

matplotlib is optional (``pip install matplotlib``, the plot extra), imported only when a figure
is drawn, so the rest of the package works without it.  Figures are built on
``matplotlib.figure.Figure`` directly (no pyplot, no GUI backend), so that callers and tests can
inspect them before :func:`save` writes a PNG.
"""

from __future__ import annotations

import importlib.util
import io
import math
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from stragglar.errors import InputError, shown
from stragglar.files import write_bytes
from stragglar.formats.text import compact_ranges
from stragglar.model import Network, compare_generated
from stragglar.model.whatif import PRICED, GroupReplay
from stragglar.schedule import Op, Schedule, Transfer
from stragglar.units import format_bytes, format_seconds

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = [
    "LABELLED_RANKS",
    "MAX_PANELS",
    "MAX_WIDTH",
    "PlotUnavailable",
    "chunk_sweep",
    "cost_figure",
    "render",
    "require_matplotlib",
    "save",
    "schedule_figure",
    "sweep_sizes",
    "whatif_figure",
]

LABELLED_RANKS = 32
"""Largest N whose schedule chart names each send in its cell; above it only colours are drawn."""
CELL_CHARACTERS = 10  # what a named cell holds at its font size; a longer name is shortened
NAMED_CELL_WIDTH = 0.62  # inches: a named cell's width, wide enough for CELL_CHARACTERS at 6 pt
MAX_WIDTH = 20.0
"""Inches (2,200 pixels in a PNG) past which the schedule chart wraps onto another row of panels."""
MAX_PANELS = 8
"""Rows of panels past which the chart stops naming its cells (colours only), so it stays a picture."""
TICK_SPACING = 0.35  # inches between two round numbers on the x axis, so that they never touch
PHASE_NAME = 24  # characters of a phase's name above its rounds; the rest counted
TITLE_NAME = 40  # characters of an algorithm's or a group's name in a title


class PlotUnavailable(InputError):
    """matplotlib is not installed."""


def require_matplotlib() -> None:
    """Raise :class:`PlotUnavailable` now, not after the work, when matplotlib is missing."""
    if importlib.util.find_spec("matplotlib") is None:
        raise PlotUnavailable("plotting needs matplotlib: pip install matplotlib")


def _figure(width: float, height: float) -> Figure:
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotUnavailable("plotting needs matplotlib: pip install matplotlib") from None
    return Figure(figsize=(width, height), layout="constrained")


def sweep_sizes(num_ranks: int) -> list[int]:
    """The N of the speed-up-against-N panel: every N to 32, then a few large ones, and ``num_ranks``."""
    return sorted({*range(2, 33), 48, 64, 96, 128, 192, 256, num_ranks})


_COLOURS = {"stragglar": "C0", "rhd": "C1", "direct": "C2"}


def _algorithm_colour(algorithm: str) -> str:
    """One colour per algorithm across panels; StragglAR in C chunks its own."""
    return _COLOURS.get(algorithm, "C4")


def _legend_below(ax: Axes) -> None:
    """The legend under the axes, outside the plot, so that it never covers a curve."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, fontsize=8, frameon=False)


def cost_figure(
    num_ranks: int,
    size_bytes: float,
    delay: float,
    network: Network,
    sizes: Sequence[int] | None = None,
    chunks: int | None = None,
) -> Figure:
    """Speed-up over Ring against N (at ``delay``) and against the delay (at ``num_ranks``); with
    ``chunks``, also StragglAR's against its chunk count C (:func:`chunk_sweep`), marking C."""
    fig = _figure(18 if chunks is not None else 12, 4.8)
    panels = fig.subplots(1, 3 if chunks is not None else 2)
    by_n, by_delay = panels[0], panels[1]
    ns = list(sizes) if sizes is not None else sweep_sizes(num_ranks)
    comparisons = [compare_generated(n, size_bytes, delay, network) for n in ns]
    here = compare_generated(num_ranks, size_bytes, delay, network, chunks=chunks)
    for algorithm in ("stragglar", "rhd", "direct"):
        points = [
            (c.num_ranks, c.speedup(algorithm))
            for c in comparisons
            if algorithm in {e.algorithm for e in c.estimates}
        ]
        if points:
            xs, ys = zip(*points, strict=True)
            by_n.plot(xs, ys, marker="o", markersize=3, label=algorithm, color=_algorithm_colour(algorithm))
    by_n.axhline(1.0, color="grey", linestyle="--", label="ring (baseline)")
    by_n.axvline(num_ranks, color="black", linestyle=":", linewidth=1, label=f"N = {num_ranks}")
    by_n.set_xscale("log", base=2)
    by_n.set_xlabel("number of GPUs N (log scale)")
    by_n.set_ylabel("speed-up over Ring (exposed time)")
    by_n.set_title(f"against N, straggler {format_seconds(delay)} late")
    _legend_below(by_n)

    # the delays past which each straggler-aware schedule beats Ring, as the table says them (none
    # where it does at every delay or at none)
    marks = [(e.algorithm, here.critical_delay(e.algorithm)) for e in here.estimates if e.hidden > 0]
    crossings = [(algorithm, d) for algorithm, d in marks if d]
    knee = max([d for _, d in crossings] + [here.get("stragglar").hidden])  # where the curves turn
    top = max(2 * delay, 2 * knee, 1e-6)
    wide = knee > 0 and top > 50 * knee  # a linear axis to 1 s would squash a turn at 30 us onto 0
    if wide:
        delays = [knee / 20 * (top / (knee / 20)) ** (i / 200) for i in range(201)]
        by_delay.set_xscale("log")
    else:
        delays = [top * i / 200 for i in range(201)]
    at = [compare_generated(num_ranks, size_bytes, d, network, chunks=chunks) for d in delays]
    for algorithm in (e.algorithm for e in here.estimates if e.algorithm != "ring"):
        curve = [c.speedup(algorithm) for c in at]
        by_delay.plot([d * 1e3 for d in delays], curve, label=algorithm, color=_algorithm_colour(algorithm))
    by_delay.axhline(1.0, color="grey", linestyle="--", label="ring (baseline)")
    for algorithm, crossing in crossings:
        by_delay.axvline(
            crossing * 1e3,
            color=_algorithm_colour(algorithm),
            linestyle=":",
            label=f"{algorithm} beats ring past {format_seconds(crossing)}",
        )
    by_delay.set_xlabel("straggler delay (ms, log scale)" if wide else "straggler delay (ms)")
    by_delay.set_ylabel("speed-up over Ring (exposed time)")
    by_delay.set_title(f"against the delay, N = {num_ranks}")
    _legend_below(by_delay)
    if chunks is not None:
        _by_chunks(panels[2], num_ranks, size_bytes, delay, network, chunks)
    for ax in panels:  # speed-ups near 1x as themselves, not as "1e-5 + 1" and offsets from it
        ax.ticklabel_format(axis="y", useOffset=False, style="plain")
    if not wide:
        by_delay.ticklabel_format(axis="x", useOffset=False, style="plain")
    fig.suptitle(
        f"Alpha-beta model: {format_bytes(size_bytes)} buffer, alpha {format_seconds(network.alpha)}, "
        f"{format_bytes(network.bandwidth)}/s per link"
    )
    return fig


def chunk_sweep(num_ranks: int, chunks: int) -> list[int]:
    """The chunk counts of the speed-up-against-C panel: from N-1 to twice the larger of
    ``chunks`` and 2(N-1), about 48 of them spaced evenly on a log scale, with ``chunks`` (the
    count the panel marks: auto's, or the one asked for).

    >>> points = chunk_sweep(8, 38)
    >>> points[0], points[-1], 38 in points, len(points) <= 50
    (7, 76, True, True)
    """
    low = num_ranks - 1
    high = 2 * max(chunks, 2 * low)
    steps = 48
    points = {round(low * (high / low) ** (i / steps)) for i in range(steps + 1)}
    return sorted(points | {chunks})


def _by_chunks(ax: Axes, n: int, size_bytes: float, delay: float, network: Network, chunks: int) -> None:
    points = chunk_sweep(n, chunks)
    curve = [compare_generated(n, size_bytes, delay, network, ("stragglar",), chunks=c) for c in points]
    ys = [c.speedup(c.estimates[0].algorithm) for c in curve]
    ax.plot(
        points, ys, marker="o", markersize=3, label="stragglar in C chunks", color=_algorithm_colour("chunks")
    )
    ax.axhline(1.0, color="grey", linestyle="--", label="ring (baseline)")
    ax.axvline(n - 1, color="black", linestyle=":", linewidth=1, label=f"the paper's C = N-1 = {n - 1}")
    if chunks != n - 1:  # one line, one legend entry, where the count is the paper's
        ax.axvline(chunks, color="red", linestyle=":", label=f"C = {chunks}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("chunks C (log scale)")
    ax.set_ylabel("speed-up over Ring (exposed time)")
    ax.set_title(f"against the chunk count, N = {n}")
    _legend_below(ax)


def schedule_figure(schedule: Schedule) -> Figure:
    """A rank x round chart: each cell says what that rank sends in that round and to whom.

    ``c3>5`` sends chunk 3 to rank 5 (a copy), ``c3+>5`` adds it into rank 5's chunk 3, ``5c+>1``
    adds five chunks (a name too long for its cell says how many).  The cell's colour is its
    (first) chunk's; the phases without the straggler (hidden behind its delay) are shaded.  Above
    :data:`LABELLED_RANKS` ranks, or where the named rounds would need more than
    :data:`MAX_PANELS` rows, the cells are too small to name and the title says so.  A chart wider
    than :data:`MAX_WIDTH` wraps onto rows of panels, like lines of text, so that a long schedule
    stays as readable as a short one instead of becoming a strip thousands of pixels wide.
    """
    n = schedule.num_ranks
    columns = [
        (pi, ri, rnd) for pi, phase in enumerate(schedule.phases) for ri, rnd in enumerate(phase.rounds)
    ]
    cell_h = 0.3 if n <= LABELLED_RANKS else 0.06
    per_panel = int((MAX_WIDTH - 2.0) // NAMED_CELL_WIDTH)
    named = n <= LABELLED_RANKS and -(-len(columns) // per_panel) <= MAX_PANELS
    cell_w = NAMED_CELL_WIDTH if named else 0.12
    per_panel = int((MAX_WIDTH - 2.0) // cell_w)
    panels = -(-len(columns) // per_panel)
    shown_columns = min(len(columns), per_panel)
    panel_h = max(3.0 if panels == 1 else 1.5, cell_h * n + 1.6)
    fig = _figure(max(6.0, cell_w * shown_columns + 2.0), panel_h * panels)
    axes = fig.subplots(panels, 1, squeeze=False)[:, 0]
    for index, ax in enumerate(axes):
        first = index * per_panel
        _schedule_panel(ax, schedule, columns[first : first + per_panel], first, named, cell_w)
        ax.set_xlim(first - 0.5, first + shown_columns - 0.5)  # every row of panels at one scale
    axes[-1].set_xlabel("round (numbered within each phase)")
    if axes[0].get_legend_handles_labels()[0]:
        axes[0].legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7)
    if named:
        key = "cK>d: send chunk K to rank d; cK+>d: add it there; kc: k chunks"
    elif n > LABELLED_RANKS:
        key = f"each cell a send, coloured by its chunk (more than {LABELLED_RANKS} ranks: too small to name)"
    else:
        key = f"each cell a send, coloured by its chunk ({len(columns)} rounds: too many to name)"
    wrapped = f", wrapped onto {panels} rows" if panels > 1 else ""
    axes[0].set_title(
        f"{_label(schedule.algorithm, TITLE_NAME)}: {n} ranks, {schedule.num_chunks} chunks, "
        f"{schedule.num_rounds} rounds"
        f"{wrapped}\n{key}",
        fontsize=9,
    )
    return fig


def _schedule_panel(
    ax: Axes,
    schedule: Schedule,
    columns: Sequence[tuple[int, int, Sequence[Transfer]]],
    first: int,
    named: bool,
    cell_w: float,
) -> None:
    """One row of the schedule chart: the rounds ``columns``, the first of them at x = ``first``."""
    n = schedule.num_ranks
    colours = [[math.nan] * len(columns) for _ in range(n)]
    for x, (_, _, rnd) in enumerate(columns):
        sends: dict[int, tuple[int, Op, list[int]]] = {}
        for t in rnd:
            sends.setdefault(t.src, (t.dst, t.op, []))[2].append(t.chunk)
        for src, (dst, op, chunks) in sends.items():
            colours[src][x] = _colour(chunks[0])
            if named:
                ax.text(first + x, src, _cell_name(chunks, op, dst), ha="center", va="center", fontsize=6)
    ax.imshow(
        colours,
        cmap="tab20",
        vmin=0,
        vmax=19,
        aspect="auto",
        alpha=0.6,
        interpolation="nearest",
        extent=(first - 0.5, first + len(columns) - 0.5, n - 0.5, -0.5),
    )
    last = first + len(columns)
    start, middles, names = 0, list[float](), list[str]()
    for index, phase in enumerate(schedule.phases):
        end = start + len(phase.rounds)
        lo, hi = max(start, first), min(end, last)
        if lo < hi:  # the part of this phase that falls in this row
            if index < schedule.hidden_phases:
                ax.axvspan(lo - 0.5, hi - 0.5, color="grey", alpha=0.15, label="hidden behind the delay")
            if end <= last:
                ax.axvline(end - 0.5, color="black", linewidth=1)
            middles.append((lo + hi - 1) / 2)
            names.append(_label(phase.name, PHASE_NAME))
        start = end
    phases = ax.secondary_xaxis("top")  # phase names above the chart, the title above them
    phases.set_xticks(middles, names, fontsize=8)
    phases.tick_params(length=0)
    shown = _labelled_ranks(n, schedule.straggler)
    ax.set_yticks(shown, [_rank_label(r, schedule.straggler) for r in shown], fontsize=7)
    ticks = _round_ticks([ri for _, ri, _ in columns], max(1, math.ceil(TICK_SPACING / cell_w)))
    ax.set_xticks([first + x for x in ticks], [str(columns[x][1]) for x in ticks])
    ax.tick_params(axis="x", labelsize=7)
    ax.set_ylabel("rank (sender)")
    ax.set_ylim(n - 0.5, -0.5)


def _round_ticks(rounds: Sequence[int], step: int) -> list[int]:
    """Which columns get their round number: every phase's round 0 (where a reader looks for the
    boundary; a one-digit label, so half the spacing keeps them apart), then every ``step``-th
    round, never closer than ``step`` columns to another tick.

    >>> _round_ticks([0, 1, 2, 3, 4, 0, 1, 2, 3], 2), _round_ticks([0, 1, 0, 1, 2, 3, 4, 5, 6, 7], 3)
    ([0, 2, 5, 7], [0, 2, 5, 8])
    """
    ticks: list[int] = []
    for x, r in enumerate(rounds):
        if r == 0 and (not ticks or x - ticks[-1] >= -(-step // 2)):
            ticks.append(x)
    for x, r in enumerate(rounds):
        if r % step == 0 and all(abs(x - t) >= step for t in ticks):
            ticks.append(x)
    return sorted(ticks)


def _cell_name(chunks: Sequence[int], op: Op, dst: int) -> str:
    """What a cell says: ``c0-3,6+>5``, or ``5c+>5`` (how many chunks) where that would not fit.

    >>> _cell_name([3], Op.COPY, 5), _cell_name([2, 13, 20, 27, 34], Op.REDUCE, 1)
    ('c3>5', '5c+>1')
    """
    mark = "+" if op is Op.REDUCE else ""
    name = f"c{compact_ranges(chunks)}{mark}>{dst}"
    return name if len(name) <= CELL_CHARACTERS else f"{len(chunks)}c{mark}>{dst}"


def _labelled_ranks(n: int, straggler: int | None) -> list[int]:
    """At most about 32 rank labels, evenly spaced, the straggler's always among them.

    >>> _labelled_ranks(8, 7), _labelled_ranks(128, 127)[:3], len(_labelled_ranks(128, 127))
    ([0, 1, 2, 3, 4, 5, 6, 7], [0, 4, 8], 32)
    """
    step = max(1, -(-n // LABELLED_RANKS))
    shown = set(range(0, n, step))
    if straggler is not None:
        shown = {r for r in shown if abs(r - straggler) >= step or r == straggler} | {straggler}
    return sorted(shown)


def _colour(chunk: int) -> int:
    """tab20 holds ten hue pairs: take the ten strong hues first, so neighbouring chunks differ."""
    return (2 * chunk) % 20 + (chunk // 10) % 2


def _rank_label(rank: int, straggler: int | None) -> str:
    return f"{rank} (straggler)" if rank == straggler else str(rank)


def whatif_figure(groups: Sequence[tuple[str, GroupReplay]]) -> Figure:
    """Per group (a column, named unless ``""``): each step's lateness of the last rank, marked
    where the auto policy chose StragglAR, above each algorithm's predicted time per step."""
    fig = _figure(6 * len(groups), 7.5)
    panels = fig.subplots(2, len(groups), squeeze=False)
    for column, (name, result) in enumerate(groups):
        late, priced = panels[0][column], panels[1][column]
        steps = [s.step for s in result.steps]
        lateness = [max(s.late) * 1e3 for s in result.steps]
        late.plot(steps, lateness, color="grey", linewidth=1, label="the last rank's lateness")
        chosen = [(s.step, x) for s, x in zip(result.steps, lateness, strict=True) if s.chose_stragglar]
        if chosen:
            xs, ys = zip(*chosen, strict=True)
            late.scatter(xs, ys, color=_algorithm_colour("stragglar"), s=12, label="auto chose StragglAR")
        late.set_xlabel("step")
        late.set_ylabel("lateness behind the next rank (ms)")
        late.set_title(f"group {_label(name, TITLE_NAME)}" if name else f"{result.num_ranks} ranks")
        _legend_below(late)
        for algorithm in PRICED:  # auto follows ring or stragglar step by step: dashed, so both show
            times = [s.predicted[algorithm] * 1e3 for s in result.steps]
            colour = {"ring": "grey", "auto": "C3"}.get(algorithm) or _algorithm_colour(algorithm)
            style = {"auto": (0, (4, 3))}.get(algorithm, "solid")
            width = {"ring": 2.5}.get(algorithm, 1.2)
            priced.plot(steps, times, linewidth=width, linestyle=style, label=algorithm, color=colour)
        priced.set_xlabel("step")
        priced.set_ylabel("predicted time from the first arrival (ms)")
        _legend_below(priced)
    fig.suptitle("What-if: a trace replayed through the auto policy and the model")
    return fig


def _label(name: str, limit: int) -> str:
    """A name read from a file as a chart shows it: escaped as messages escape it (a control
    character is no glyph of any font), its dollar signs too (matplotlib reads ``$...$`` as
    math, and a malformed formula failed the drawing), and cut to ``limit`` characters (a long
    one took the chart's whole width), the rest counted."""
    return shown(name, limit).replace("$", r"\$")


def render(fig: Figure, fmt: str = "png") -> bytes:
    """``fig`` as the bytes of a ``png``, ``svg`` or ``pdf`` file (written by the caller, atomically).
    Matplotlib's layout warnings (a crowded chart laid out as well as it goes) are its own, not
    the command's: they would reach the user's terminal as Python warnings."""
    out = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        fig.savefig(out, format=fmt, dpi=110)
    return out.getvalue()


def save(fig: Figure, path: Path) -> None:
    """Write ``fig`` to ``path`` (format from the suffix: png, svg or pdf), atomically."""
    write_bytes(path, render(fig, path.suffix.lower().lstrip(".") or "png"))
