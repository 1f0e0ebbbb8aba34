"""An independent NumPy executor of MSCCL++ plans, used to judge mutated plans, and its own tests.

It shares nothing with ``stragglar.mscclpp``: it reads the JSON with plain dict access and runs the
ops on integer arrays (distinct random values for every execution, rank, chunk and element), op by op, blocks
interleaved at random, signals counted per connection as the executor pairs channels, and every
GPU runs the plan ``executions`` times back to back (its next execution starts when all its
blocks are done, with fresh inputs), so a put that lands in the previous or next execution's
memory shows up as a wrong sum.  It cannot see races inside an op or between the threads of a
block; the prover covers those.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import numpy as np
import pytest

from stragglar import mscclpp
from stragglar.mscclpp import check_plan, lower
from stragglar.synth import synthesize
from stragglar.verify import prove

Arr = np.ndarray[Any, np.dtype[np.int64]]
AnyArr = np.ndarray[Any, Any]  # run_plan's data: integers to prove sums, floats to show orders


class _Gpu:
    def __init__(
        self, gj: dict[str, Any], rng: np.random.Generator, elements: int, inplace: bool, dtype: np.dtype[Any]
    ) -> None:
        self.tbs = gj["threadblocks"]
        self.chans = [
            p for ch in gj["channels"] if ch["channel_type"] == "memory" for p in ch["connected_to"]
        ]
        self.remote = gj["remote_buffers"]
        self.sems = [s["init_value"] for s in gj.get("semaphores", [])]
        shape = (gj["input_chunks"], elements)
        garbage = (
            rng.integers(0, 1 << 40, size=(gj["scratch_chunks"], elements)),
            rng.integers(0, 1 << 40, size=shape),
        )
        self.buf: dict[str, Arr] = {"s": garbage[0].astype(dtype), "o": garbage[1].astype(dtype)}
        self.shape = shape
        self.inplace = inplace

    def start(self, values: Arr) -> None:
        fresh: Arr = values.copy()
        self.buf["i"] = fresh
        if self.inplace:
            self.buf["o"] = fresh

    def local_channels(self, tb: dict[str, Any]) -> list[int]:
        return [
            c for ch in tb.get("channels", []) if ch["channel_type"] == "memory" for c in ch["channel_ids"]
        ]

    def local_buffers(self, tb: dict[str, Any]) -> list[int]:
        refs = tb.get("remote_buffer_refs", [])
        return [b for r in refs if r["access_channel_type"] == "memory" for b in r["remote_buffer_ids"]]


def run_numpy(
    text: str, seed: int, executions: int = 2, elements: int = 2, late: int | None = None
) -> str | None:
    """None if every execution on every GPU ends with the right sums, else what went wrong.

    ``late``: a GPU that starts every execution only when no other GPU can go on (a straggler).
    """
    plan = json.loads(text)
    rng = np.random.default_rng(seed)
    # inputs: distinct values for every (execution, rank, chunk, element)
    shape = (executions, len(plan["gpus"]), plan["gpus"][0]["input_chunks"], elements)
    pool: Arr = rng.choice(1 << 40, size=int(np.prod(shape)), replace=False).reshape(shape)
    results = run_plan(text, pool, rng, late)
    if results is None:
        return "deadlock"
    for e in range(executions):
        want = pool[e].sum(axis=0)
        for g in range(shape[1]):
            if not np.array_equal(results[g][e], want):
                return f"execution {e}: GPU {g} ends with wrong sums"
    return None


def run_plan(
    text: str, pool: AnyArr, rng: np.random.Generator, late: int | None = None
) -> list[list[AnyArr]] | None:
    """Every GPU's output of every execution (``results[gpu][execution]``), or None for a deadlock:
    the plan run on ``pool`` (execution x GPU x chunk x element, in its own dtype)."""
    plan = json.loads(text)
    inplace = bool(plan["inplace"])
    executions, _, _, elements = pool.shape
    gpus = [_Gpu(gj, rng, elements, inplace, pool.dtype) for gj in plan["gpus"]]
    n = len(gpus)
    # connections: the k-th memory channel g->h meets the k-th h->g
    partner: dict[tuple[int, int], tuple[int, int]] = {}
    for g in range(n):
        for h in range(n):
            mine = [j for j, p in enumerate(gpus[g].chans) if p == h]
            theirs = [j for j, p in enumerate(gpus[h].chans) if p == g]
            for a, b in zip(mine, theirs, strict=False):
                partner[(g, a)] = (h, b)
    inbound: dict[tuple[int, int], int] = defaultdict(int)
    expected: dict[tuple[int, int], int] = defaultdict(int)
    results: list[list[Arr]] = [[] for _ in range(n)]
    execution = [0] * n
    pc: dict[tuple[int, int], int] = {}
    ticket: dict[tuple[int, int], list[int]] = {}
    barriers: dict[tuple[int, int], set[int]] = defaultdict(set)

    def begin(g: int) -> None:
        gpus[g].start(pool[execution[g], g])
        for t in range(len(gpus[g].tbs)):
            pc[(g, t)] = 0

    def remote(g: int, tb: dict[str, Any], ref: dict[str, Any]) -> Arr:
        rb = gpus[g].remote[gpus[g].local_buffers(tb)[ref["buffer_id"]]]
        buf: Arr = gpus[rb["rank"]].buf[rb["type"]]
        return buf

    def local(g: int, ref: dict[str, Any]) -> Arr:
        return gpus[g].buf[ref["type"]]

    def rows(ref: dict[str, Any], size: int | None = None) -> slice:
        return slice(ref["index"], ref["index"] + (size if size is not None else ref["size"]))

    def step(g: int, t: int) -> bool:
        """Run tb t's current op; False if it has to wait."""
        tb = gpus[g].tbs[t]
        op = tb["ops"][pc[(g, t)]]
        name = op["name"]
        chans = gpus[g].local_channels(tb)
        if name in ("signal", "rlxsignal"):
            for c in op["channel_ids"]:
                if (g, chans[c]) in partner:
                    inbound[partner[(g, chans[c])]] += 1
        elif name in ("wait", "rlxwait"):
            key = (g, t)
            if key not in ticket:
                mine = []
                for c in op["channel_ids"]:
                    expected[(g, chans[c])] += 1
                    mine.append(expected[(g, chans[c])])
                ticket[key] = mine
            if any(inbound[(g, chans[c])] < k for c, k in zip(op["channel_ids"], ticket[key], strict=True)):
                return False
            del ticket[key]
        elif name == "sem_release":
            for s in op["semaphore_ids"]:
                gpus[g].sems[s] += 1
        elif name == "sem_acquire":
            key = (g, t)
            if key not in ticket:
                olds = []
                for s in op["semaphore_ids"]:
                    olds.append(gpus[g].sems[s])
                    gpus[g].sems[s] -= 1
                ticket[key] = olds
            if any(
                o <= 0 and gpus[g].sems[s] < o for s, o in zip(op["semaphore_ids"], ticket[key], strict=True)
            ):
                return False
            del ticket[key]
        elif name == "barrier":
            key2 = (g, op["barrier_id"])
            barriers[key2].add(t)
            if len(barriers[key2]) < op["num_threadblocks"]:
                return False
        elif name == "put":
            src_type = op["src_buff"][0]["type"]
            for s, d in zip(op["src_buff"], op["dst_buff"], strict=True):
                remote(g, tb, d)[rows(d)] = gpus[g].buf[src_type][rows(s, d["size"])]
        elif name == "get":
            for s, d in zip(op["src_buff"], op["dst_buff"], strict=True):
                local(g, d)[rows(d)] = remote(g, tb, s)[rows(s, d["size"])]
        elif name == "copy":
            s, d = op["src_buff"][0], op["dst_buff"][0]
            local(g, d)[rows(d, s["size"])] = local(g, s)[rows(s)]
        elif name in ("re", "res", "rre", "rres"):
            size = op["src_buff"][0]["size"]
            total = np.zeros_like(local(g, op["src_buff"][0])[rows(op["src_buff"][0])])
            for s in op["src_buff"]:
                buf = remote(g, tb, s) if "buffer_id" in s else local(g, s)
                total = total + buf[rows(s, size)]
            first = op["dst_buff"][0]
            local(g, first)[rows(first, size)] = total
            for d in op["dst_buff"][1:]:
                remote(g, tb, d)[rows(d, size)] = total
        elif name != "nop":
            raise ValueError(f"the NumPy executor does not run op {name}")
        return True

    for g in range(n):
        begin(g)
    total_ops = sum(len(tb["ops"]) for gpu in gpus for tb in gpu.tbs) * executions
    waiting: set[tuple[int, int]] = set()
    held = late is not None  # the late GPU starts each execution only once the others are stuck
    stuck = 0
    live: list[tuple[int, int]] | None = None  # the blocks that may step, None where it may have changed
    for _ in range(40 * total_ops + 100):
        if live is None:  # only a block's last op, a barrier or a GPU's (re)start changes it
            live = [
                (g, t)
                for g in range(n)
                if execution[g] < executions and not (held and g == late)
                for t in range(len(gpus[g].tbs))
                if pc[(g, t)] < len(gpus[g].tbs[t]["ops"]) and (g, t) not in waiting
            ]
        if held and (not live or stuck > 20 * len(live)):
            held, stuck, live = False, 0, None
            continue
        if not live:
            break
        g, t = live[int(rng.integers(len(live)))]
        op = gpus[g].tbs[t]["ops"][pc[(g, t)]]
        if not step(g, t):
            stuck += 1
            if op["name"] == "barrier":
                waiting.add((g, t))
                live = None
            continue
        stuck = 0
        if op["name"] == "barrier":  # every block at it steps past it
            stepped = barriers.pop((g, op["barrier_id"]))
            waiting.difference_update((g, u) for u in stepped)
            live = None
        else:
            stepped = {t}
        ended = False
        for u in stepped:
            pc[(g, u)] += 1
            ended = ended or pc[(g, u)] == len(gpus[g].tbs[u]["ops"])
        if not ended:
            continue  # no block ended: its GPU goes on
        live = None
        if all(pc[(g, u)] == len(gpus[g].tbs[u]["ops"]) for u in range(len(gpus[g].tbs))):
            results[g].append(gpus[g].buf["o"].copy())
            execution[g] += 1
            if execution[g] < executions:
                begin(g)
                held = held or g == late
    if any(e < executions for e in execution):
        return None
    return results


