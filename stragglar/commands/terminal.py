"""What the commands show on the terminal beside their results: their own text, escaped, and
progress lines on stderr that appear only on a terminal and only for work that lasts.

tqdm's monitor thread would outlive every bar, and a thread alive when ``run`` forks its ranks
can leave a lock held in a child for good, so there is none: a bar moves when its caller's loop
moves it (:class:`Bar`), or, around work that forks nothing, from a thread of its own that ends
with the work (:func:`busy`).

A bar waits :data:`SHOW_AFTER` seconds of its command, not of its own step (:func:`command_clock`):
a step begun after the first second shows at once, where each step waiting a second of its own
left the screen blank for a second between steps, and the command's imports' second before the
first.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import click
from tqdm import tqdm

from stragglar.errors import printable

__all__ = ["Bar", "busy", "command_clock", "echo", "progress", "progress_bar", "ticking"]

_T = TypeVar("_T")

tqdm.monitor_interval = 0


def echo(text: str, err: bool = False) -> None:
    """Print the command's own text (stderr if ``err``), with what it shows of files and options
    escaped (:func:`~stragglar.errors.printable`): a name read from a file must not drive the
    terminal.  A progress bar on the terminal is lifted off while it prints, and what the other
    stream holds (a closed bar's last carriage return) goes out first, so that no bar text lands
    on the line.  Documents (a schedule, an artifact, results) go out as they are
    (:func:`stragglar.commands.outputs.write`)."""
    other = sys.stdout if err else sys.stderr
    if other is not None:  # None: closed before the start (click writes nothing to it either)
        other.flush()
    with _shown_bars_lifted():
        click.echo(printable(text), err=err)


@contextlib.contextmanager
def _shown_bars_lifted() -> Iterator[None]:
    """The bars on the screen cleared while a line prints, then drawn again below it.  tqdm's own
    ``external_write_mode`` draws every live bar afterwards, one still in its ``delay`` too: the
    first row of quick work drew a bar its close then never cleared (it counts a bar as drawn by
    its updates alone), and it stayed on the summary's line.  A bar not drawn yet is left alone."""
    with tqdm.get_lock():  # type: ignore[no-untyped-call]
        shown = [bar for bar in list(getattr(tqdm, "_instances", ())) if _drawn(bar)]
        for bar in shown:
            bar.clear(nolock=True)
        try:
            yield
        finally:
            for bar in shown:
                bar.refresh(nolock=True)


def _drawn(bar: tqdm[Any]) -> bool:
    """Whether ``bar`` is on the screen: tqdm's own test when it closes one (its delay passed by
    the last time an update drew it)."""
    return not bar.disable and getattr(bar, "last_print_t", -1.0) >= bar.start_t + (bar.delay or 0.0)


def _show_progress() -> bool:
    return sys.stderr is not None and sys.stderr.isatty()  # None: closed before the start


def _screen() -> tuple[int | None, int | None]:
    """The bar's screen (columns, lines) where the terminal reports none (0 x 0, as some do):
    tqdm took that for a screen with no room, and never drew the bar.  (None, None) where it has
    one: tqdm asks it."""
    try:
        size = os.get_terminal_size(sys.stderr.fileno())
    except (OSError, ValueError, AttributeError):
        return None, None
    return (None, None) if size.columns > 0 and size.lines > 0 else (80, 24)


def progress(items: Iterable[_T], label: str, total: int | None = None) -> Iterator[_T]:
    """``items`` with a progress bar on stderr when it is a terminal; silent in pipes and CI."""
    yield from _tqdm(items, label, total)


def _tqdm(items: Iterable[Any] | None, label: str, total: int | None, **shape: Any) -> tqdm[Any]:
    """A bar on stderr, shown only on a terminal, gone when it closes, sized for the screen."""
    columns, lines = _screen()
    return tqdm(
        items,
        desc=label,
        total=total,
        file=sys.stderr,
        disable=not _show_progress(),
        leave=False,
        ncols=columns,
        nrows=lines,
        **shape,
    )


@dataclass(frozen=True)
class Bar:
    """A progress bar moved by its caller's own loop, not by a thread: ``run`` and ``bench`` fork
    their ranks, and a thread alive at a fork may leave a lock held in a child for good."""

    bar: tqdm[Any]

    def advance(self, note: str = "") -> None:
        """One step done; ``note`` says which."""
        self.bar.set_postfix_str(note, refresh=False)
        self.bar.update(1)

    def tick(self) -> None:
        """Nothing done yet: show the time spent (at most every tenth of a second)."""
        self.bar.update(0)

    def say(self, line: str) -> None:
        """Print ``line`` above the bar where the bar is shown (a terminal), nothing elsewhere: a
        step's result the moment it is known, where the command's report comes only at the end."""
        if not self.bar.disable:
            self.bar.write(printable(line), file=sys.stderr)


_COUNTED = "{desc}: {n_fmt}/{total_fmt} [{elapsed}]"
SHOW_AFTER = 1.0  # seconds of a command before its bars show: quick work shows none

_started: float | None = None  # time.monotonic() when the running command started; None: none runs


@contextlib.contextmanager
def command_clock(started: float | None = None) -> Iterator[None]:
    """Count the :data:`SHOW_AFTER` delay of the bars opened in the block from ``started`` (None:
    now), the start of their command: the user waits from the command's start, not from a step's,
    so a step begun later shows its bar at once, and quick commands still show none.  The group's
    clock starts before a command's module is imported (:mod:`stragglar.cli` imports it when the
    command runs), so those imports count too.  Inside an outer clock this one changes nothing."""
    global _started
    if _started is not None:
        yield
        return
    _started = time.monotonic() if started is None else started
    try:
        yield
    finally:
        _started = None


def _delay(after: float | None) -> float:
    """How long a bar opened now waits before it shows: ``after`` where the caller says, else what
    is left of the running command's :data:`SHOW_AFTER` (all of it outside a command)."""
    if after is not None:
        return after
    if _started is None:
        return SHOW_AFTER
    return max(0.0, SHOW_AFTER - (time.monotonic() - _started))


@contextlib.contextmanager
def progress_bar(
    total: int | None, label: str, after: float | None = None, slow: bool = False
) -> Iterator[Bar]:
    """A bar of ``total`` steps (None: the time spent alone) on stderr when it is a terminal, from
    ``after`` seconds on (None: once its command has run :data:`SHOW_AFTER`); silent in pipes and
    CI, and for quick work.
    ``slow`` steps (seconds to minutes each, a few of them) show the count and the time spent, not
    a rate or an estimate, which the first few steps cannot give ("2.00it/s" when each took 7 s)."""
    with _tqdm(
        None,
        label,
        total,
        delay=_delay(after),
        miniters=0,  # every update(0) may redraw
        bar_format="{desc}: {elapsed}" if total is None else _COUNTED if slow else None,
    ) as bar:
        yield Bar(bar)


def ticking(items: Sequence[_T], label: str) -> Iterator[_T]:
    """``items`` with a counted bar whose clock moves while an item takes its time (a thread
    ticks it): for a few items of seconds each, where :func:`progress` stood still (``whatif``
    on one group of 800,000 rows showed 0/1 for 12 s).  Not for commands that fork."""
    if not _show_progress():
        yield from items
        return
    with progress_bar(len(items), label, slow=True) as bar, _ticked(bar):
        for item in items:
            yield item
            bar.advance()


@contextlib.contextmanager
def _ticked(bar: Bar) -> Iterator[None]:
    """``bar``'s clock moved by a thread while the block runs (nothing done yet shows as time)."""
    done = threading.Event()

    def tick() -> None:
        while not done.wait(0.2):
            bar.tick()

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(1.0)


@contextlib.contextmanager
def busy(label: str, after: float | None = None) -> Iterator[None]:
    """Show ``label`` and the time spent on stderr for work that outlasts ``after`` seconds (None:
    what is left of its command's :data:`SHOW_AFTER`), when stderr is a terminal; nothing in pipes
    and CI, and nothing for quick work."""
    if not _show_progress():
        yield
        return
    with progress_bar(None, label, after) as bar, _ticked(bar):  # its clock starts now, shown from `after` on
        yield
