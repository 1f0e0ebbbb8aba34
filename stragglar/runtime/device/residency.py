"""The blocks of a GPU that this process's device kernels hold at once.

Every block of a rank's kernel spins on its peers' flags, so a call runs only if all of its
blocks are resident at once, with its peers'.  A call's blocks are sized so that it fits the
device alone (:func:`~stragglar.runtime.device.loopback.blocks_for`); calls launched before
earlier ones end (``async_op``: the DDP hook launches each bucket's as soon as it is ready) could
together want more than the device holds, and then the device may run part of each: on two GPUs
in different orders, each waits for blocks queued behind the other until its timeout.  So a call
holds its blocks in :data:`RESIDENT` from its launch until its kernel has ended (seen through an
event recorded after it, not through the caller's wait, which may come after the next launch),
and a launch with no room waits, bounded, for kernels before it to end.

Only this process's calls are counted.  Ranks in other processes that share the GPU time-slice
with these (their kernels take turns), as the group's ranks do when several share one GPU.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from stragglar.runtime.failures import RankError

__all__ = ["POLL_S", "RESIDENT", "Held", "Residency"]

POLL_S = 0.001  # how often a launch with no room looks again whether a kernel before it ended


@dataclass(eq=False)
class Held:
    """A call's blocks on a GPU: ``ended`` says whether its kernel has ended (None: not launched
    yet, or only its caller's release ends the hold)."""

    blocks: int
    ended: Callable[[], bool] | None = None

    def running(self) -> bool:
        return self.ended is None or not self.ended()


class Residency:
    """The blocks each GPU's kernels of this process hold, by device number."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._held: dict[int, list[Held]] = {}

    def held(self, device: int) -> int:
        """The blocks held on ``device`` now, by kernels that have not ended."""
        with self._changed:
            return sum(h.blocks for h in self._running(device))

    def hold(self, device: int, blocks: int, resident: int, timeout: float, rank: int | None = None) -> Held:
        """Hold ``blocks`` of the ``resident`` blocks ``device`` runs at once for a call (rank
        ``rank``'s; None: every rank's, in one process), once the kernels before it leave room,
        waiting at most ``timeout`` seconds: past it, a
        :class:`~stragglar.runtime.failures.RankError`.  The caller sets the hold's ``ended`` once
        it has launched, or releases it."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while sum(h.blocks for h in self._running(device)) + blocks > resident:
                left = deadline - time.monotonic()
                if left <= 0:
                    held = sum(h.blocks for h in self._running(device))
                    who = "the call" if rank is None else f"rank {rank}"
                    raise RankError(
                        f"allreduce failed: {who} timed out waiting for room on GPU {device}: the "
                        f"device calls in flight hold {held} of the {resident} blocks it runs at "
                        f"once, and this call needs {blocks}",
                        rank=rank,
                        reason="timed out",
                        during="waiting for room on the GPU",
                    )
                self._changed.wait(min(left, POLL_S))  # a kernel's end is seen by polling
            mine = Held(blocks)
            self._held.setdefault(device, []).append(mine)
            return mine

    def release(self, device: int, held: Held) -> None:
        """End ``held`` on ``device`` (its kernel has ended, or was never launched)."""
        with self._changed:
            holds = self._held.get(device, [])
            if held in holds:
                holds.remove(held)
            self._changed.notify_all()

    def _running(self, device: int) -> list[Held]:
        """The holds on ``device`` whose kernels have not ended (the others are let go)."""
        holds = self._held.setdefault(device, [])
        holds[:] = [h for h in holds if h.running()]
        return holds


RESIDENT = Residency()  # this process's