@pytest.mark.parametrize(
    ("algorithm", "n"),
    [("stragglar", 2), ("stragglar", 3), ("stragglar", 5), ("ring", 4), ("rhd", 4), ("direct", 4)],
)
def test_numpy_executor_runs_exported_plans(algorithm: str, n: int) -> None:
    text = lower(prove(synthesize(algorithm, n))).text
    assert [run_numpy(text, seed) for seed in range(3)] == [None, None, None]


def test_a_plan_whose_gpus_group_a_sum_two_ways_is_proved_with_a_warning_and_its_replicas_differ() -> None:
    """The schedule of test_verify_orders that groups one sum two ways, as a plan: the prover proves
    it and warns, and here its GPUs' float32 results differ (1e8 + 1 rounds to 1e8 on some)."""
    from test_verify_orders import GROUPED_TWO_WAYS, SAID

    text = lower(prove(GROUPED_TWO_WAYS)).text
    assert mscclpp.prove(text).warnings == (SAID.replace("ranks 0 and 1", "gpus 0 and 1"),)
    assert run_numpy(text, 0) is None  # exact on integers
    pool = np.array([1e8, 1.0, -1e8, 1.0], dtype=np.float32).reshape(1, 4, 1, 1)
    results = run_plan(text, pool, np.random.default_rng(0))
    assert results is not None
    assert [float(results[g][0][0, 0]) for g in range(4)] == [1.0, 0.0, 1.0, 0.0]


