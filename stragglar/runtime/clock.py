"""The host's clock: when a rank did what (:class:`Timeline`), and how the host waits.

Every executor reports a rank's call as a :class:`Timeline` in ``time.perf_counter`` seconds, so
that runs on any engine compare.  The host waits in two ways: until a moment
(:func:`sleep_until`: the late rank's arrival), or, for work it cannot wait on with a timeout
(NCCL's work, CUDA's events), by looking until it is done (:func:`poll`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from stragglar.args import as_real
from stragglar.errors import InputError, described

__all__ = ["POLL", "Timeline", "poll", "sleep_until"]


@dataclass(frozen=True, slots=True)
class Timeline:
    """When one rank did what, in ``time.perf_counter`` seconds (one clock for all processes of a
    host).  ``phase_done[i]`` is when it finished phase ``i`` (None: not in that phase); on a GPU
    these are host-side issue times."""

    rank: int
    start: float
    arrived: float
    phase_done: tuple[float | None, ...]
    done: float


def sleep_until(moment: float) -> float:
    """Sleep until ``time.perf_counter()`` reaches ``moment`` (not at all if it has: a zero sleep
    is still a system call), and return the time then."""
    left = moment - time.perf_counter()
    if left > 0:
        time.sleep(left)
    return time.perf_counter()


POLL = 1e-4  # seconds between two looks at work the host cannot wait on with a timeout


def poll(ready: Callable[[], bool], timeout: float | None, spin: float = 0.0) -> bool:
    """Look at ``ready()`` until it is true (True) or ``timeout`` seconds have passed (False; None:
    no bound): without sleeping for the first ``spin`` seconds (where the moment it turns true is
    the figure being measured), then every :data:`POLL` seconds, leaving the cores to others.
    What NCCL's work and CUDA's events offer instead of a wait with a timeout.

    A timeout that has passed (0, or below: what is left of a deadline) looks once; a NaN is
    refused, as no wait ever passed it (it looked forever).
    """
    if timeout is not None and math.isnan(as_real(timeout, "timeout", "seconds")):
        raise InputError(f"timeout must be a number of seconds or None, got {described(timeout)}")
    begun = time.monotonic()
    while not ready():
        waited = time.monotonic() - begun
        if timeout is not None and waited > timeout:
            return False
        time.sleep(0 if waited < spin else POLL)
    return True
