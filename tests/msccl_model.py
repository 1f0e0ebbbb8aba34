"""An independent numeric model of the MSCCL executor, for cross-checking stragglar's prover.

Shares no code with stragglar: ElementTree parsing, Python integers mod 2**64, one chunk per
move, a random enabled thread block per move, signals = position of the last hasdep step.
"""

from __future__ import annotations

import random
import xml.etree.ElementTree as ET
from collections import deque
from typing import Any

MASK = (1 << 64) - 1
STEP_ATTRS = ["s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep"]
RECV = ("r", "rrc", "rcs", "rrs", "rrcs")
SEND = ("s", "rcs", "rrs", "rrcs")


def run_numeric(xml: str, seed: int) -> tuple[bool, bool]:
    """Run ``xml`` once on random uint64 inputs, picking a random enabled thread block each move.

    Shares no code with stragglar: ElementTree, per-chunk moves, signals = last hasdep position.
    Returns (finished, every chunk on every GPU equals the true sum).
    """
    rng = random.Random(seed)
    finished, inputs, ends = _run(xml, rng, lambda g, k: rng.getrandbits(64), lambda a, b: (a + b) & MASK)
    n, c = len(inputs), len(inputs[0]) if inputs else 0
    sums = [sum(inputs[g][k] for g in range(n)) & MASK for k in range(c)]
    return finished, all(ends[g][k] == sums[k] for g in range(n) for k in range(c))


def run_orders(xml: str, seed: int) -> tuple[bool, bool]:
    """Run ``xml`` as :func:`run_numeric` does with each value the tree of its additions (a pair
    either way round: a + b and b + a are the same bits in floating point, a + 0 is a).  Returns
    (finished, every GPU ends each chunk added in one order): replicas with the same bits."""

    def add(a: Any, b: Any) -> Any:
        if a == 0 or b == 0:
            return b if a == 0 else a
        return tuple(sorted((a, b), key=repr))

    finished, inputs, ends = _run(xml, random.Random(seed), lambda g, k: ("in", g, k), add)
    n, c = len(inputs), len(inputs[0]) if inputs else 0
    return finished, all(ends[g][k] == ends[0][k] for g in range(n) for k in range(c))


def _run(
    xml: str, rng: random.Random, value_of: Any, add: Any
) -> tuple[bool, list[list[Any]], list[list[Any]]]:
    """The executor's moves in a random order: (finished, the inputs, each GPU's buffer at the
    end); ``value_of(g, k)`` is GPU g's input (or scratch, k negative) chunk k, ``add`` the sum."""
    root = ET.fromstring(xml)
    n, c = int(root.get("ngpus", "0")), int(root.get("nchunksperloop", "0"))
    cap = 2 if root.get("proto") == "Simple" else 8
    inputs = [[value_of(g, k) for k in range(c)] for g in range(n)]
    mem: dict[int, dict[str, list[Any]]] = {}
    tbs: list[dict[str, Any]] = []
    for gpu in root.iter("gpu"):
        g = int(gpu.get("id", "0"))
        garbage = [value_of(g, -1 - k) for k in range(int(gpu.get("s_chunks", "0")))]
        mem[g] = {"i": list(inputs[g]), "s": garbage}
        mem[g]["o"] = mem[g]["i"]  # in place
        for tb in gpu.iter("tb"):
            steps, pending = [], []
            for st in tb.iter("step"):
                a = {k: st.get(k, "") for k in STEP_ATTRS}
                if a["depid"] != "-1":
                    pending.append((int(a["depid"]), int(a["deps"])))
                if a["type"] != "nop":
                    steps.append((a, pending))
                    pending = []
            tbs.append(
                {
                    "g": g,
                    "id": int(tb.get("id", "0")),
                    "send": int(tb.get("send", "-1")),
                    "recv": int(tb.get("recv", "-1")),
                    "chan": tb.get("chan"),
                    "steps": steps,
                    "pc": 0,
                    "unit": 0,
                    "signal": -1,
                }
            )
    by_id = {(tb["g"], tb["id"]): tb for tb in tbs}
    fifo: dict[tuple[str | None, int, int], deque[Any]] = {}

    def enabled(tb: dict[str, Any]) -> bool:
        a, deps = tb["steps"][tb["pc"]]
        if tb["unit"] == 0 and any(by_id[tb["g"], d]["signal"] < s for d, s in deps):
            return False
        if a["type"] in RECV and not fifo.get((tb["chan"], tb["recv"], tb["g"])):
            return False
        out = fifo.get((tb["chan"], tb["g"], tb["send"]), deque())
        return not (a["type"] in SEND and len(out) >= cap)

    while True:
        live = [tb for tb in tbs if tb["pc"] < len(tb["steps"])]
        ready = [tb for tb in live if enabled(tb)]
        if not ready:
            break
        block = rng.choice(ready)
        a, _ = block["steps"][block["pc"]]
        g, u, kind = block["g"], block["unit"], a["type"]
        src, dst = (a["srcbuf"], int(a["srcoff"]) + u), (a["dstbuf"], int(a["dstoff"]) + u)
        value = fifo[block["chan"], block["recv"], g].popleft() if kind in RECV else 0
        if kind in ("s", "rrc", "rrs", "rrcs", "cpy", "re"):
            value = add(value, mem[g][src[0]][src[1]])
        if kind == "re":
            value = add(value, mem[g][dst[0]][dst[1]])
        if kind in ("r", "rrc", "rcs", "rrcs", "cpy", "re"):
            mem[g][dst[0]][dst[1]] = value
        if kind in SEND:
            fifo.setdefault((block["chan"], g, block["send"]), deque()).append(value)
        block["unit"] += 1
        if block["unit"] == int(a["cnt"]):
            block["unit"] = 0
            block["pc"] += 1
            if a["hasdep"] == "1":
                block["signal"] = int(a["s"])
    finished = not live and not any(fifo.values())
    return finished, inputs, [mem[g]["i"] for g in range(n)]