def test_numpy_executor_sees_a_double_count() -> None:
    plan = json.loads(lower(prove(synthesize("stragglar", 3))).text)
    ops = plan["gpus"][0]["threadblocks"][0]["ops"]
    last_copy = max(i for i, op in enumerate(ops) if op["name"] == "copy")
    op = ops[last_copy]
    ops[last_copy] = {
        "name": "re",
        "src_buff": [op["dst_buff"][0], op["src_buff"][0]],
        "dst_buff": op["dst_buff"],
    }
    assert run_numpy(json.dumps(plan), 0) == "execution 0: GPU 0 ends with wrong sums"


def test_numpy_executor_sees_a_deadlock() -> None:
    plan = json.loads(lower(prove(synthesize("stragglar", 2))).text)
    ops = plan["gpus"][1]["threadblocks"][0]["ops"]
    ops.pop(next(i for i, op in enumerate(ops) if op["name"] == "signal" and i > 0))
    assert run_numpy(json.dumps(plan), 0) == "deadlock"


@pytest.mark.parametrize("n", [3, 4, 6])
def test_a_late_straggler_every_execution(n: int) -> None:
    text = lower(prove(synthesize("stragglar", n))).text
    assert [run_numpy(text, seed, executions=3, late=n - 1) for seed in range(3)] == [None, None, None]


