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
    root = ET.fromstring(xml)
    n, c = int(root.get("ngpus", "0")), int(root.get("nchunksperloop", "0"))
    cap = 2 if root.get("proto") == "Simple" else 8
    inputs = [[rng.getrandbits(64) for _ in range(c)] for _ in range(n)]
    mem: dict[int, dict[str, list[int]]] = {}
    tbs: list[dict[str, Any]] = []
    for gpu in root.iter("gpu"):
        g = int(gpu.get("id", "0"))
        garbage = [rng.getrandbits(64) for _ in range(int(gpu.get("s_chunks", "0")))]
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
    fifo: dict[tuple[str | None, int, int], deque[int]] = {}

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
            value = (value + mem[g][src[0]][src[1]]) & MASK
        if kind == "re":
            value = (value + mem[g][dst[0]][dst[1]]) & MASK
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
    sums = [sum(inputs[g][k] for g in range(n)) & MASK for k in range(c)]
    return finished, all(mem[g]["i"][k] == sums[k] for g in range(n) for k in range(c))
