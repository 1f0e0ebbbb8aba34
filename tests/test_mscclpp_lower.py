"""Lowering schedules to MSCCL++ plans: every exported plan proves from its text, has the executor's
shape and limits, handles the straggler exchange through scratch, and fails cleanly where it must."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stragglar import mscclpp
from stragglar.errors import ArgumentError
from stragglar.mscclpp import (
    MscclppExportError,
    PlanFormatError,
    PlanOptions,
    PlanViolationError,
    check_request,
    lower,
    will_use,
    write_plan,
)
from stragglar.mscclpp.sizes import offset_limit
from stragglar.schedule import Op, Phase, Schedule, Transfer
from stragglar.synth import synthesize
from stragglar.units import count_of
from stragglar.verify import prove


def export_and_prove(schedule: Schedule, options: PlanOptions | None = None) -> tuple[dict[str, Any], str]:
    plan = lower(prove(schedule), options)  # the IR schedule first, with the project's simulator
    proof = mscclpp.prove(plan.text)
    assert proof.warnings == ()  # every GPU adds each chunk alike, as the schedule does
    return json.loads(plan.text), proof.summary.removeprefix("proved: ")


@pytest.mark.parametrize("n", [*range(2, 9), 16, 32])
def test_stragglar_plans_prove(n: int) -> None:
    plan, summary = export_and_prove(synthesize("stragglar", n))
    chunks = count_of(n - 1, "chunk")
    assert summary.startswith(f"stragglar-n{n}-s{n - 1}: in-place allreduce over {n} GPUs, {chunks}")
    assert len(plan["gpus"]) == n


@pytest.mark.slow
@pytest.mark.parametrize("n", [64, 72])
def test_large_stragglar_plans_prove(n: int) -> None:
    plan, summary = export_and_prove(synthesize("stragglar", n))
    assert f"over {n} GPUs, {n - 1} chunks" in summary
    assert max(len(g["threadblocks"]) for g in plan["gpus"]) <= 108


def stragglar_blocks(n: int, chunks: int | None = None) -> int:
    """The most thread blocks a GPU of StragglAR's plan needs, one instance, counted by the lowering."""
    return max(
        lower(
            prove(synthesize("stragglar", n, chunks=chunks)), PlanOptions(max_threadblocks=10**6)
        ).threadblocks
    )