def test_without_the_ready_handshake_the_prover_refuses_the_plan() -> None:
    """Drop the straggler's ready signal to GPU 0 and GPU 0's wait for it (counts stay matched): the
    sums still come out right here, but nothing tells GPU 0 that the straggler has started the
    execution before it puts into the straggler's scratch, so the prover refuses the plan."""
    n = 3
    plan = json.loads(lower(prove(synthesize("stragglar", n))).text)

    def peer_of(g: int, local: int) -> int:
        peers = [p for ch in plan["gpus"][g]["channels"] for p in ch["connected_to"]]
        ids = [c for ch in plan["gpus"][g]["threadblocks"][0]["channels"] for c in ch["channel_ids"]]
        peer: int = peers[ids[local]]
        return peer

    ops0 = plan["gpus"][0]["threadblocks"][0]["ops"]
    ready_wait = next(
        i for i, op in enumerate(ops0) if op["name"] == "wait" and peer_of(0, op["channel_ids"][0]) == n - 1
    )
    del ops0[ready_wait]
    ready = plan["gpus"][n - 1]["threadblocks"][0]["ops"][0]
    assert ready["name"] == "signal"
    ready["channel_ids"] = [c for c in ready["channel_ids"] if peer_of(n - 1, c) != 0]
    text = json.dumps(plan)
    assert [run_numpy(text, seed, executions=3, late=n - 1) for seed in range(3)] == [None, None, None]
    violation = check_plan(text)
    assert violation is not None and violation.kind == "early-access"
    assert "before GPU 2 is known to have started this execution" in violation.message


def test_a_gpu_whose_blocks_all_end_at_a_barrier_ends_its_execution() -> None:
    """The barrier's release stepped its blocks past their last op without asking whether their
    GPU had ended: such a plan, which the prover proves, ran as a deadlock."""
    plan = json.loads(lower(prove(synthesize("stragglar", 3))).text)
    blocks = plan["gpus"][0]["threadblocks"]
    for tb in blocks:
        tb["ops"].append({"name": "barrier", "barrier_id": 0, "num_threadblocks": len(blocks)})
    text = json.dumps(plan)
    assert check_plan(text) is None
    assert [run_numpy(text, seed) for seed in range(3)] == [None] * 3
