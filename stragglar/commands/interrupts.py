"""Ctrl-C during a z3 call: z3 is asked to stop, so that the command ends at once with "Aborted!"."""

from __future__ import annotations

import contextlib
import functools
import os
import select
import signal
import socket
import sys
import threading
from collections.abc import Iterator
from typing import Any

import click

__all__ = ["ctrl_c_stops_z3", "stopping_z3"]


@contextlib.contextmanager
def ctrl_c_stops_z3() -> Iterator[None]:
    """Ctrl-C stops a z3 call as well as Python code, and ends the command with "Aborted!" (130).

    Python runs its SIGINT handler between bytecodes, and z3's ``check()`` is one C call that can
    last minutes: the handler would wait for it.  The signal also wakes a thread through
    :func:`signal.set_wakeup_fd`; that thread asks z3 to stop (``interrupt``, z3's own way),
    ``check()`` returns, and the KeyboardInterrupt follows at once.  z3's own Ctrl-C handling is
    turned off, everywhere: during ``check()`` it replaced Python's handler and let the signal go
    unanswered, and where SIGINT is ignored (a background job) it still cancelled the call, which
    then read as out of time (exit 3).
    A KeyboardInterrupt raised inside z3's Python glue comes out as another exception (ctypes'
    ArgumentError) or, inside a ``__del__``, not at all: after a Ctrl-C any exception is taken
    as the interrupt, and the thread signals again while the command still runs.  So is one raised
    when z3 returns from the interrupt before the handler has run (z3's "unknown" reads as out of
    time): the thread marks the interrupt before it stops z3.  Main thread only (where signals
    arrive), never around a command that forks, and not where SIGINT is ignored (a background job).
    """
    import z3

    z3.set_param("ctrl_c", False)  # always: where SIGINT is ignored, z3's handler would answer it
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.default_int_handler
    ):
        yield
        return
    interrupted = threading.Event()
    done = threading.Event()

    def on_ctrl_c(_signum: int, _frame: Any) -> None:
        interrupted.set()
        sys.unraisablehook = _quiet  # objects the interrupt left half-built complain when freed
        raise KeyboardInterrupt

    def watch() -> None:
        while not done.is_set():
            ready, _, _ = select.select([reader], [], [], 0.2)
            if ready and signal.SIGINT in reader.recv(64):
                interrupted.set()  # before z3 stops: its check() may return before our handler runs
                z3.main_ctx().interrupt()
            elif not ready and interrupted.is_set() and not done.is_set():
                z3.main_ctx().interrupt()  # z3 was between two check() calls, or the interrupt was lost
                os.kill(os.getpid(), signal.SIGINT)

    reader, writer = socket.socketpair()
    writer.setblocking(False)
    previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    previous_handler = signal.signal(signal.SIGINT, on_ctrl_c)
    thread = threading.Thread(target=watch, name="ctrl-c-stops-z3", daemon=True)
    thread.start()
    try:
        yield
    except Exception:
        if interrupted.is_set():
            raise KeyboardInterrupt from None
        raise
    finally:
        done.set()
        with contextlib.suppress(OSError):  # wake the watch now: its select would hold join 0.2 s
            writer.send(b"\0")  # not SIGINT's number: read as "look at done", not as a Ctrl-C
        signal.signal(signal.SIGINT, previous_handler)
        signal.set_wakeup_fd(previous_fd)
        thread.join(1.0)
        reader.close()
        writer.close()


def _quiet(_: Any) -> None:
    """An unraisable-exception hook that says nothing (the command is ending on a Ctrl-C)."""


def stopping_z3(command: click.Command) -> click.Command:
    """``command`` with :func:`ctrl_c_stops_z3` around its work."""
    work = command.callback
    assert work is not None

    @functools.wraps(work)
    def stopping(*args: Any, **kwargs: Any) -> Any:
        with ctrl_c_stops_z3():
            return work(*args, **kwargs)

    command.callback = stopping
    return command
