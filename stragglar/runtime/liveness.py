"""A rank's liveness: tell the process that launched it that it is still making progress.

A launcher (:func:`stragglar.measure.launch.launch`) gives up on a rank that stays silent for
longer than its timeout plus some slack, so that a hung rank does not hang the run; a long,
healthy run stays alive by beating as it goes.  Whatever runs in a rank beats (the benchmark's
iterations, the DDP hook's steps), so the heartbeat lives here, below both, and the launcher only
connects it: in a forked rank it hands over its pipe with :func:`connect_launcher`, and sends its
own messages with :func:`send_to_launcher`, never in the middle of a beat from another thread.
Outside a launched rank nothing is connected and :func:`heartbeat` does nothing.
"""

from __future__ import annotations

import threading
import time
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["connect_launcher", "heartbeat", "send_to_launcher"]

_BEAT_EVERY = 0.2  # seconds between heartbeats actually sent

_pipe: Connection | None = None  # in a launched rank: its pipe to the launcher
_lock = threading.RLock()
_last = 0.0


def connect_launcher(pipe: Connection) -> None:
    """In a rank the launcher forked: send heartbeats to the launcher on ``pipe``."""
    global _pipe
    _pipe = pipe


def send_to_launcher(pipe: Connection, message: tuple[str, Any]) -> None:
    """Send ``message`` to the launcher on ``pipe``, never in the middle of a heartbeat."""
    with _lock:
        pipe.send(message)


def heartbeat() -> None:
    """Tell the launcher this rank is making progress; outside a launched rank, nothing.

    Call it once per iteration (or more often: beats closer together than 0.2 s are not sent).
    The launcher gives up on a rank silent for longer than its ``timeout + slack``.
    """
    global _last
    pipe = _pipe
    if pipe is None:
        return
    now = time.monotonic()
    with _lock:
        if now - _last >= _BEAT_EVERY:
            _last = now
            pipe.send(("beat", None))
