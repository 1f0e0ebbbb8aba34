"""Round-optimal StragglAR exchange rounds for a power-of-two number of GPUs, by construction.

Notation: ``m = n - 1`` non-stragglers, the straggler is rank ``m``, ``L = log2 n``.  Round
``t < m`` is GPU ``t``'s exchange with the straggler, which completes chunk ``t``.  The copy
rounds around those exchanges come in three stretches:

* ramp-up (rounds ``1..L-1``): every holder of a finished chunk copies it to a GPU that holds
  nothing yet, so chunk ``c`` has ``2**(t-1-c)`` holders at round ``t``;
* steady state (rounds ``L..m-1``): the GPUs form groups ``G_1..G_L``, ``G_j`` being the
  ``2**(j-1)`` holders of chunk ``t-j`` (the "age j" chunk).  Each member of ``G_L`` other than
  the busy GPU swaps with one member of a younger group: it gives chunk ``t-L`` (which is then
  complete everywhere) and takes that member's chunk, joining its group.  Every GPU therefore
  receives chunks in increasing order, each exactly once.  The only choice is which young group
  each ``G_L`` member joins; it fixes when the member is back in ``G_L``, and a GPU must be in
  ``G_L`` at its own exchange round, which we ensure by choosing its delay;
* tail (``L-1`` rounds after the last exchange): the straggler joins as a holder of everything
  and the groups, of sizes 1 (+ straggler), 2, 4, ..., ``2**(L-1)``, are laid on a hypercube;
  round ``r`` swaps across dimension ``L-r``.

The total is ``m + L - 1 = n - 2 + log2 n`` rounds, the lower bound; every GPU sends and
receives in every round of the steady state and tail, which is why the bound is tight.
"""

from __future__ import annotations

__all__ = ["pow2_copy_rounds"]

Copy = tuple[int, int, int]  # (src, dst, chunk)


def pow2_copy_rounds(n: int) -> list[list[Copy]]:
    """Copies for each exchange round (straggler = rank n-1, GPU t exchanges in round t).

    >>> [len(r) for r in pow2_copy_rounds(8)]
    [0, 1, 3, 6, 6, 6, 6, 7, 7]
    """
    if n < 4 or n & (n - 1):
        raise ValueError(f"pow2_copy_rounds needs a power of two >= 4, got {n}")
    L = n.bit_length() - 1
    m = n - 1
    holders: dict[int, list[int]] = {}
    rounds = _ramp_up(L, m, holders)
    rounds += [_steady_round(t, L, holders) for t in range(L, m)]
    return rounds + _tail(L, m, holders)


def _ramp_up(L: int, m: int, holders: dict[int, list[int]]) -> list[list[Copy]]:
    fresh = iter(range(L, m))  # GPUs 1..L-1 stay empty until their own exchange
    rounds: list[list[Copy]] = []
    for t in range(L):
        copies: list[Copy] = []
        for c in range(t):
            for h in list(holders[c]):
                r = next(fresh)
                copies.append((h, r, c))
                holders[c].append(r)
        holders[t] = [t]
        rounds.append(copies)
    return rounds


def _steady_round(t: int, L: int, holders: dict[int, list[int]]) -> list[Copy]:
    old = holders.pop(t - L)
    if t not in old:  # pragma: no cover - the delay rule below guarantees it
        raise AssertionError(f"GPU {t} is not in the oldest group at its exchange round")
    ages = _join_ages(t, L, [x for x in old if x != t])
    copies: list[Copy] = []
    for j in range(1, L):
        chunk = t - j
        joiners = sorted(x for x, age in ages.items() if age == j)
        for member, joiner in zip(sorted(holders[chunk]), joiners, strict=True):
            copies += [(member, joiner, chunk), (joiner, member, t - L)]
        holders[chunk] = holders[chunk] + joiners
    holders[t] = [t]
    return copies


def _join_ages(t: int, L: int, members: list[int]) -> dict[int, int]:
    """Which young group (age j, 2**(j-1) places) each oldest-group member joins.

    Joining age j brings the GPU back to the oldest group L-j rounds later, so a GPU whose
    exchange is in round t+d (d < L) joins age L-d and is back exactly in time; the others fill
    the remaining places, and never overshoot since their exchange is L or more rounds away.
    """
    places = {j: 1 << (j - 1) for j in range(1, L)}
    ages: dict[int, int] = {}
    for x in members:
        if t < x < t + L:
            ages[x] = L - (x - t)
            places[ages[x]] -= 1
    free = sorted((x for x in members if x not in ages), reverse=True)
    for j, amount in places.items():
        for _ in range(amount):
            ages[free.pop()] = j
    return ages


def _tail(L: int, m: int, holders: dict[int, list[int]]) -> list[list[Copy]]:
    node = {m: 0, m - 1: 1}  # the straggler and the last chunk's owner share item 1
    for j in range(2, L + 1):
        node.update({x: (1 << (j - 1)) + i for i, x in enumerate(sorted(holders[m - j]))})
    gpu = {v: k for k, v in node.items()}

    def item(position: int) -> int:
        """Chunk held by a hypercube node, from its position inside the current sub-cube."""
        return m - max(1, position.bit_length())

    rounds: list[list[Copy]] = []
    for r in range(1, L):
        k = L - r
        copies: list[Copy] = []
        for upper in range(1 << k, 1 << L):
            if upper >> k & 1:
                lower = upper - (1 << k)
                if gpu[lower] != m:  # the straggler needs nothing
                    copies.append((gpu[upper], gpu[lower], m - (k + 1)))
                copies.append((gpu[lower], gpu[upper], item(lower % (1 << k))))
        rounds.append(copies)
    return rounds
