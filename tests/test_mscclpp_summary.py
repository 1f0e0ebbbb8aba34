"""``summarize``: what ``stragglar show`` prints for an MSCCL++ plan, for any plan the executor loads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stragglar.mscclpp import PlanFormatError, lower
from stragglar.mscclpp.summary import summarize
from stragglar.synth import synthesize
from stragglar.verify import prove

RING = (Path(__file__).parent / "fixtures" / "mscclpp" / "ring_ok.json").read_text()


def test_hand_written_ring() -> None:
    assert str(summarize(RING)).splitlines() == [
        "ring3: allreduce, Simple, in-place, 3 GPUs",
        "thread blocks: 3 (1 per GPU)",
        "ops: 90 (signal 15, wait 15, nop 36, put 12, re 6, copy 6)",
        "chunks: 3 input, 3 output, scratch 4 per GPU",
        "sizes: multiples of 48 bytes (16-byte alignment x 3 chunks) from 48 to 1073741824 bytes",
    ]


def test_counts_match_the_plan() -> None:
    plan = lower(prove(synthesize("stragglar", 16)))
    summary = summarize(plan.text)
    obj = json.loads(plan.text)
    assert summary.threadblocks == plan.threadblocks
    assert (
        sum(n for _, n in summary.ops)
        == plan.ops
        == sum(len(tb["ops"]) for g in obj["gpus"] for tb in g["threadblocks"])
    )
    assert summary.scratch_chunks == tuple(g["scratch_chunks"] for g in obj["gpus"])
    assert summary.rule == plan.rule
    low, high = min(plan.threadblocks), max(plan.threadblocks)
    assert str(summary).splitlines()[1] == f"thread blocks: {sum(plan.threadblocks)} ({low}-{high} per GPU)"


def test_plans_the_prover_refuses_are_still_summarized() -> None:
    plan = json.loads(RING)
    plan["protocol"] = "LL"
    plan["gpus"][0]["threadblocks"][0]["ops"].append(
        {"name": "pipeline", "ops": [{"name": "copy"}, {"name": "nop"}]}
    )
    summary = summarize(json.dumps(plan))
    assert summary.protocol == "LL"
    assert dict(summary.ops)["pipeline"] == 1 and dict(summary.ops)["copy"] == 7


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p: p.pop("name"), "plan: 'name' is missing or of the wrong type"),
        (lambda p: p["gpus"][1].update(threadblocks={}), "gpu 1: 'threadblocks' must be a list"),
        (
            lambda p: p["gpus"][2]["threadblocks"][0]["ops"].append(3),
            "gpu 2 tb 0 op 30: must be an object with a 'name'",
        ),
    ],
)
def test_bad_plans(edit: object, message: str) -> None:
    plan = json.loads(RING)
    edit(plan)  # type: ignore[operator]
    with pytest.raises(PlanFormatError) as info:
        summarize(json.dumps(plan))
    assert str(info.value) == message


@pytest.mark.parametrize("command", ["show", "verify"])
def test_a_plans_long_name_is_shown_cut_and_counted(tmp_path: Path, command: str) -> None:
    """A 100,000-character name was printed whole, filling the terminal."""
    from cli_results import run

    document = json.loads(RING)
    document["name"] = "y" * 100_000
    path = tmp_path / "long.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    result = run(command, str(path))
    assert result.exit_code == 0, result.output
    first = result.stdout.splitlines()[0]
    assert "... (100,000 characters)" in first and len(first) < 300, first[:300]
