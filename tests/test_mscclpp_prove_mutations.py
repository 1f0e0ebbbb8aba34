"""Mutation testing of exported plans: every single-op mutation is rejected by the prover, or the
independent NumPy executor (two back-to-back executions, several interleavings) shows it harmless."""

from __future__ import annotations

import copy
import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from test_mscclpp_reference import run_numpy

from stragglar.mscclpp import PlanError, check_plan, lower
from stragglar.synth import synthesize
from stragglar.verify import prove

Plan = dict[str, Any]


def _ops(plan: Plan) -> Iterator[tuple[int, int, int, dict[str, Any]]]:
    for g, gpu in enumerate(plan["gpus"]):
        for t, tb in enumerate(gpu["threadblocks"]):
            for i, op in enumerate(tb["ops"]):
                yield g, t, i, op


def edited(plan: Plan, g: int, t: int) -> tuple[Plan, list[dict[str, Any]]]:
    """A copy of ``plan`` and its GPU ``g``'s block ``t``'s ops, to change: that block's ops are
    copied, everything else is shared with ``plan`` (a deep copy of a whole plan per mutant was
    a third of the mutation tests' time)."""
    gpu = dict(plan["gpus"][g])
    gpu["threadblocks"] = list(gpu["threadblocks"])
    tb = gpu["threadblocks"][t] = dict(gpu["threadblocks"][t])
    ops = tb["ops"] = copy.deepcopy(tb["ops"])
    gpus = list(plan["gpus"])
    gpus[g] = gpu
    return {**plan, "gpus": gpus}, ops


def mutations(plan: Plan) -> Iterator[tuple[str, Plan]]:
    """Every single-op mutation: drop, chunk index +-1, channel (or device semaphore) id to every other,
    swap with the next op, reduce <-> copy."""
    for g, t, i, op in list(_ops(plan)):
        where = f"gpu {g} tb {t} op {i} {op['name']}"
        m, ops = edited(plan, g, t)
        del ops[i]
        yield f"drop {where}", m
        if i + 1 < len(plan["gpus"][g]["threadblocks"][t]["ops"]):
            m, ops = edited(plan, g, t)
            ops[i], ops[i + 1] = ops[i + 1], ops[i]
            yield f"swap {where}", m
        for key in ("src_buff", "dst_buff"):
            for k, _ in enumerate(op.get(key, [])):
                for delta in (-1, 1):
                    m, ops = edited(plan, g, t)
                    ops[i][key][k]["index"] += delta
                    if ops[i][key][k]["index"] >= 0:
                        yield f"index {delta:+d} {key}[{k}] {where}", m
        n_channels = sum(
            len(c["channel_ids"]) for c in plan["gpus"][g]["threadblocks"][t].get("channels", [])
        )
        for k, c in enumerate(op.get("channel_ids", [])):
            for other in range(n_channels):
                if other != c:
                    m, ops = edited(plan, g, t)
                    ops[i]["channel_ids"][k] = other
                    yield f"channel {c}->{other} {where}", m
        n_sems = len(plan["gpus"][g].get("semaphores", []))
        for k, sem in enumerate(op.get("semaphore_ids", [])):
            for other in range(n_sems):
                if other != sem:
                    m, ops = edited(plan, g, t)
                    ops[i]["semaphore_ids"][k] = other
                    yield f"semaphore {sem}->{other} {where}", m
        if op["name"] == "re" and len(op["src_buff"]) == 2:
            m, ops = edited(plan, g, t)
            ops[i] = {"name": "copy", "src_buff": [op["src_buff"][1]], "dst_buff": op["dst_buff"]}
            yield f"re->copy {where}", m
        if op["name"] == "copy":
            m, ops = edited(plan, g, t)
            ops[i] = {
                "name": "re",
                "src_buff": [op["dst_buff"][0], op["src_buff"][0]],
                "dst_buff": op["dst_buff"],
            }
            yield f"copy->re {where}", m


def judge(plan: Plan) -> str:
    text = json.dumps(plan)
    try:
        violation = check_plan(text, interleavings=2)
    except PlanError:
        return "rejected"
    if violation is not None:
        return "rejected"
    bad = [run_numpy(text, seed) for seed in range(3)]
    return "harmless" if bad == [None, None, None] else f"ACCEPTED BUT WRONG: {bad}"


@pytest.mark.parametrize(
    ("algorithm", "n", "chunks"),
    [
        ("stragglar", 3, None),
        ("stragglar", 4, None),
        ("stragglar", 3, 4),
        ("stragglar", 4, 6),
        ("ring", 3, None),
        ("rhd", 4, None),
        ("direct", 3, None),
    ],
)
def test_every_single_op_mutation_is_rejected_or_harmless(algorithm: str, n: int, chunks: int | None) -> None:
    text = lower(prove(synthesize(algorithm, n, chunks=chunks))).text
    plan = json.loads(text)
    verdicts = {label: judge(m) for label, m in mutations(plan)}
    wrong = {label: v for label, v in verdicts.items() if v.startswith("ACCEPTED")}
    assert not wrong, wrong
    assert plan == json.loads(text)  # the mutants share its unchanged parts: none changed them
    kinds = Counter(label.split()[0] for label in verdicts)
    assert kinds["drop"] == sum(1 for _ in _ops(plan))
    assert kinds["index"] > 0 and kinds["channel"] > 0 and kinds["swap"] > 0
    if algorithm in ("stragglar", "ring"):
        # No transfer of these schedules is redundant: losing data or changing what is summed is wrong.
        for label, verdict in verdicts.items():
            if label.startswith(("re->copy", "copy->re")) or (
                label.startswith("drop") and label.endswith((" put", " re"))
            ):
                assert verdict == "rejected", label


def test_mutations_the_prover_accepts_are_few_and_real() -> None:
    plan = json.loads(lower(prove(synthesize("stragglar", 3))).text)
    verdicts = Counter(judge(m) for _, m in mutations(plan))
    assert set(verdicts) == {"rejected", "harmless"}
    assert verdicts["harmless"] < verdicts["rejected"] / 5


@pytest.mark.parametrize(
    "n", [pytest.param(6, marks=pytest.mark.slow), pytest.param(8, marks=pytest.mark.manual)]
)
def test_mutations_of_a_plan_with_chained_thread_blocks(n: int) -> None:
    """From N = 6 on, a GPU's part takes two blocks chained by device semaphores: mutate those
    too.  CI mutates N = 6 (1,656 mutants); ``pytest -m manual`` the paper's N = 8 (3,427)."""
    plan = json.loads(lower(prove(synthesize("stragglar", n))).text)
    assert all(len(gpu["threadblocks"]) == 2 and gpu["semaphores"] for gpu in plan["gpus"])
    verdicts = {label: judge(m) for label, m in mutations(plan)}
    assert not {label: v for label, v in verdicts.items() if v.startswith("ACCEPTED")}
    assert any(label.startswith("drop") and label.endswith("sem_acquire") for label in verdicts)
    for label, verdict in verdicts.items():
        if label.startswith("drop") and label.endswith(("sem_acquire", "sem_release")):
            assert verdict == "rejected", label
