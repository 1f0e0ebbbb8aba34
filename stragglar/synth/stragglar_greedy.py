"""StragglAR exchange rounds for any number of GPUs, by a latest-chunk-first greedy.

Same conventions as :mod:`stragglar.synth.stragglar_pow2`: the straggler is rank ``m = n-1``
and GPU ``t`` exchanges chunk ``t`` with it in round ``t``.  The last chunks are the hard ones
(they finish latest and must still reach every GPU by doubling), so chunks are placed from the
last to the first into a fixed number of rounds, each spreading as fast as the still-free ports
allow.  Receivers whose free receive slots are scarce compared with their free send slots go
first; ties are broken by a seeded random order, and the caller tries several seeds.
"""

from __future__ import annotations

import random

__all__ = ["greedy_copy_rounds"]

Copy = tuple[int, int, int]  # (src, dst, chunk)


def greedy_copy_rounds(n: int, num_rounds: int, seed: int) -> list[list[Copy]] | None:
    """Copies for each of ``num_rounds`` rounds, or None if this seed does not fit them in.

    >>> rounds = greedy_copy_rounds(6, 7, seed=0)
    >>> len(rounds), sum(map(len, rounds))
    (7, 20)
    """
    m = n - 1
    straggler = m
    rng = random.Random(seed)
    order = [rng.random() for _ in range(n)]
    send_free = [bytearray(b"\x01" * n) for _ in range(num_rounds)]
    recv_free = [bytearray(b"\x01" * n) for _ in range(num_rounds)]
    free_sends, free_recvs = [num_rounds] * n, [num_rounds] * n
    for t in range(min(m, num_rounds)):  # the exchange rounds
        for x in (t, straggler):
            send_free[t][x] = recv_free[t][x] = 0
            free_sends[x] -= 1
            free_recvs[x] -= 1
    rounds: list[list[Copy]] = [[] for _ in range(num_rounds)]
    for chunk in reversed(range(m)):
        holders = [chunk, straggler]
        needs = set(range(m)) - {chunk}
        for t in range(chunk + 1, num_rounds):
            if not needs:
                break
            senders = [x for x in holders if send_free[t][x]]
            receivers = [x for x in needs if recv_free[t][x]]
            receivers.sort(key=lambda x: (free_recvs[x] - free_sends[x], order[x]))
            senders.sort(key=lambda x: (x == straggler, -free_sends[x], order[x]))
            for src, dst in zip(senders, receivers, strict=False):
                send_free[t][src] = recv_free[t][dst] = 0
                free_sends[src] -= 1
                free_recvs[dst] -= 1
                rounds[t].append((src, dst, chunk))
                holders.append(dst)
                needs.discard(dst)
        if needs:
            return None
    return rounds
