"""The device program: the flat table each rank's persistent kernel reads, and what it means.

A rank's kernel walks its rows in order, every thread block over its own share of every chunk
(block ``b`` of ``B`` takes the ``b``-th of ``B`` near-equal parts of each chunk, on every rank
alike, each starting at a whole packet's elements: a float16 part at an even element), so the
blocks of one rank never touch each other's elements and need no barrier between them.  A
transfer moves one of three ways:

* *staged*: the sender writes its chunk into a slot of the receiver's *inbox* (memory of the
  receiver's that only this one write fills in a call), then raises a flag in the receiver's
  memory; the receiver waits for the flag, then copies or adds the slot into its chunk.  The slot
  keeps the value of the sender's round however late the receiver comes, so nothing orders the
  sender's later writes after the receiver's read;
* *direct*: no inbox.  A copy is *pushed* (the sender writes its chunk straight into the
  receiver's chunk, then raises the flag; the receiver only waits), or a copy or a sum is
  *pulled* (the sender raises the flag; the receiver waits, then reads the sender's chunk by
  pointer and sets or adds it into its own).  It moves each element once instead of twice, but
  it is safe only where the schedule's own messages already order the receiver's last use of its
  chunk before a push, and the sender's next write of its chunk after a pull: the lowering
  chooses direct transfers only there, and the prover checks every access to every chunk;
* *packets*: the sender writes its chunk into a slot of the receiver's inbox as 8-byte packets,
  each 4 bytes of data and 4 of the call's number, in one store the hardware never splits; the
  receiver polls each packet until it carries this call's number, then copies or adds its data.
  No flag, no release and no acquire: a round costs one trip through memory instead of the
  data's, then the flag's, which is what small chunks wait for; it moves twice the bytes, so the
  lowering picks it only for small chunks.  A packet orders nothing but its own 4 bytes: it
  tells the receiver nothing of the sender's other writes, so a transfer that must be ordered
  after another access (a direct one's) cannot lean on packets.

The synchronous rounds of a schedule (every transfer reads the state from before its round) need
nothing more than that and the row order: a round's puts and pushes come before its landings.

Rows are eight integers (:data:`COLUMNS`):

* ``put``: copy chunk ``chunk`` of this rank's buffer into slot ``slot`` of rank ``peer``'s inbox;
* ``signal``: store :func:`flag_value` of (call, ``ordinal``, ``per_call``) into flag ``flag`` of
  rank ``peer`` (a release: the writes and reads before it are done for whoever sees the value);
* ``wait``: spin until this rank's flag ``flag`` holds at least that value (an acquire), a wait
  bounded by a clock; ``peer`` is the rank expected to set it (named if it never does);
* ``copy`` / ``reduce``: set / add inbox slot ``slot`` into chunk ``chunk`` of this rank's buffer
  (``buffer += received``: the interpreter's operands, so its bits);
* ``push``: copy chunk ``chunk`` of this rank's buffer into chunk ``chunk`` of rank ``peer``'s;
* ``pull`` / ``pull_reduce``: set / add chunk ``chunk`` of rank ``peer``'s buffer into chunk
  ``chunk`` of this rank's (``buffer += received`` again);
* ``put_packets``: write chunk ``chunk`` of this rank's buffer into slot ``slot`` of rank
  ``peer``'s inbox as packets marked with the call's number;
* ``copy_packets`` / ``reduce_packets``: wait for every packet of inbox slot ``slot`` to carry
  this call's number (each wait bounded by a clock; ``peer`` is the rank expected to write the
  slot, named if it never does), then set / add its data into chunk ``chunk``.

A slot holds packets or plain elements, never both in a call: the kernel sizes every slot for
packets where a program has any (:attr:`DeviceProgram.packets`).  A packet's mark is the low 32
bits of the call number: a slot is written once a call, so before this call's write it holds an
earlier call's mark (or zeros: a fresh inbox is zeroed), which differs from this call's for the
next 2**32 calls.

``round`` is the schedule's round (across phases) a row belongs to, for error reports.  A flag
is set ``per_call`` times a call, the ``ordinal``-th time to ``call * per_call + ordinal``
(ordinals 1..per_call; ``call`` the number each rank's kernel counts on the device, the same on
every rank as each runs every call): values only grow, call after call, so repeated calls and
graph replays need no reset, and a wait of this call is never satisfied by a value an earlier
call left.  The host waits for every rank's kernel of a call before it launches the next call's
(an inbox slot is rewritten by the next call).

The table's meaning is proved from its own contents by :mod:`~stragglar.runtime.device.prover`
before a program is first launched; the lowering that writes it
(:mod:`~stragglar.runtime.device.lowering`) is never consulted.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

__all__ = [
    "COLUMNS",
    "COPY",
    "COPY_PACKETS",
    "DIRECT",
    "OPS",
    "PACKETS",
    "PULL",
    "PULL_REDUCE",
    "PUSH",
    "PUT",
    "PUT_PACKETS",
    "REDUCE",
    "REDUCE_PACKETS",
    "SIGNAL",
    "WAIT",
    "DeviceProgram",
    "flag_value",
]

OPS = (
    "put",
    "signal",
    "wait",
    "copy",
    "reduce",
    "push",
    "pull",
    "pull_reduce",
    "put_packets",
    "copy_packets",
    "reduce_packets",
)
PUT, SIGNAL, WAIT, COPY, REDUCE, PUSH, PULL, PULL_REDUCE, PUT_PACKETS, COPY_PACKETS, REDUCE_PACKETS = range(
    len(OPS)
)
DIRECT = (PUSH, PULL, PULL_REDUCE)  # the ops that reach a peer's buffer
PACKETS = (PUT_PACKETS, COPY_PACKETS, REDUCE_PACKETS)  # the ops that move packets
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

    @functools.cached_property
    def direct(self) -> bool:
        """Whether any row reaches a peer's buffer (a launch must then give every rank's address);
        worked out once, as launches ask it every call."""
        return any(bool(np.isin(rows[:, 0], DIRECT).any()) for rows in self.rows if len(rows))

    @functools.cached_property
    def packets(self) -> bool:
        """Whether any row moves packets (every inbox slot is then sized for them)."""
        return any(bool(np.isin(rows[:, 0], PACKETS).any()) for rows in self.rows if len(rows))

    @functools.cached_property
    def rank_phases(self) -> tuple[tuple[bool, ...], ...]:
        """Whether each rank has rows in each phase: worked out once, as every call's timelines
        ask it (scanning the rows each call cost hundreds of microseconds a call at N = 8, C = 64)."""
        starts = np.asarray(self.phase_starts)
        phases = range(len(self.phases))
        rows_in = [set(np.searchsorted(starts, rows[:, 1], side="right").tolist()) for rows in self.rows]
        return tuple(tuple(phase + 1 in ranks for phase in phases) for ranks in rows_in)

    def phase_ends(self, rank: int, done: float) -> tuple[float | None, ...]:
        """A rank's :attr:`~stragglar.runtime.clock.Timeline.phase_done` when its kernel ended at
        ``done``: that time for every phase it has rows in, None for the others."""
        return tuple([done if has else None for has in self.rank_phases[rank]])

    def phase_round(self, round_index: int) -> tuple[str, int]:
        """A round across phases as (its phase's name, its number within the phase)."""
        phase = max(i for i, start in enumerate(self.phase_starts) if start <= round_index)
        return self.phases[phase], round_index - self.phase_starts[phase]
