"""The share of a GPU that this process's device kernels hold at once.

Every block of a rank's kernel spins on its peers' flags, so a call runs only if all of its
blocks are resident at once, with its peers'.  A call's blocks are sized so that it fits the
device alone (:func:`~stragglar.runtime.device.loopback.blocks_for`); calls launched before
earlier ones end (``async_op``: the DDP hook launches each bucket's as soon as it is ready) could
together want more than the device holds, and then the device may run part of each: on two GPUs
in different orders, each waits for blocks queued behind the other until its timeout.  So a call
holds its blocks in :data:`RESIDENT` from its launch until its kernel has ended (seen through an
event recorded after it, not through the caller's wait, which may come after the next launch),
and a launch with no room waits, bounded, for kernels before it to end.

Kernels of other dtypes and tunings take other shares of the device (their registers decide how
many of their blocks fit), so a hold is the share of the device its blocks take: ``blocks`` of
the ``resident`` of that kernel it runs at once.  The shares held at once add up to 1 at most.

Only this process's calls are counted.  Ranks in other processes that share the GPU time-slice
with these (their kernels take turns), as the group's ranks do when several share one GPU.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction

from stragglar.runtime.clock import POLL
from stragglar.runtime.failures import RankError

__all__ = ["RESIDENT", "Held", "Residency"]


@dataclass(eq=False)
class Held:
    """A call's share of a GPU (its blocks over the blocks of its kernel the GPU runs at once):
    ``ended`` says whether its kernel has ended (None: not launched yet, or only its caller's
    release ends the hold)."""

    share: Fraction
    ended: Callable[[], bool] | None = None

    def running(self) -> bool:
        return self.ended is None or not self.ended()


class Residency:
    """The shares of each GPU its kernels of this process hold, by device number."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._held: dict[int, list[Held]] = {}

    def held(self, device: int) -> Fraction:
        """The share of ``device`` held now, by kernels that have not ended."""
        with self._changed:
            return self._share(device)

    def hold(self, device: int, blocks: int, resident: int, timeout: float, rank: int | None = None) -> Held:
        """Hold ``blocks`` of the ``resident`` blocks of its kernel ``device`` runs at once for a
        call (rank ``rank``'s; None: every rank's, in one process), once the kernels before it
        leave room, waiting at most ``timeout`` seconds: past it, a
        :class:`~stragglar.runtime.failures.RankError`.  The caller sets the hold's ``ended`` once
        it has launched, or releases it."""
        share = Fraction(blocks, resident)
        if share > 1:
            raise ValueError(f"a call of {blocks} blocks on a GPU that runs {resident} at once")
        deadline = time.monotonic() + timeout
        with self._changed:
            while self._share(device) + share > 1:
                left = deadline - time.monotonic()
                if left <= 0:
                    taken = self._share(device) * resident
                    who = "the call" if rank is None else f"rank {rank}"
                    raise RankError(
                        f"allreduce failed: {who} timed out waiting for room on GPU {device}: the "
                        f"device calls in flight take {float(taken):g} of the {resident} blocks of "
                        f"this kernel it runs at once, and this call needs {blocks}",
                        rank=rank,
                        reason="timed out",
                        during="waiting for room on the GPU",
                    )
                self._changed.wait(min(left, POLL))  # a kernel's end is seen by polling its event
            mine = Held(share)
            self._held.setdefault(device, []).append(mine)
            return mine

    @contextmanager
    def holding(self, device: int, blocks: int, resident: int, timeout: float) -> Iterator[None]:
        """:meth:`hold` for a call whose kernels all end inside the block (every rank's, in one
        process), released as it is left."""
        held = self.hold(device, blocks, resident, timeout)
        try:
            yield
        finally:
            self.release(device, held)

    def release(self, device: int, held: Held) -> None:
        """End ``held`` on ``device`` (its kernel has ended, or was never launched)."""
        with self._changed:
            holds = self._held.get(device, [])
            if held in holds:
                holds.remove(held)
            self._changed.notify_all()

    def _share(self, device: int) -> Fraction:
        """The share of ``device`` that kernels which have not ended hold (the others are let go)."""
        holds = self._held.setdefault(device, [])
        holds[:] = [h for h in holds if h.running()]
        return sum((h.share for h in holds), Fraction(0))


RESIDENT = Residency()  # this process's
