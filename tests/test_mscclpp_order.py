"""A second, explicit happens-before analysis (a networkx DAG over ops) that checks the prover's
vector clocks: on plans the prover proves every conflicting pair of chunk accesses is ordered in
the DAG, and on the racy fixtures the DAG has an unordered pair.

The DAG follows the kernel rules independently of ``stragglar.mscclpp.prover.order``: inside a block only a
``nop``/``barrier`` orders ops for all threads, single-channel sync ops (thread 0) are ordered among
themselves; a non-relaxed signal is before the wait that consumes it (plans here have one block
signalling and one waiting on each connection, so the k-th signal meets the k-th wait), a
``sem_release`` before the matching ``sem_acquire`` likewise.
"""

from __future__ import annotations

import json
from collections import defaultdict
from itertools import combinations
from pathlib import Path
from typing import Any

import networkx as nx
import pytest

from stragglar import mscclpp
from stragglar.mscclpp import lower
from stragglar.synth import synthesize
from stragglar.verify import prove

FIXTURES = Path(__file__).parent / "fixtures" / "mscclpp"
Node = tuple[int, int, int]  # (gpu, tb, op)


def build(plan: dict[str, Any]) -> tuple[nx.DiGraph, dict[tuple[int, str, int], list[tuple[Node, bool]]]]:
    """The DAG, and for every chunk (gpu, buffer, index) the ops that read (False) or write (True) it."""
    graph: nx.DiGraph = nx.DiGraph()
    accesses: dict[tuple[int, str, int], list[tuple[Node, bool]]] = defaultdict(list)
    producers: dict[Any, list[Node]] = defaultdict(list)
    consumers: dict[Any, list[Node]] = defaultdict(list)
    chans = [[p for ch in g["channels"] for p in ch["connected_to"]] for g in plan["gpus"]]

    def connection(g: int, global_index: int) -> tuple[int, int, int]:
        """(lower rank, higher rank, k): the k-th channel from g to its peer meets the k-th back."""
        peer = chans[g][global_index]
        return (min(g, peer), max(g, peer), chans[g][:global_index].count(peer))

    for g, gpu in enumerate(plan["gpus"]):
        buffers = gpu["remote_buffers"]
        for t, tb in enumerate(gpu["threadblocks"]):
            local_chans = [c for ch in tb["channels"] for c in ch["channel_ids"]]
            local_bufs = [b for r in tb.get("remote_buffer_refs", []) for b in r["remote_buffer_ids"]]
            ops = tb["ops"]
            last_sync: Node | None = None  # barrier point (nop/barrier) before the current epoch
            epoch: list[Node] = []
            lane0: Node | None = None
            for i, op in enumerate(ops):
                node = (g, t, i)
                graph.add_node(node)
                name = op["name"]
                if last_sync is not None:
                    graph.add_edge(last_sync, node)
                if name in ("nop", "barrier"):
                    for x in epoch:
                        graph.add_edge(x, node)
                    last_sync, epoch, lane0 = node, [], None
                    if name == "barrier":
                        producers[("barrier", g, op["barrier_id"])].append(node)
                    continue
                epoch.append(node)
                lanes = op.get("channel_ids", op.get("semaphore_ids", []))
                if (
                    name in ("signal", "wait", "rlxsignal", "rlxwait", "sem_acquire", "sem_release")
                    and len(lanes) == 1
                ):
                    if lane0 is not None:
                        graph.add_edge(lane0, node)
                    lane0 = node
                if name in ("signal", "wait"):
                    for c in lanes:
                        sender = g if name == "signal" else chans[g][local_chans[c]]
                        direction = (*connection(g, local_chans[c]), sender)
                        (producers if name == "signal" else consumers)[direction].append(node)
                elif name in ("sem_release", "sem_acquire"):
                    for s in lanes:
                        (producers if name == "sem_release" else consumers)[("sem", g, s)].append(node)
                for key, writes in (("src_buff", False), ("dst_buff", True)):
                    for ref in op.get(key, []):
                        if "buffer_id" in ref:
                            rb = buffers[local_bufs[ref["buffer_id"]]]
                            owner, kind = rb["rank"], rb["type"]
                        else:
                            owner, kind = g, ref["type"]
                        if plan["inplace"] and kind == "o":
                            kind = "i"
                        for c in range(ref["index"], ref["index"] + ref["size"]):
                            accesses[(owner, kind, c)].append((node, writes))
    for key, signals in producers.items():
        if key[0] == "barrier":
            continue
        for signal, wait in zip(signals, consumers.get(key, []), strict=False):
            graph.add_edge(signal, wait)
    barrier_groups = {k: v for k, v in producers.items() if k[0] == "barrier"}
    for members in barrier_groups.values():
        for a, b in combinations(members, 2):  # one generation per barrier id in these plans
            graph.add_edge(a, b)
            graph.add_edge(b, a)
    return graph, accesses


def unordered_pairs(plan: dict[str, Any]) -> tuple[list[tuple[Node, Node, tuple[int, str, int]]], int]:
    """The conflicting access pairs the DAG leaves unordered, and how many conflicting pairs it checked."""
    graph, accesses = build(plan)
    closure = {n: nx.descendants(graph, n) for n in graph.nodes}
    bad = []
    checked = 0
    for where, touches in accesses.items():
        for (x, wx), (y, wy) in combinations(touches, 2):
            if x != y and (wx or wy):
                checked += 1
                if y not in closure[x] and x not in closure[y]:
                    bad.append((x, y, where))
    return bad, checked


@pytest.mark.parametrize(
    ("algorithm", "n"), [("stragglar", 3), ("stragglar", 4), ("stragglar", 8), ("ring", 4), ("rhd", 4)]
)
def test_exported_plans_have_every_conflict_ordered(algorithm: str, n: int) -> None:
    text = lower(prove(synthesize(algorithm, n))).text
    mscclpp.prove(text)
    bad, checked = unordered_pairs(json.loads(text))
    assert bad == [] and checked >= 2 * n


def test_hand_written_ring_has_every_conflict_ordered() -> None:
    bad, checked = unordered_pairs(json.loads((FIXTURES / "ring_ok.json").read_text()))
    assert bad == [] and checked > 30


@pytest.mark.parametrize(
    ("name", "pair"),
    [
        ("missing_wait.json", ((0, 0, 3), (1, 0, 7), (1, "s", 0))),
        ("put_races_read.json", ((0, 0, 10), (1, 0, 8), (1, "s", 0))),
    ],
)
def test_racy_fixtures_have_the_unordered_pair_the_prover_names(
    name: str, pair: tuple[Node, Node, Any]
) -> None:
    bad, _ = unordered_pairs(json.loads((FIXTURES / name).read_text()))
    assert pair in bad or (pair[1], pair[0], pair[2]) in bad


def test_a_missing_nop_is_an_unordered_pair_for_the_dag_too() -> None:
    plan = json.loads((FIXTURES / "ring_ok.json").read_text())
    del plan["gpus"][0]["threadblocks"][0]["ops"][4]  # the nop between gpu 0's first put and its signal
    bad, _ = unordered_pairs(plan)
    assert bad == [((0, 0, 3), (1, 0, 8), (1, "s", 0))]  # the put and gpu 1's reduce of that slot
