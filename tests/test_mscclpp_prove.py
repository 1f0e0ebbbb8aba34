"""The MSCCL++ plan prover on hand-written plans: a correct ring and one fixture per kind of bug,
malformed text, unsupported features and executor rules, each with its exact one-line report."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stragglar.errors import ArgumentError, InputError
from stragglar.mscclpp import PlanFormatError, PlanViolationError, UnsupportedPlanError, check_plan, prove
from stragglar.mscclpp.errors import PlanError

FIXTURES = Path(__file__).parent / "fixtures" / "mscclpp"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def ring() -> dict[str, Any]:
    plan: dict[str, Any] = json.loads(fixture("ring_ok.json"))
    return plan


def ops(plan: dict[str, Any], gpu: int, tb: int = 0) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = plan["gpus"][gpu]["threadblocks"][tb]["ops"]
    return result


def test_hand_written_ring_is_proved() -> None:
    proof = prove(fixture("ring_ok.json"))
    assert proof.summary == (
        "proved: ring3: in-place allreduce over 3 GPUs, 3 chunks, 3 thread blocks, 90 ops, "
        "up to 1 thread block per GPU"
    )
    assert proof.details == (
        "scratch up to 4 chunks; 4 interleavings and happens-before: no deadlock, no race, peers touch a "
        "GPU's memory only while it runs, every signal waited for, every chunk on every GPU holds each "
        "GPU's contribution exactly once"
    )
    assert (proof.gpus, proof.threadblocks, proof.ops, proof.chunks) == (3, 3, 90, 3)


@pytest.mark.parametrize(
    ("name", "kind", "place", "message"),
    [
        (
            "missing_wait.json",
            "raw",
            (1, 0, 7),
            "raw race: gpu 1 tb 0 op 7 (re) reads gpu 1 s[0], written by gpu 0 tb 0 op 3 (put), and no "
            "signal/wait chain orders them",
        ),
        (
            "missing_signal.json",
            "deadlock",
            (1, 0, 27),
            "deadlock in interleaving 0: gpu 1 tb 0 op 27 (wait) waits on its memory channel 1 (to GPU 0) "
            "for a "
            "signal no block will send",
        ),
        (
            "wrong_chunk_index.json",
            "result",
            (2, -1, -1),
            "gpu 2 i[0] is wrong in interleaving 0: misses the contributions of GPUs [0, 1, 2]; holds GPU "
            "0's "
            "chunk 1, GPU 1's chunk 1, GPU 2's chunk 1",
        ),
        (
            "wrong_channel_id.json",
            "deadlock",
            (2, 0, 27),
            "deadlock in interleaving 0: gpu 2 tb 0 op 27 (wait) waits on its memory channel 1 (to GPU 1) "
            "for a "
            "signal no block will send",
        ),
        (
            "put_races_read.json",
            "war",
            (0, 0, 10),
            "war race: gpu 0 tb 0 op 10 (put) writes gpu 1 s[0], read by gpu 1 tb 0 op 8 (re), and no "
            "signal/wait chain orders them",
        ),
        (
            "double_count.json",
            "result",
            (1, -1, -1),
            "gpu 1 i[0] is wrong in interleaving 0: counts GPU 0's chunk 0, GPU 1's chunk 0 more than once",
        ),
        (
            "deadlock.json",
            "deadlock",
            (0, 0, 5),
            "deadlock in interleaving 0: gpu 0 tb 0 op 5 (wait) -> gpu 2 tb 0 op 5 (wait) -> gpu 1 tb 0 op 5 "
            "(wait) -> back to the first, each waiting for the next",
        ),
    ],
)
def test_each_bug_fixture_is_reported_where_it_is(
    name: str, kind: str, place: tuple[int, int, int], message: str
) -> None:
    with pytest.raises(PlanViolationError) as info:
        prove(fixture(name))
    v = info.value.violation
    assert (v.kind, (v.gpu, v.tb, v.op), v.message) == (kind, place, message)
    assert str(info.value) == message and "\n" not in message
    assert check_plan(fixture(name)) == v


def mutated(edit: Any) -> str:
    plan = ring()
    edit(plan)
    return json.dumps(plan)


def test_a_signal_without_a_nop_after_the_put_is_a_race_the_runs_cannot_see() -> None:
    # Thread 0 signals while other threads may still be writing the put: values are right in every
    # op-level interleaving, only the happens-before analysis sees it.
    text = mutated(lambda p: ops(p, 0).pop(4))
    with pytest.raises(PlanViolationError, match=r"raw race: gpu 1 tb 0 op 8 \(re\) reads gpu 1 s\[0\]"):
        prove(text)


def test_a_put_before_the_peer_is_ready_is_an_early_access() -> None:
    text = mutated(lambda p: ops(p, 0).__delitem__(1))  # drop gpu 0's wait for gpu 1's ready signal
    violation = check_plan(text)
    assert violation is not None and violation.kind == "early-access"
    assert violation.message.startswith("gpu 0 tb 0 op 2 (put) touches gpu 1 s[0] before GPU 1 is known")


def test_a_put_nobody_waits_for_is_a_late_access() -> None:
    def edit(p: dict[str, Any]) -> None:
        p["gpus"][1]["scratch_chunks"] = 5
        ops(p, 0).append(
            {
                "name": "put",
                "src_buff": [{"type": "i", "index": 0, "size": 1}],
                "dst_buff": [{"buffer_id": 0, "index": 4, "size": 1}],
                "channel_type": "memory",
            }
        )

    violation = check_plan(mutated(edit))
    assert violation is not None and (violation.kind, violation.gpu, violation.op) == ("late-access", 0, 30)


def test_a_signal_nobody_waits_for_is_reported() -> None:
    text = mutated(
        lambda p: ops(p, 2).append({"name": "signal", "channel_ids": [0], "channel_type": "memory"})
    )
    violation = check_plan(text)
    assert violation is not None and violation.kind == "unmatched-signal"
    assert violation.message == (
        "1 signal(s) to GPU 0 on its memory channel 1 (to GPU 2) are never waited for (the last by gpu 2 "
        "tb 0 op "
        "30 (signal)); they would release a wait of the next execution early"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "{not json",
            "not JSON: Expecting property name enclosed in double quotes at line 1 column 2",
        ),
        ("[]", "not an MSCCL++ execution plan: the top level must be an object"),
        (json.dumps({"name": "x"}), "plan: missing key 'collective'"),
    ],
)
def test_malformed_text_is_a_format_error(text: str, message: str) -> None:
    with pytest.raises(PlanFormatError) as info:
        prove(text)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda p: p.update(inplace="yes"), "plan: 'inplace' must be true or false, got \"yes\""),
        (
            lambda p: ops(p, 1).__setitem__(3, {"name": "teleport"}),
            "gpu 1 tb 0 op 3: unknown op 'teleport' (the executor throws 'Invalid operation type')",
        ),
        (
            lambda p: ops(p, 1)[3]["src_buff"][0].update(type="x"),
            "gpu 1 tb 0 op 3 (put) src_buff[0]: unknown buffer type 'x'",
        ),
        (
            lambda p: ops(p, 0)[3]["dst_buff"][0].update(index=-1),
            "gpu 0 tb 0 op 3 (put) dst_buff[0]: 'index' must not be negative, got -1",
        ),
        (  # was "not a correct AllReduce" (exit 1): past 64 bits the executor reads another number
            lambda p: ops(p, 0)[3]["src_buff"][0].update(index=10**20),
            "gpu 0 tb 0 op 3 (put) src_buff[0]: 'index' must fit 64 bits, got 100000000000000000000",
        ),
        (
            lambda p: ops(p, 2)[5].update(channel_ids=[0.5]),
            "gpu 2 tb 0 op 5 (signal): 'channel_ids' must be a list of non-negative integers",
        ),
        (lambda p: p["gpus"][0].pop("threadblocks"), "gpu 0: missing key 'threadblocks'"),
        (
            lambda p: p.update(buffer_alignment=3),
            "plan: 'buffer_alignment' must be a positive multiple of 16 below 2^32 (a uint32_t; the kernel "
            "addresses chunks in 16-byte vectors), got 3",
        ),
        (
            lambda p: p.update(max_message_size=2**70),
            "plan: 'max_message_size' must be an integer from 0 to 2^64-1 (the executor keeps it in 64 "
            "bits), got 1180591620717411303424",
        ),
    ],
)
def test_wrong_keys_and_types_are_format_errors(edit: Any, message: str) -> None:
    with pytest.raises(PlanFormatError) as info:
        prove(mutated(edit))
    assert str(info.value) == message
    assert not isinstance(info.value, (PlanViolationError, UnsupportedPlanError))


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda p: p.update(collective="allgather"),
            "plan: unsupported collective 'allgather': this prover checks allreduce plans only",
        ),
        (
            lambda p: p.update(protocol="LL"),
            "plan: unsupported protocol LL (packets): this prover models Simple plans only",
        ),
        (
            lambda p: ops(p, 0).__setitem__(3, {"name": "ppkt"}),
            "gpu 0 tb 0 op 3 (ppkt): unsupported op ppkt (LL packet op): not modelled by this prover",
        ),
        (
            lambda p: ops(p, 1).__setitem__(0, {"name": "glres"}),
            "gpu 1 tb 0 op 0 (glres): unsupported op glres (NVLS switch op): not modelled by this prover",
        ),
        (
            lambda p: ops(p, 1).__setitem__(0, {"name": "pws"}),
            "gpu 1 tb 0 op 0 (pws): unsupported op pws (port-channel op): not modelled by this prover",
        ),
        (
            lambda p: ops(p, 1).__setitem__(0, {"name": "pipeline"}),
            "gpu 1 tb 0 op 0 (pipeline): unsupported op pipeline (pipelined loop): not modelled by this "
            "prover",
        ),
        (
            lambda p: p["gpus"][1]["channels"].append({"channel_type": "port", "connected_to": [0]}),
            "gpu 1 channels[1]: unsupported port channel: this prover models memory channels only",
        ),
        (
            lambda p: ops(p, 0)[3].update(tbg_info={"tb_id": 0, "tbg_size": 2}),
            "gpu 0 tb 0 op 3 (put): unsupported tbg_info: thread-block groups split chunks below chunk "
            "granularity",
        ),
        (
            lambda p: ops(p, 0)[8].update(reduce_op="max"),
            'gpu 0 tb 0 op 8 (re): unsupported reduce_op "max": the kernel always sums',
        ),
        (
            lambda p: p["gpus"][0].update(scratch_chunks=2**40),
            "gpu 0: 1,099,511,627,776 scratch chunks: stragglar proves plans of at most 65,536 per buffer",
        ),
        (
            lambda p: p["gpus"][0].update(scratch_chunks=2**63),
            "gpu 0: 9,223,372,036,854,775,808 scratch chunks: stragglar proves plans of at most 65,536 per "
            "buffer",
        ),
        (
            lambda p: p.update(gpus=p["gpus"] * 1025),
            "plan: 3,075 GPUs: stragglar proves plans of at most 2,048",
        ),
        (
            lambda p: p.update(
                gpus=[
                    dict(p["gpus"][0], id=g, scratch_chunks=2**16, channels=[], remote_buffers=[])
                    for g in range(200)
                ]
            ),
            "gpu 191: 12,584,064 chunks in the GPUs' buffers so far: stragglar proves plans of at most "
            "12,582,912 in all",
        ),
        (  # 54 KB of plan, 22 GB and 2 minutes to prove: every chunk's set of the 524,288 cells
            lambda p: [g.update(input_chunks=2**16, output_chunks=2**16) for g in p["gpus"]],
            "plan: 393,228 chunks in the GPUs' buffers, each tracked over 196,608 (GPU, input chunk) cells: "
            "stragglar proves plans where the two multiply to at most 8,589,934,592",
        ),
        (
            lambda p: p.update(use_double_scratch_buffer=True),
            "plan: unsupported use_double_scratch_buffer: Simple puts write the peer's scratch without the "
            "alternating half offset (execution_kernel.hpp handlePut)",
        ),
    ],
)
def test_what_the_prover_does_not_model_is_refused_not_guessed(edit: Any, message: str) -> None:
    with pytest.raises(UnsupportedPlanError) as info:
        prove(mutated(edit))
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("edit", "kind", "message"),
    [
        (
            lambda p: p["gpus"][1].update(id=2),
            "structure",
            "gpu 1: has id 2; the executor takes gpus[rank] and needs id == rank",
        ),
        (
            lambda p: p["gpus"][0]["threadblocks"][0].update(id=1),
            "structure",
            "gpu 0 tb 0: has id 1; the executor files ops by position and channels by id",
        ),
        (
            lambda p: ops(p, 1)[5].update(channel_ids=[2]),
            "structure",
            "gpu 1 tb 0 op 5 (signal): channel id 2 is not one of this block's 2 memory channels",
        ),
        (
            lambda p: ops(p, 1)[5].pop("channel_type"),
            "structure",
            "gpu 1 tb 0 op 5 (signal): has no channel_type 'memory', so the kernel's handler does nothing",
        ),
        (
            lambda p: ops(p, 1)[3]["dst_buff"][0].update(index=4),
            "bounds",
            "gpu 1 tb 0 op 3 (put) dst_buff[0]: chunks 4..4 of GPU 2's 's' buffer, which has 4",
        ),
        (
            lambda p: ops(p, 1)[3]["dst_buff"][0].update(buffer_id=1),
            "structure",
            "gpu 1 tb 0 op 3 (put) dst_buff[0]: buffer_id 1 is not one of this block's 1 remote buffers",
        ),
        (
            lambda p: ops(p, 0).extend([{"name": "nop"}] * 40),
            "limit",
            "gpu 0 tb 0: has 70 ops; the executor refuses more than 64 (MAX_OPERATION)",
        ),
        (
            lambda p: ops(p, 0)[8]["dst_buff"].append({"type": "i", "index": 0, "size": 1}),
            "structure",
            "gpu 0 tb 0 op 8 (re): dst_buff must be one local buffer, got local, local",
        ),
        (
            lambda p: p["gpus"][2].update(output_chunks=6),
            "structure",
            "gpu 2: has 6 output chunks and 3 input chunks; an allreduce's equal input and output sizes "
            "then give "
            "different chunk sizes and the executor throws",
        ),
        (
            lambda p: p.update(min_message_size=4096, max_message_size=1024),
            "structure",
            "plan: no buffer size selects the plan: min_message_size 4096 > max_message_size 1024",
        ),
        (
            lambda p: p.update(min_message_size=49, max_message_size=95),
            "structure",
            "plan: no buffer size selects the plan: no multiple of 48 bytes (16-byte alignment x 3 chunks) "
            "in [49, 95]",
        ),
    ],
)
def test_executor_rules_are_violations_with_their_place(edit: Any, kind: str, message: str) -> None:
    with pytest.raises(PlanViolationError) as info:
        prove(mutated(edit))
    assert (info.value.violation.kind, str(info.value)) == (kind, message)


def test_out_of_place_plans_must_leave_the_input_alone() -> None:
    plan = ring()
    plan["inplace"] = False
    with pytest.raises(PlanViolationError, match="writes GPU 0's input buffer in an out-of-place plan"):
        prove(json.dumps(plan))


def test_out_of_place_ring_writing_the_output_is_proved() -> None:
    plan = ring()
    plan["inplace"] = False
    for g in range(3):
        body = ops(plan, g)
        # reduce into the output instead of the input, and read/send from the output once written
        for op in body:
            for ref in op.get("dst_buff", []):
                if ref.get("type") == "i":
                    ref["type"] = "o"
        written: set[int] = set()
        for op in body:
            if op["name"] == "re":
                src = op["src_buff"][0]
                if src["index"] in written:
                    src["type"] = "o"
                written.add(op["dst_buff"][0]["index"])
            elif op["name"] == "copy":
                written.add(op["dst_buff"][0]["index"])
            elif op["name"] == "put" and op["src_buff"][0]["index"] in written:
                op["src_buff"][0]["type"] = "o"
    proof = prove(json.dumps(plan))
    assert proof.summary.startswith("proved: ring3: out-of-place allreduce over 3 GPUs")
    ops(plan, 1)[29]["dst_buff"][0]["type"] = "i"
    violation = check_plan(json.dumps(plan))
    assert violation is not None and (violation.kind, violation.op) == ("structure", 29)
    ops(plan, 1)[29]["dst_buff"][0]["type"] = "o"
    # o[1] of GPU 1 is written only by its first allgather copy; send that copy elsewhere and the
    # output keeps what it held before the call.
    ops(plan, 1)[22]["dst_buff"][0]["index"] = 2
    violation = check_plan(json.dumps(plan))
    assert (
        violation is not None
        and violation.kind == "result"
        and "holds data nobody wrote" in violation.message
    )


def test_interleavings_must_be_a_count_a_caller_can_wait_for() -> None:
    """10**30 interleavings ran until killed; a NumPy integer is an integer here as elsewhere."""
    with pytest.raises(InputError, match="interleavings must be at least 1, got 0"):
        prove(fixture("ring_ok.json"), interleavings=0)
    with pytest.raises(InputError, match=r"interleavings must be at most 10,000, got 1,000,000$"):
        prove(fixture("ring_ok.json"), interleavings=10**6)
    with pytest.raises(ArgumentError, match="interleavings must be an integer"):
        prove(fixture("ring_ok.json"), interleavings=2.0)  # type: ignore[arg-type]
    assert prove(fixture("ring_ok.json"), interleavings=np.int64(2)).interleavings == 2


def test_every_error_is_one_line() -> None:
    texts = [fixture(p.name) for p in sorted(FIXTURES.glob("*.json"))]
    for text in [*texts, mutated(lambda p: p.update(protocol="LL")), "{"]:
        try:
            prove(text)
        except PlanError as exc:
            assert "\n" not in str(exc)


def test_the_prover_does_not_depend_on_dict_order() -> None:
    plan = ring()
    shuffled = copy.deepcopy(plan)
    for gpu in shuffled["gpus"]:
        gpu["threadblocks"] = [dict(reversed(list(tb.items()))) for tb in gpu["threadblocks"]]
    assert prove(json.dumps(shuffled)).summary == prove(json.dumps(plan)).summary


def one_gpu(
    ops0: list[dict[str, Any]], ops1: list[dict[str, Any]], semaphores: int = 0, init_value: int = 0
) -> str:
    """One GPU, two thread blocks passing chunk 0 through scratch and back (an identity AllReduce)."""
    return json.dumps(
        {
            "name": "one",
            "collective": "allreduce",
            "protocol": "Simple",
            "inplace": True,
            "gpus": [
                {
                    "id": 0,
                    "input_chunks": 1,
                    "output_chunks": 1,
                    "scratch_chunks": 1,
                    "channels": [],
                    "remote_buffers": [],
                    "semaphores": [{"init_value": init_value}] * semaphores,
                    "threadblocks": [
                        {"id": 0, "channels": [], "ops": ops0},
                        {"id": 1, "channels": [], "ops": ops1},
                    ],
                }
            ],
        }
    )


TO_SCRATCH = {
    "name": "copy",
    "src_buff": [{"type": "i", "index": 0, "size": 1}],
    "dst_buff": [{"type": "s", "index": 0, "size": 1}],
}
FROM_SCRATCH = {
    "name": "copy",
    "src_buff": [{"type": "s", "index": 0, "size": 1}],
    "dst_buff": [{"type": "i", "index": 0, "size": 1}],
}


def test_blocks_of_one_gpu_ordered_by_a_barrier() -> None:
    barrier = {"name": "barrier", "barrier_id": 0, "num_threadblocks": 2}
    assert prove(one_gpu([TO_SCRATCH, barrier], [barrier, FROM_SCRATCH])).threadblocks == 2
    violation = check_plan(one_gpu([TO_SCRATCH], [FROM_SCRATCH]))
    # which access the analysed run meets first decides the kind; either way it names both ops
    assert violation is not None and violation.kind in ("raw", "war")
    assert violation.message.endswith("and no nop, barrier or semaphore orders them")
    stuck = {"name": "barrier", "barrier_id": 0, "num_threadblocks": 3}
    violation = check_plan(one_gpu([TO_SCRATCH, stuck], [stuck, FROM_SCRATCH]))
    assert violation is not None and violation.kind == "deadlock"
    assert "waits on the other blocks of its barrier" in violation.message


def test_blocks_of_one_gpu_ordered_by_a_device_semaphore() -> None:
    release: list[dict[str, Any]] = [{"name": "nop"}, {"name": "sem_release", "semaphore_ids": [0]}]
    acquire: list[dict[str, Any]] = [{"name": "sem_acquire", "semaphore_ids": [0]}, {"name": "nop"}]
    assert prove(one_gpu([TO_SCRATCH, *release], [*acquire, FROM_SCRATCH], semaphores=1)).ops == 6
    # without the nop before the release, other threads may still be copying when it is released
    violation = check_plan(one_gpu([TO_SCRATCH, release[1]], [*acquire, FROM_SCRATCH], semaphores=1))
    assert violation is not None and violation.kind == "raw"
    # an acquire nobody releases never returns; a release nobody acquires leaves the semaphore at 1
    violation = check_plan(one_gpu([TO_SCRATCH], [*acquire, FROM_SCRATCH], semaphores=1))
    assert violation is not None and violation.kind == "deadlock"
    violation = check_plan(one_gpu([TO_SCRATCH, *release, FROM_SCRATCH], [], semaphores=1))
    assert violation is not None and violation.message == (
        "gpu 0 device semaphore 0 ends at 1, not its initial 0: "
        "the next execution would start from the wrong value"
    )


def test_relaxed_signals_order_execution_but_not_data() -> None:
    def relaxed(p: dict[str, Any]) -> None:
        for g in range(3):
            for op in ops(p, g)[3:]:  # keep the ready handshake as it is
                if op["name"] in ("signal", "wait"):
                    op["name"] = "rlx" + op["name"]

    violation = check_plan(mutated(relaxed))
    assert violation is not None and violation.kind == "raw"

    # relaxed only for the ready handshake (execution order: the peer has started) is fine
    def relaxed_ready(p: dict[str, Any]) -> None:
        for g in range(3):
            ops(p, g)[0]["name"], ops(p, g)[1]["name"] = "rlxsignal", "rlxwait"

    assert prove(mutated(relaxed_ready)).gpus == 3


def test_the_prover_shares_no_code_with_the_lowering() -> None:
    import ast

    prover = Path(__file__).parent.parent / "stragglar" / "mscclpp" / "prover"
    modules = sorted(prover.glob("*.py"))
    assert {m.stem for m in modules} >= {"read", "ops", "parsed", "machine", "order", "prove"}
    # the lowering, what imports it (the package, the registration) and what the prover does not use
    lowering = ("lowering", "sizes", "summary", "register")
    for module in modules:
        tree = ast.parse(module.read_text())
        imported = {
            node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
        } | {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
        shared = {
            name
            for name in imported
            if name == "stragglar.mscclpp"
            or name.startswith(tuple(f"stragglar.mscclpp.{m}" for m in lowering))
        }
        assert not shared, (module.name, shared)


@pytest.mark.parametrize("init_value", [1 << 31, -(1 << 31) - 1, 1 << 70])
def test_a_semaphore_value_past_the_executor_s_32_bit_int_is_malformed(init_value: int) -> None:
    """The executor reads ``init_value`` into an ``int``: a value it cannot hold is not a plan it
    runs as written (it was judged, exit 1, as if the semaphore held it)."""
    nop: dict[str, Any] = {"name": "nop"}
    with pytest.raises(PlanFormatError, match=r"semaphores\[0\]: 'init_value' must fit a 32-bit int"):
        prove(one_gpu([nop], [nop], semaphores=1, init_value=init_value))
    assert check_plan(one_gpu([nop], [nop], semaphores=1, init_value=(1 << 31) - 1)) is None  # it holds that


def test_a_negative_initial_value_holds_an_acquire_for_one_release_as_the_executor_does() -> None:
    """MSCCL++'s ``acquire`` decrements, and when the old value was not positive waits only until
    the value is back to it: one release, however negative the start.  So an acquire on a
    semaphore that starts at -1 does not wait for two releases, and a plan that counts on it races
    (it was proved, as if the semaphore counted)."""
    nop: dict[str, Any] = {"name": "nop"}
    release: dict[str, Any] = {"name": "sem_release", "semaphore_ids": [0]}
    acquire: dict[str, Any] = {"name": "sem_acquire", "semaphore_ids": [0]}
    releaser = [release, TO_SCRATCH, nop, release]  # the copy lies between the two releases
    acquirer = [acquire, nop, FROM_SCRATCH, acquire]  # reads the scratch after the first acquire
    violation = check_plan(one_gpu(releaser, acquirer, semaphores=1, init_value=-1))
    assert violation is not None and violation.kind in ("raw", "war"), violation
    # the reads after a second acquire: where both releases come first, the first acquire passes
    # (1 > 0), the second finds 0 and waits for a third release that never comes
    violation = check_plan(
        one_gpu(releaser, [acquire, acquire, nop, FROM_SCRATCH], semaphores=1, init_value=-1)
    )
    assert violation is not None and violation.kind == "deadlock", violation
    # from 0, the same two acquires count two releases: proved
    assert prove(one_gpu(releaser, [acquire, acquire, nop, FROM_SCRATCH], semaphores=1)).ops == 8
