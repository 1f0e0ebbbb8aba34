"""The device program: the flat table each rank's persistent kernel reads, and what it means.

A rank's kernel walks its rows in order, every thread block over its own share of every chunk
(block ``b`` of ``B`` takes the ``b``-th of ``B`` near-equal parts of each chunk, on every rank
alike), so the blocks of one rank never touch each other's elements and need no barrier between
them.  Data moves by *push*: a rank writes a chunk of its buffer into a slot of a peer's *inbox*
(memory of the peer's that only this one write fills in a call), then raises a flag in the peer's
memory; the peer waits for the flag, then copies or adds the slot into its chunk.  A rank's own
buffer is touched by itself only, so the synchronous rounds of a schedule (every transfer reads
the state from before its round) need nothing more than the row order: a round's puts come before
its landings.

Rows are eight integers (:data:`COLUMNS`):

* ``put``: copy chunk ``chunk`` of this rank's buffer into slot ``slot`` of rank ``peer``'s inbox;
* ``signal``: store :func:`flag_value` of (call, ``ordinal``, ``per_call``) into flag ``flag`` of
  rank ``peer`` (a release: the puts before it are visible to whoever sees the value);
* ``wait``: spin until this rank's flag ``flag`` holds at least that value (an acquire), a wait
  bounded by a clock; ``peer`` is the rank expected to set it (named if it never does);
* ``copy`` / ``reduce``: set / add inbox slot ``slot`` into chunk ``chunk`` of this rank's buffer
  (``buffer += received``: the interpreter's operands, so its bits).

``round`` is the schedule's round (across phases) a row belongs to, for error reports.  A flag
is set ``per_call`` times a call, the ``ordinal``-th time to ``call * per_call + ordinal``
(ordinals 1..per_call): values only grow, call after call, so repeated calls and graph replays
need no reset, and a wait of this call is never satisfied by a value an earlier call left.  The
host waits for every rank's kernel of a call before it launches the next call's (an inbox slot
is rewritten by the next call).

The table's meaning is proved from its own contents by :mod:`~stragglar.runtime.device.prover`
before a program is first launched; the lowering that writes it
(:mod:`~stragglar.runtime.device.lowering`) is never consulted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["COLUMNS", "COPY", "OPS", "PUT", "REDUCE", "SIGNAL", "WAIT", "DeviceProgram", "flag_value"]

OPS = ("put", "signal", "wait", "copy", "reduce")
PUT, SIGNAL, WAIT, COPY, REDUCE = range(len(OPS))
COLUMNS = ("op", "round", "peer", "chunk", "slot", "flag", "ordinal", "per_call")


def flag_value(call: int, ordinal: int, per_call: int) -> int:
    """The value a flag set ``per_call`` times a call holds after its ``ordinal``-th setting in
    call number ``call`` (calls count from 1): what the kernel stores and waits for."""
    return call * per_call + ordinal


@dataclass(frozen=True, eq=False)
class DeviceProgram:
    """Every rank's rows (``rows[rank]``: an int64 array of shape (rows, 8), :data:`COLUMNS`),
    the inbox slots each rank holds (each as large as the largest chunk), the flags each rank
    holds (per thread block), and the schedule's names for its rounds (``phases``, and the index
    of each phase's first round), for error reports."""

    num_ranks: int
    num_chunks: int
    late_rank: int
    flags: int
    inbox_slots: tuple[int, ...]
    rows: tuple[np.ndarray, ...]
    phases: tuple[str, ...]
    phase_starts: tuple[int, ...]

    def phase_ends(self, rank: int, done: float) -> tuple[float | None, ...]:
        """A rank's :attr:`~stragglar.runtime.clock.Timeline.phase_done` when its kernel ended at
        ``done``: that time for every phase it has rows in, None for the others."""
        rounds = {int(r) for r in self.rows[rank][:, 1]}
        ends = [
            max((i for i, start in enumerate(self.phase_starts) if start <= r), default=0) for r in rounds
        ]
        return tuple(done if phase in ends else None for phase in range(len(self.phases)))

    def phase_round(self, round_index: int) -> tuple[str, int]:
        """A round across phases as (its phase's name, its number within the phase)."""
        phase = max(i for i, start in enumerate(self.phase_starts) if start <= round_index)
        return self.phases[phase], round_index - self.phase_starts[phase]