@pytest.mark.parametrize("n", [*range(2, 25), 64])
def test_stragglar_needs_at_least_n_over_4_thread_blocks_per_gpu(n: int) -> None:
    """What synth checks before making the schedule (check_request) is never more than the count."""
    assert stragglar_blocks(n) >= max(1, n // 4)


SAMPLED = {25, 31, 33, 47, 48, 63, 65, 72, 96, 127, 129, 160, 191, 192}  # powers of two, either side


@pytest.mark.parametrize(
    ("n", "chunks"),
    [
        pytest.param(n, None, marks=pytest.mark.slow if n in SAMPLED else pytest.mark.manual)
        for n in range(25, 193)
    ]
    + [
        pytest.param(n, c, marks=pytest.mark.slow)
        for n, c in ((4, 64), (8, 64), (16, 256), (32, 64), (64, 256), (128, 256))
    ],
)
def test_stragglar_needs_at_least_n_over_4_thread_blocks_per_gpu_to_the_limit(
    n: int, chunks: int | None
) -> None:
    """Every N to the plans' limit (manual: ``pytest -m manual``, about 8 minutes); CI's slow tier
    takes either side of each power of two and the chunked samples."""
    assert stragglar_blocks(n, chunks) >= max(1, n // 4)


def test_too_many_thread_blocks_for_stragglar_is_refused_early_where_the_lowering_refuses() -> None:
    with pytest.raises(MscclppExportError, match=r"^StragglAR over 64 GPUs needs at least 16 thread blocks"):
        check_request(64, 63, 8, algorithm="stragglar")
    with pytest.raises(MscclppExportError, match=r"^GPU \d+ needs 144 thread blocks, more than the 108"):
        lower(prove(synthesize("stragglar", 64)), PlanOptions(instances=8))
    check_request(64, 63, 6, algorithm="stragglar")  # 18 x 6 = 108: the lowering takes it


def test_the_largest_plans_are_bounded_before_the_lowering() -> None:
    """N = 400 fits 108 thread blocks per GPU, but its proof ran out of memory after 166 s."""
    with pytest.raises(
        MscclppExportError, match=r"^193 GPUs: stragglar writes MSCCL\+\+ plans for at most 192 "
    ):
        lower(prove(synthesize("ring", 193)))
    with pytest.raises(MscclppExportError, match=r"^96 GPUs x 95 chunks x 5 instances: .* at most 36,864"):
        lower(prove(synthesize("stragglar", 96)), PlanOptions(instances=5))
    check_request(192, 192)  # Ring at N = 192, the largest


@pytest.mark.parametrize(
    ("algorithm", "n"),
    [(a, n) for a in ("ring", "direct") for n in range(2, 9)] + [("rhd", n) for n in (2, 4, 8, 16)],
)
def test_baseline_plans_prove(algorithm: str, n: int) -> None:
    _, summary = export_and_prove(synthesize(algorithm, n))
    assert summary.startswith(f"{algorithm}-n{n}")


@pytest.mark.parametrize("straggler", [0, 2, 4])
def test_any_straggler_rank(straggler: int) -> None:
    _, summary = export_and_prove(synthesize("stragglar", 6, straggler=straggler))
    assert summary.startswith(f"stragglar-n6-s{straggler}:")


def split_chunks(schedule: Schedule, parts: list[int]) -> Schedule:
    """The same schedule on more chunks: chunk c becomes ``parts[c]`` consecutive chunks moved together."""
    first = [sum(parts[:c]) for c in range(len(parts))]
    phases = tuple(
        Phase(
            p.name,
            p.ranks,
            tuple(
                tuple(
                    Transfer(t.src, t.dst, first[t.chunk] + k, t.op)
                    for t in rnd
                    for k in range(parts[t.chunk])
                )
                for rnd in p.rounds
            ),
        )
        for p in schedule.phases
    )
    return Schedule(schedule.algorithm, schedule.num_ranks, sum(parts), schedule.straggler, phases)


@pytest.mark.parametrize(
    ("algorithm", "n", "parts"),
    [
        ("stragglar", 4, [4, 4, 4]),  # C = 12 = 4(N-1)
        ("stragglar", 5, [1, 3, 2, 1]),  # C = 7, not a multiple of N-1
        ("stragglar", 8, [2] * 7),
        ("ring", 4, [3, 1, 1, 2]),
    ],
)
def test_more_chunks_than_ranks(algorithm: str, n: int, parts: list[int]) -> None:
    schedule = split_chunks(synthesize(algorithm, n), parts)
    plan, summary = export_and_prove(schedule)
    assert plan["gpus"][0]["input_chunks"] == sum(parts)
    assert f"{sum(parts)} chunks" in summary
    # runs of consecutive chunks travel as one put of several chunks
    sizes = {
        ref["size"]
        for g in plan["gpus"]
        for tb in g["threadblocks"]
        for op in tb["ops"]
        for ref in op.get("src_buff", [])
    }
    assert max(sizes) == max(parts)


def test_instances_replicate_the_program_on_their_own_chunks() -> None:
    one, _ = export_and_prove(synthesize("stragglar", 5))
    two, summary = export_and_prove(synthesize("stragglar", 5), PlanOptions(instances=2))
    assert summary.startswith("stragglar-n5-s4-x2: in-place allreduce over 5 GPUs, 8 chunks")
    for g1, g2 in zip(one["gpus"], two["gpus"], strict=True):
        assert len(g2["threadblocks"]) == 2 * len(g1["threadblocks"])
        assert g2["scratch_chunks"] == 2 * g1["scratch_chunks"]


def test_lowering_is_deterministic() -> None:
    schedule = synthesize("stragglar", 9)
    assert lower(prove(schedule)).text == lower(prove(schedule)).text


def ops_of(plan: dict[str, Any]) -> list[tuple[int, int, int, dict[str, Any]]]:
    return [
        (g, t, i, op)
        for g, gpu in enumerate(plan["gpus"])
        for t, tb in enumerate(gpu["threadblocks"])
        for i, op in enumerate(tb["ops"])
    ]


def test_plan_has_the_executor_shape_and_limits() -> None:
    plan = json.loads(lower(prove(synthesize("stragglar", 16))).text)
    assert {
        k: plan[k]
        for k in ("collective", "protocol", "inplace", "reuse_resources", "use_double_scratch_buffer")
    } == {
        "collective": "allreduce",
        "protocol": "Simple",
        "inplace": True,
        "reuse_resources": False,
        "use_double_scratch_buffer": False,
    }
    for g, gpu in enumerate(plan["gpus"]):
        assert gpu["id"] == g and gpu["input_chunks"] == gpu["output_chunks"] == 15
        for t, tb in enumerate(gpu["threadblocks"]):
            assert tb["id"] == t and len(tb["ops"]) <= 64
            assert sum(len(c["channel_ids"]) for c in tb["channels"]) <= 16
            assert sum(len(r["remote_buffer_ids"]) for r in tb["remote_buffer_refs"]) <= 16
    names = {op["name"] for _, _, _, op in ops_of(plan)}
    assert names == {"nop", "signal", "wait", "put", "re", "copy", "sem_acquire", "sem_release"}


def test_the_exchange_goes_through_scratch_and_nothing_reads_a_peer() -> None:
    plan = json.loads(lower(prove(synthesize("stragglar", 8))).text)
    for _, _, _, op in ops_of(plan):
        for ref in op.get("src_buff", []):
            assert "buffer_id" not in ref  # no remote reads (no rre/get)
        if op["name"] == "put":
            gpu_buffers = None
            assert op["dst_buff"][0].keys() == {"buffer_id", "index", "size"} and gpu_buffers is None
    for gpu in plan["gpus"]:
        assert {rb["type"] for rb in gpu["remote_buffers"]} == {"s"}


def channel_peer(plan: dict[str, Any], g: int, t: int, local: int) -> int:
    peers = [p for ch in plan["gpus"][g]["channels"] for p in ch["connected_to"]]
    ids = [c for ch in plan["gpus"][g]["threadblocks"][t]["channels"] for c in ch["channel_ids"]]
    peer: int = peers[ids[local]]
    return peer


def test_writes_into_the_straggler_wait_for_its_ready_signal() -> None:
    n = 8
    straggler = n - 1
    plan = json.loads(lower(prove(synthesize("stragglar", n))).text)
    checked = 0
    for g, gpu in enumerate(plan["gpus"]):
        buffers = [rb["rank"] for rb in gpu["remote_buffers"]]
        seen_wait = False
        for t, tb in enumerate(gpu["threadblocks"]):
            local_buffers = [b for r in tb["remote_buffer_refs"] for b in r["remote_buffer_ids"]]
            for op in tb["ops"]:
                if op["name"] == "wait" and straggler in [
                    channel_peer(plan, g, t, c) for c in op["channel_ids"]
                ]:
                    seen_wait = True
                if (
                    op["name"] == "put"
                    and buffers[local_buffers[op["dst_buff"][0]["buffer_id"]]] == straggler
                ):
                    assert seen_wait, f"gpu {g} puts into the straggler before waiting for it"
                    checked += 1
    assert checked == n - 1  # its N-1 exchange partners (it only sends afterwards)
    # and the straggler's ready signals are the first ops of its blocks, before any wait
    for tb in plan["gpus"][straggler]["threadblocks"]:
        first_wait = next(i for i, op in enumerate(tb["ops"]) if op["name"] in ("wait", "sem_acquire"))
        assert all(op["name"] == "signal" for op in tb["ops"][:first_wait])


def test_too_many_thread_blocks_is_refused_with_the_limit_and_the_way_out() -> None:
    with pytest.raises(MscclppExportError) as info:
        lower(prove(synthesize("stragglar", 8)), PlanOptions(instances=60))
    assert str(info.value) == (
        "GPU 0 needs 120 thread blocks, more than the 108 one GPU runs at once (max_threadblocks; all "
        "must be "
        "resident, 1024 threads each); use fewer instances, or raise max_threadblocks for a GPU with more "
        "SMs "
        "(H100 SXM: 132)"
    )
    assert (
        lower(
            prove(synthesize("stragglar", 8)), PlanOptions(instances=60, max_threadblocks=120)
        ).threadblocks[0]
        == 120
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (PlanOptions(instances=0), "instances must be a positive integer, got 0"),
        (PlanOptions(buffer_alignment=8), "buffer_alignment must be a positive multiple of 16 below 2^32"),
        (PlanOptions(num_threads_per_block=2048), "num_threads_per_block must be at most 1024"),
        (
            PlanOptions(min_message_size=10, max_message_size=5),
            "the smallest message size, 10 B, is above the largest, 5 B",
        ),
        (
            PlanOptions(min_message_size=1 << 60),
            "the smallest message size, 1,152,921,504,606,846,976 B, is above the largest, 2,312,674,672 B "
            "(by default, what 32-bit chunk offsets fit)",
        ),
        (
            PlanOptions(min_message_size=-1, max_message_size=0),
            "a message size cannot be negative, got -1 and 0",
        ),
        (
            PlanOptions(max_message_size=1 << 40),
            "a largest message size of 1,099,511,627,776 B overflows the executor's 32-bit",
        ),
        (
            PlanOptions(min_message_size=0, max_message_size=100),
            "no buffer size selects the plan: no multiple of 112 bytes (16-byte alignment x 7 chunks) in "
            "[0, 100]",
        ),
        (PlanOptions(name=""), "name must be 1 to 128 printable characters"),
    ],
)
def test_bad_options_are_one_line_errors(options: PlanOptions, message: str) -> None:
    with pytest.raises(MscclppExportError, match="^" + re.escape(message)):
        lower(prove(synthesize("stragglar", 8)), options)


def test_numpy_integers_are_options_like_ints() -> None:
    """As everywhere in the API (stragglar.args): a count or size may be any integral type."""
    options = PlanOptions(
        instances=np.int64(2),
        buffer_alignment=np.int32(32),
        min_message_size=np.uint32(0),
        max_message_size=np.int64(1 << 20),
        num_threads_per_block=np.int16(512),
        max_threadblocks=np.int64(64),
    )
    plain = PlanOptions(
        instances=2,
        buffer_alignment=32,
        min_message_size=0,
        max_message_size=1 << 20,
        num_threads_per_block=512,
        max_threadblocks=64,
    )
    assert options == plain and type(options.instances) is int and type(options.max_message_size) is int
    proof = prove(synthesize("stragglar", 5))
    assert lower(proof, options) == lower(proof, plain)


@pytest.mark.parametrize(
    "label",
    [
        "instances",
        "buffer_alignment",
        "min_message_size",
        "max_message_size",
        "num_threads_per_block",
        "max_threadblocks",
    ],
)
@pytest.mark.parametrize(("value", "kind"), [(True, "bool"), (16.0, "float")])
def test_options_of_other_types_are_refused(label: str, value: object, kind: str) -> None:
    with pytest.raises(ArgumentError) as info:
        PlanOptions(**{label: value})  # type: ignore[arg-type]
    assert str(info.value) == f"{label} must be an integer, got {value!r} ({kind})"


def test_a_name_that_is_not_a_string_is_refused() -> None:
    with pytest.raises(MscclppExportError, match=r"^name must be 1 to 128 printable characters, got 5$"):
        lower(prove(synthesize("stragglar", 3)), PlanOptions(name=5))  # type: ignore[arg-type]


def test_size_fields_and_the_rule_they_imply() -> None:
    plan = lower(prove(synthesize("stragglar", 8)))
    obj = json.loads(plan.text)
    scratch = max(g["scratch_chunks"] for g in obj["gpus"])
    assert (obj["buffer_alignment"], obj["min_message_size"]) == (16, 16 * 7)
    assert obj["max_message_size"] == offset_limit(16, 7, scratch) == plan.rule.max_message_size
    assert not will_use(plan.text, 1 << 30).used  # no power of two is a multiple of 7 x 16
    assert will_use(plan.text, 7 << 26).used
    custom = lower(
        prove(synthesize("stragglar", 8)), PlanOptions(min_message_size=1 << 20, max_message_size=7 << 28)
    )
    assert will_use(custom.text, 7 << 16).reason == (
        "not used: 458752 bytes is below min_message_size 1048576; nearest usable: 1048656"
    )


def test_write_plan_is_atomic_and_leaves_no_temporary_file(tmp_path: Path) -> None:
    plan = lower(prove(synthesize("stragglar", 4)))
    target = tmp_path / "p.json"
    target.write_text("old")
    assert write_plan(plan, target) == target
    assert target.read_text() == plan.text
    assert [p.name for p in tmp_path.iterdir()] == ["p.json"]


def test_write_plan_writes_only_a_proved_plan(tmp_path: Path) -> None:
    """write_plan wrote any text it was given ("garbage", or a plan's text replaced): nothing
    unproved is exported, so it proves the text first, as the executor would run it."""
    plan = lower(prove(synthesize("stragglar", 4)))
    document = json.loads(plan.text)
    document["gpus"][0]["threadblocks"][0]["ops"].pop()  # one op less: a wrong sum somewhere
    target = tmp_path / "p.json"
    with pytest.raises(PlanFormatError, match="not JSON"):
        write_plan("garbage", target)
    with pytest.raises(PlanViolationError, match="is wrong"):
        write_plan(dataclasses.replace(plan, text=json.dumps(document)), target)
    with pytest.raises(ArgumentError, match="plan must be an MscclppPlan or its text, got 5"):
        write_plan(5, target)  # type: ignore[arg-type]
    assert not target.exists()


def test_a_schedule_round_too_big_for_one_thread_block_is_refused() -> None:
    # A correct AllReduce whose first round moves 70 single chunks to one peer, none consecutive:
    # 70 puts exceed 64 ops.
    n_chunks = 140
    even, odd = range(0, n_chunks, 2), range(1, n_chunks, 2)
    first = tuple(Transfer(0, 1, c, Op.REDUCE) for c in even) + tuple(
        Transfer(1, 0, c, Op.REDUCE) for c in odd
    )
    second = tuple(Transfer(1, 0, c) for c in even) + tuple(Transfer(0, 1, c) for c in odd)
    schedule = Schedule("x", 2, n_chunks, None, (Phase("p", (0, 1), (first, second)),))
    with pytest.raises(MscclppExportError, match=r"^round 0 of GPU 0 needs more than 64 ops"):
        lower(prove(schedule))


def test_only_a_proof_is_lowered() -> None:
    bad = Schedule("x", 2, 1, None, (Phase("p", (0, 1), ((Transfer(0, 1, 3, Op.REDUCE),),)),))
    with pytest.raises(TypeError, match="prove the schedule first"):
        lower(bad)  # type: ignore[arg-type]


def test_options_that_are_not_plan_options_are_one_argument_error() -> None:
    """A dict of options was a raw AttributeError."""
    with pytest.raises(ArgumentError, match=r"^options must be a PlanOptions, got dict$"):
        lower(prove(synthesize("stragglar", 4)), {"instances": 2})  # type: ignore[arg-type]
