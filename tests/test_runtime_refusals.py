"""allreduce across gloo ranks where one rank's own data cannot take part (stragglar/runtime/refusals.py):
that rank raises its own error after the header's gather, and its peers at once a MismatchError
naming it, not a timeout; a program that catches the errors and calls again stays in step.

Before, data that is no torch tensor on a torch group, and a CPU tensor (or a NumPy array) for
``engine="device"``, were refused by that rank alone before the gather: its peers waited in the
gather until their timeout, and a rank that called again at once paired its next call with their
pending one."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from stragglar.errors import ArgumentError, InputError  # noqa: E402
from stragglar.measure.data import expected, payload  # noqa: E402
from stragglar.measure.launch import launch  # noqa: E402
from stragglar.runtime import allreduce  # noqa: E402
from stragglar.synth import synthesize  # noqa: E402
from stragglar.verify import Proof, prove  # noqa: E402

DEVICE_ONLY = "the device engine runs on CuPy arrays or torch CUDA tensors"
TIMEOUT = 30.0  # the peers' header check would wait this long for a rank that refused alone
NOT_A_TENSOR = "cannot allreduce: rank 1 has data that is not a torch tensor, on a torch process group"
NOT_ON_DEVICE = (
    "cannot allreduce: rank 1 has a buffer the device engine cannot run on (neither a CuPy array nor a "
    "torch CUDA tensor)"
)


def one_rank_at_fault(rank: int, n: int, proof: Proof, case: str) -> tuple[tuple[str, str], bool]:
    """Rank 1 brings data its call refuses (``case``), the others a good call; every rank catches
    its error and calls again at once with good data.  Returns (the first call's error type and
    message, whether the second call summed exactly)."""
    data: Any = torch.from_numpy(payload(rank, 40, n, "float32"))
    engine = "rounds"
    if rank == 1:
        if case == "numpy":  # no tensor on a torch group
            data = payload(rank, 40, n, "float32")
        elif case == "list":
            data = [0.0] * 40
        elif case == "device cpu":  # the device engine on a CPU tensor
            engine = "device"
        elif case == "device numpy":
            data, engine = payload(rank, 40, n, "float32"), "device"
    try:
        allreduce(data, proof, timeout=TIMEOUT, engine=engine)
        said = ("", "")
    except Exception as e:
        said = (type(e).__name__, str(e))
    again = torch.from_numpy(payload(rank, 40, n, "float32"))
    allreduce(again, proof, timeout=TIMEOUT)  # paired with the peers' second call, not their first
    return said, bool(np.array_equal(again.numpy(), expected(40, n, "float32")))


def outcomes(case: str) -> list[tuple[tuple[str, str], bool]]:
    # the launcher's own timeout is past the peers' wait: a peer that waited says so, as a result
    result: list[tuple[tuple[str, str], bool]] = launch(
        one_rank_at_fault, 3, (prove(synthesize("stragglar", 3)), case), timeout=2 * TIMEOUT
    )
    return result


@pytest.mark.parametrize("case", ["numpy", "list"])
def test_data_that_is_no_tensor_on_a_torch_group_is_named_to_the_peers_at_once(case: str) -> None:
    results = outcomes(case)
    kind = "ndarray" if case == "numpy" else "list"
    assert results[1] == (
        (
            "ArgumentError",
            f"cannot allreduce a {kind} across processes: pass a torch tensor, or an array with an "
            "NcclGroup (allreduce_local takes one array per rank)",
        ),
        True,
    )
    assert results[0] == results[2] == (("MismatchError", NOT_A_TENSOR), True)


@pytest.mark.parametrize("case", ["device cpu", "device numpy"])
def test_the_device_engine_on_a_buffer_off_the_gpu_is_named_to_the_peers_at_once(case: str) -> None:
    results = outcomes(case)
    got = "torch CPU tensors" if case == "device cpu" else "NumPy arrays"
    own = f"{DEVICE_ONLY}, not {got}"
    assert results[1] == (("InputError", own), True)
    assert results[0] == results[2] == (("MismatchError", NOT_ON_DEVICE), True)


def every_rank_on_the_device_engine(rank: int, n: int, proof: Proof) -> str:
    """Every rank asks the device engine for a CPU tensor: each raises its own error, none waits."""
    try:
        allreduce(torch.zeros(8), proof, timeout=TIMEOUT, engine="device")
    except InputError as e:
        return str(e)
    return "accepted"


def test_every_rank_at_fault_raises_its_own_error() -> None:
    results = launch(every_rank_on_the_device_engine, 2, (prove(synthesize("ring", 2)),), timeout=2 * TIMEOUT)
    assert results == [f"{DEVICE_ONLY}, not torch CPU tensors"] * 2


def test_without_a_process_group_the_refusal_is_raised_at_once() -> None:
    """No group to carry a header (none initialised here): this rank's refusal, as before."""
    proof = prove(synthesize("ring", 2))
    with pytest.raises(ArgumentError, match=r"^cannot allreduce a ndarray across processes: pass a torch"):
        allreduce(np.zeros(4, np.float32), proof)
    with pytest.raises(InputError) as e:
        allreduce(torch.zeros(4), proof, engine="device")
    assert str(e.value) == f"{DEVICE_ONLY}, not torch CPU tensors"
    with pytest.raises(InputError) as e:
        allreduce(np.zeros(4, np.float32), proof, group="world", engine="device")
    assert str(e.value) == f"{DEVICE_ONLY}, not NumPy arrays"
    with pytest.raises(InputError, match=r"^async_op applies to engine 'device'"):  # options: at once
        allreduce(np.zeros(4, np.float32), proof, async_op=True)


def a_second_call_on_a_busy_tag(rank: int, n: int, proof: Proof) -> dict[str, tuple[str, str]]:
    """Rank 0 runs a call on tag 0 in a thread while its main thread passes a NumPy array on the
    same tag; rank 1 comes late to the first call.  What each of rank 0's calls raised."""
    if rank == 1:
        time.sleep(1.0)  # rank 0's second call is made while its first waits for this rank
        allreduce(torch.ones(8), proof, timeout=TIMEOUT)
        return {}
    said: dict[str, tuple[str, str]] = {}

    def first() -> None:
        try:
            allreduce(torch.ones(8), proof, timeout=TIMEOUT)
            said["first"] = ("", "")
        except Exception as e:
            said["first"] = (type(e).__name__, str(e))

    thread = threading.Thread(target=first)
    thread.start()
    time.sleep(0.3)
    try:
        allreduce(np.zeros(8, np.float32), proof, timeout=TIMEOUT)
    except Exception as e:
        said["second"] = (type(e).__name__, str(e))
    thread.join()
    return said


def test_data_refused_on_a_busy_tag_says_its_own_problem_first() -> None:
    """The refused call meets the tag held by another call of its process: its own error (the
    data), chained to the busy tag's, not the busy tag's alone; the call that held the tag fails
    too, as the channels' rule says of any call that another one tried to overlap."""
    said, _ = launch(a_second_call_on_a_busy_tag, 2, (prove(synthesize("ring", 2)),), timeout=2 * TIMEOUT)
    kind, message = said["second"]
    assert kind == "ArgumentError" and message.startswith("cannot allreduce a ndarray across processes"), said
    assert said["first"][0] == "InputError" and "another allreduce started on tag 0" in said["first"][1], said