READS = ("s", "rrs", "rrc", "rrcs", "cpy", "re")
WRITES = ("r", "rcs", "rrc", "rrcs", "cpy", "re")


def unordered_accesses(xml: str) -> list[tuple[int, str, int]] | None:
    """Where two thread blocks of a GPU touch one chunk, one writing, with no path between the two
    accesses in the graph of one iteration's chunk moves: (gpu, buffer, offset) of each.  None if
    some dependency is never released.

    Shares no code with stragglar: ElementTree, an explicit graph (one node per chunk a step moves),
    reachability as bitsets.  Edges: program order in a thread block; a send's k-th chunk on a
    connection to the receiver's k-th; a dependency's releasing step (the first one with
    hasdep="1" at or after the step named) to the waiting step.  One iteration suffices: every edge
    but program order stays within an iteration.
    """
    root = ET.fromstring(xml)
    inplace = root.get("inplace") == "1"
    nodes: list[tuple[int, int, str, int]] = []  # (gpu, tb, type, unit)
    edges: list[tuple[int, int]] = []
    first: dict[tuple[int, int, int], int] = {}  # (gpu, tb, step) -> its first node
    last: dict[tuple[int, int, int], int] = {}
    waits: list[tuple[int, int, int, int, int]] = []  # (gpu, tb, step, depid, deps)
    hasdep: dict[tuple[int, int], list[tuple[int, bool]]] = {}  # (gpu, tb) -> (step, hasdep) of real steps
    sends: dict[tuple[str | None, int, int], list[int]] = {}
    recvs: dict[tuple[str | None, int, int], list[int]] = {}
    touches: dict[
        tuple[int, str, int], list[tuple[int, int, bool]]
    ] = {}  # (gpu, buf, off) -> (node, tb, write)
    for gpu in root.iter("gpu"):
        g = int(gpu.get("id", "0"))
        for tb in gpu.iter("tb"):
            t, chan = int(tb.get("id", "0")), tb.get("chan")
            previous, pending = None, []
            for st in tb.iter("step"):
                a = {k: st.get(k, "") for k in STEP_ATTRS}
                s, kind = int(a["s"]), a["type"]
                if a["depid"] != "-1":
                    pending.append((int(a["depid"]), int(a["deps"])))
                if kind == "nop":
                    continue
                waits.extend((g, t, s, d, p) for d, p in pending)
                pending = []
                hasdep.setdefault((g, t), []).append((s, a["hasdep"] == "1"))
                for unit in range(int(a["cnt"])):
                    node = len(nodes)
                    nodes.append((g, t, kind, unit))
                    first.setdefault((g, t, s), node)
                    last[g, t, s] = node
                    if previous is not None:
                        edges.append((previous, node))
                    previous = node
                    if kind in SEND:
                        sends.setdefault((chan, g, int(tb.get("send", "-1"))), []).append(node)
                    if kind in RECV:
                        recvs.setdefault((chan, int(tb.get("recv", "-1")), g), []).append(node)
                    used = [(a["srcbuf"], int(a["srcoff"]) + unit, False)] if kind in READS else []
                    if kind in WRITES:
                        used.append((a["dstbuf"], int(a["dstoff"]) + unit, True))
                    if kind == "re":
                        used.append((a["dstbuf"], int(a["dstoff"]) + unit, False))
                    for buf, off, write in used:
                        place = (g, "i" if buf == "o" and inplace else buf, off)
                        touches.setdefault(place, []).append((node, t, write))
    for connection, out in sends.items():
        edges.extend(zip(out, recvs.get(connection, []), strict=False))
    for g, t, s, d, p in waits:
        release = next((q for q, has in hasdep.get((g, d), []) if q >= p and has), None)
        if release is None:
            return None
        edges.append((last[g, d, release], first[g, t, s]))
    after = [1 << n for n in range(len(nodes))]  # each node and every node reachable from it
    successors: list[list[int]] = [[] for _ in nodes]
    indegree = [0] * len(nodes)
    for src, dst in edges:
        successors[src].append(dst)
        indegree[dst] += 1
    order = [n for n in range(len(nodes)) if not indegree[n]]
    for n in order:  # grows while it is read: Kahn's topological order
        for m in successors[n]:
            indegree[m] -= 1
            if not indegree[m]:
                order.append(m)
    for n in reversed(order):
        for m in successors[n]:
            after[n] |= after[m]
    unordered: set[tuple[int, str, int]] = set()
    for place, accesses in touches.items():
        for i, (x, tx, wx) in enumerate(accesses):
            for y, ty, wy in accesses[i + 1 :]:
                if tx != ty and (wx or wy) and not (after[x] >> y & 1 or after[y] >> x & 1):
                    unordered.add(place)
    return sorted(unordered)
