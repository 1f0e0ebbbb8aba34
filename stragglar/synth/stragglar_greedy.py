"""StragglAR exchange rounds for any number of GPUs, by a latest-chunk-first greedy.

Same conventions as :mod:`stragglar.synth.stragglar_pow2`: the straggler is rank ``m = n-1``
and GPU ``t`` exchanges chunk ``t`` with it in round ``t``.  The last chunks are the hard ones
(they finish latest and must still reach every GPU by doubling), so chunks are placed from the
last to the first into a fixed number of rounds, each spreading as fast as the still-free ports
allow.  Receivers whose free receive slots are scarce compared with their free send slots go
first, senders with many free send slots go first (the straggler last); ties are broken by a
seeded random order.  A chunk that does not fit is retried with fresh tie-breaks, then the
search backtracks into the later chunks (bounded); the caller falls back to one more round.
Chronological backtracking can thrash for thousands of placements when the bad choice lies
dozens of chunks back (n = 1023 stalls ~40 chunks before the end), so a search that has not
reached an earlier chunk for a while jumps back further, each time twice as far.

A round is feasible exactly when no chunk has more receivers than free holders, since any
holder may feed any GPU that lacks the chunk; so chunks interact only through port usage,
which is what makes placing them one at a time sound.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

__all__ = ["greedy_copy_rounds"]

Copy = tuple[int, int, int]  # (src, dst, chunk)
Placement = list[tuple[int, int, int]]  # (round, src, dst)

RETRIES_PER_CHUNK = 4
# Placements without reaching an earlier chunk before the search jumps back; above the longest
# such stretch of any search that succeeded with plain backtracking (under 1000 for n <= 300),
# so those searches, and their schedules, are unchanged.
STALL_ATTEMPTS = 2048
FIRST_JUMP = 16  # chunks undone past the earliest one reached, at the first jump


@dataclass
class _Ports:
    """Which ranks can still send / receive in each round, and how many such slots each has left.

    Free ranks are kept as sets because most rounds are nearly full: intersecting a chunk's
    holders or needers with them costs the size of the smaller set.
    """

    n: int
    num_rounds: int
    send_free: list[set[int]] = field(init=False)
    recv_free: list[set[int]] = field(init=False)
    sends_left: list[int] = field(init=False)
    recvs_left: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.send_free = [set(range(self.n)) for _ in range(self.num_rounds)]
        self.recv_free = [set(range(self.n)) for _ in range(self.num_rounds)]
        self.sends_left = [self.num_rounds] * self.n
        self.recvs_left = [self.num_rounds] * self.n

    def take(self, t: int, pairs: list[tuple[int, int]]) -> None:
        send_free, recv_free = self.send_free[t], self.recv_free[t]
        for src, dst in pairs:
            send_free.remove(src)
            recv_free.remove(dst)
            self.sends_left[src] -= 1
            self.recvs_left[dst] -= 1

    def give_back(self, placement: Placement) -> None:
        for t, src, dst in placement:
            self.send_free[t].add(src)
            self.recv_free[t].add(dst)
            self.sends_left[src] += 1
            self.recvs_left[dst] += 1


def greedy_copy_rounds(n: int, num_rounds: int, max_attempts: int) -> list[list[Copy]] | None:
    """Copies for each of ``num_rounds`` rounds, or None if the search gives up.

    Chunks are placed last to first; a chunk that does not fit is retried with fresh
    tie-breaks, and when its retries run out the previous (later) chunk is undone and placed
    again: a depth-first search bounded by ``max_attempts`` chunk placements in all (a
    deterministic budget, unlike a time limit).  After ``STALL_ATTEMPTS`` placements without
    reaching an earlier chunk it jumps back past the earliest one reached.  Seeded from ``n``
    and ``num_rounds``, so the output is deterministic.

    >>> rounds = greedy_copy_rounds(6, 7, max_attempts=5)
    >>> len(rounds), sum(map(len, rounds))
    (7, 20)
    """
    m = n - 1
    ports = _Ports(n, num_rounds)
    for t in range(min(m, num_rounds)):  # the exchange rounds
        ports.take(t, [(t, m), (m, t)])
    rng = random.Random(n * 1_000_003 + num_rounds)
    placements: dict[int, Placement] = {}
    tries = [0] * m
    chunk = m - 1
    earliest, stalled, jump = m - 1, 0, FIRST_JUMP
    for _ in range(max_attempts):
        tries[chunk] += 1
        stalled += 1
        placement = _place_chunk(chunk, ports, [rng.random() for _ in range(n)])
        if placement is not None:
            placements[chunk] = placement
            if chunk == 0:
                return _by_round(placements, num_rounds)
            chunk -= 1
            tries[chunk] = 0
            if chunk < earliest:
                earliest, stalled, jump = chunk, 0, FIRST_JUMP
        elif stalled >= STALL_ATTEMPTS:  # thrashing: place the chunks from earliest + jump again
            while chunk < min(m - 1, earliest + jump):
                chunk += 1
                ports.give_back(placements.pop(chunk))
            tries[chunk] = 0
            stalled, jump = 0, 2 * jump
        elif tries[chunk] >= RETRIES_PER_CHUNK:
            chunk += 1  # undo later chunks until one has tie-breaks left to try
            while chunk < m and tries[chunk] >= RETRIES_PER_CHUNK:
                ports.give_back(placements.pop(chunk))
                chunk += 1
            if chunk == m:
                return None
            ports.give_back(placements.pop(chunk))
    return None


def _by_round(placements: dict[int, Placement], num_rounds: int) -> list[list[Copy]]:
    rounds: list[list[Copy]] = [[] for _ in range(num_rounds)]
    for c, placement in placements.items():
        for t, src, dst in placement:
            rounds[t].append((src, dst, c))
    return rounds


def _place_chunk(chunk: int, ports: _Ports, order: list[float]) -> Placement | None:
    """Spread ``chunk`` from its two holders to every GPU as early as free ports allow.

    Takes the ports it uses; on failure gives them back and returns None.  The sort keys are
    kept as one float per rank (slots balance plus the tie-break in [0, 1)), updated as ports
    are taken, and only as many receivers as there are senders are selected.
    """
    straggler = ports.n - 1
    holders = {chunk, straggler}
    needs = set(range(straggler)) - {chunk}
    recv_key = [r - s + o for r, s, o in zip(ports.recvs_left, ports.sends_left, order, strict=True)]
    send_key = [o - s for s, o in zip(ports.sends_left, order, strict=True)]
    send_key[straggler] += ports.n * ports.num_rounds  # the straggler helps last
    placement: Placement = []
    for t in range(chunk + 1, ports.num_rounds):
        if not needs:
            break
        candidates = needs & ports.recv_free[t]
        if not candidates:
            continue
        senders = sorted(holders & ports.send_free[t], key=send_key.__getitem__)
        receivers = sorted(candidates, key=recv_key.__getitem__)[: len(senders)]
        pairs = list(zip(senders, receivers, strict=False))
        ports.take(t, pairs)
        for src, dst in pairs:
            send_key[src] += 1
            recv_key[src] += 1
            recv_key[dst] -= 1
            placement.append((t, src, dst))
            holders.add(dst)
            needs.discard(dst)
        if len(needs) > len(holders) * ((1 << min(ports.num_rounds - 1 - t, 62)) - 1):
            break  # even doubling every remaining round cannot reach them all
    if needs:
        ports.give_back(placement)
        return None
    return placement
