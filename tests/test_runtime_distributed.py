"""allreduce across gloo ranks: disagreeing ranks fail together and clearly, the header check
honours the timeout, and every algorithm waits for a late rank."""

from __future__ import annotations

import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from stragglar.errors import ArgumentError, InputError  # noqa: E402
from stragglar.measure.data import expected, payload  # noqa: E402
from stragglar.measure.launch import LaunchError, launch  # noqa: E402
from stragglar.runtime import Timeline, allreduce  # noqa: E402
from stragglar.synth import synthesize  # noqa: E402
from stragglar.verify import Proof, prove  # noqa: E402

CASES = (
    "dtype",
    "count",
    "straggler",
    "complex",
    "strided",
    "grad",
    "inference",
    "sparse",
    "meta",
    "size",
    "ok",
)


def disagreeing_rank(rank: int, n: int, proofs: dict[str, Proof]) -> dict[str, tuple[str, str, bool]]:
    """For each case rank 1 differs in one way; returns (error type, message, data untouched)."""
    out = {}
    for case in CASES:
        data = torch.from_numpy(payload(rank, 40, n, "float32")).float()
        proof = proofs["main"]
        if rank == 1:
            if case == "dtype":
                data = data.double()
            elif case == "count":
                data = data[:39].clone()
            elif case == "straggler":
                proof = proofs["other"]
            elif case == "complex":
                data = data.to(torch.complex64)
            elif case == "strided":
                data = torch.stack([data, data], 1)[:, 0]
            elif case == "grad":  # a leaf's view: torch refuses in-place writes to it
                data = data.requires_grad_().view(40)
            elif case == "inference":
                with torch.inference_mode():
                    data = data.clone()
            elif case == "sparse":  # torch raised from deep inside, and the others lost the connection
                data = data.to_sparse()
            elif case == "meta":  # refused by this rank alone, before the gather: its peers' call
                data = torch.zeros(40, device="meta")  # then paired with its next one (a wrong sum)
        if case == "size":
            proof = proofs["small"]
        before = data.detach().clone()
        try:
            allreduce(data, proof, timeout=10)
            out[case] = ("", "", True)
        except Exception as e:
            # to_dense: sparse too; a meta tensor has nothing to touch
            untouched = data.is_meta or torch.equal(data.detach().to_dense(), before.to_dense())
            out[case] = (type(e).__name__, str(e), bool(untouched))
    buf = torch.from_numpy(payload(rank, 40, n, "float32")).float()
    allreduce(buf, proofs["main"], timeout=10)  # the group still works afterwards
    assert np.array_equal(buf.double().numpy(), expected(40, n, "float32"))
    return out


def test_every_rank_raises_the_same_clear_error_when_ranks_disagree() -> None:
    proofs = {
        "main": prove(synthesize("stragglar", 3)),
        "other": prove(synthesize("stragglar", 3, straggler=0)),
        "small": prove(synthesize("ring", 2)),
    }
    results = launch(disagreeing_rank, 3, (proofs,), timeout=30)
    for case in ("dtype", "count", "straggler"):
        seen = {results[r][case] for r in range(3)}
        assert len(seen) == 1, seen  # the same error and message on every rank, no data moved
        kind, message, untouched = seen.pop()
        assert kind == "MismatchError" and untouched and "\n" not in message
        assert message.startswith("ranks disagree on the allreduce: "), message
    assert results[0]["dtype"][1].endswith("dtype: ranks 0, 2 have float32, rank 1 has float64")
    assert results[0]["count"][1].endswith("element count: ranks 0, 2 have 40, rank 1 has 39")
    straggler = results[0]["straggler"][1]
    assert "ranks 0, 2 run the 'stragglar' schedule for 3 ranks (straggler 2, fingerprint " in straggler
    assert "rank 1 runs the 'stragglar' schedule for 3 ranks (straggler 0, fingerprint " in straggler
    # a rank that cannot take part raises its own error; the others say which rank and why
    assert results[1]["complex"][0] == "ArgumentError" and "supported dtypes" in results[1]["complex"][1]
    assert results[1]["strided"][0] == "InputError" and "contiguous" in results[1]["strided"][1]
    assert results[1]["grad"][0] == "InputError" and "does not require grad" in results[1]["grad"][1]
    assert results[1]["inference"][0] == "InputError" and "inference_mode" in results[1]["inference"][1]
    assert results[1]["sparse"][:2] == (
        "InputError",
        "allreduce writes a dense tensor in place, got a sparse_coo one: pass tensor.to_dense()",
    )
    assert results[1]["grad"][2] and results[1]["inference"][2]  # refused before anything was written
    assert results[1]["meta"][:2] == ("InputError", "allreduce needs data to sum: a meta tensor holds none")
    for r in (0, 2):
        for case in ("grad", "inference", "sparse"):
            assert results[r][case] == (
                "MismatchError",
                "cannot allreduce: rank 1 has a buffer it cannot write in place (it requires grad, or is "
                "an inference tensor, read-only memory or sparse)",
                True,
            )
        assert results[r]["complex"][:2] == (
            "MismatchError",
            "cannot allreduce: rank 1 has a buffer of a dtype no engine here supports",
        )
        assert results[r]["strided"][:2] == (
            "MismatchError",
            "cannot allreduce: rank 1 has a buffer that is not contiguous",
        )
        assert results[r]["meta"] == (
            "MismatchError",
            "cannot allreduce: rank 1 has a buffer whose values are not its data (a meta tensor, or a "
            "masked array)",
            True,
        )
    for r in range(3):
        kind, message, untouched = results[r]["size"]
        assert kind == "MismatchError" and untouched
        assert message.startswith("the 'ring' schedule for 2 ranks (no straggler, fingerprint ")
        assert message.endswith(") cannot run on a group of 3 ranks")
        assert results[r]["ok"] == ("", "", True)


def strided_on_a_checked_channel(rank: int, n: int, proof: Proof) -> None:
    """One call that checks its channel, then rank 1 alone brings a strided buffer: it checks and
    its peer, whose setup is the channel's, does not; both wait for their timeout."""
    allreduce(torch.ones(8), proof, timeout=2)
    allreduce(torch.ones(16)[::2] if rank == 1 else torch.ones(8), proof, timeout=2)


def test_a_rank_whose_check_times_out_raises_its_own_problem() -> None:
    """Rank 1 knew its buffer was not contiguous before sending anything, and said it timed out
    waiting for rank 0."""
    with pytest.raises(LaunchError) as info:
        launch(strided_on_a_checked_channel, 2, (prove(synthesize("ring", 2)),), timeout=30)
    own, peer = str(info.value.failures[1]), info.value.failures[0]
    assert "InputError" in own and "contiguous" in own, own
    # its peer waited in the rounds: by its own timeout, or sooner where gloo closed the pair
    assert peer.reason in ("timed out", "lost the connection") and peer.peer == 1, peer


def silent_at_the_header(rank: int, n: int, proof: Proof) -> None:
    if rank == 2:
        time.sleep(2.0)  # alive but silent: never joins the header check
        raise RuntimeError("rank 2 gave up")
    allreduce(torch.ones(8), proof, timeout=0.5)


def test_the_header_check_honours_the_timeout() -> None:
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(silent_at_the_header, 3, (prove(synthesize("ring", 3)),), timeout=20)
    assert time.monotonic() - start < 10
    for rank in (0, 1):
        failure = info.value.failures[rank]
        assert failure.reason == "timed out", failure
        # gloo's header goes peer to peer, so the rank that never sent its own is named
        assert failure.what == "timed out checking that every rank runs the same allreduce waiting for rank 2"
        assert failure.peer == 2 and failure.detail.rstrip().endswith(
            "waiting for rank 2: no answer within 0.5 s"
        ), failure
    first = str(info.value).splitlines()[0]
    assert first.startswith("3 of 3 ranks failed: rank 2 raised RuntimeError: rank 2 gave up; "), first
    assert "ranks 0, 1 timed out checking that every rank runs the same allreduce waiting for rank 2" in first


def two_silent_at_the_header(rank: int, n: int, proof: Proof) -> None:
    if rank >= 2:
        time.sleep(2.0)
        raise RuntimeError(f"rank {rank} gave up")
    allreduce(torch.ones(8), proof, timeout=0.5)


def test_a_header_check_that_times_out_names_every_rank_that_never_answered() -> None:
    with pytest.raises(LaunchError) as info:
        launch(two_silent_at_the_header, 4, (prove(synthesize("ring", 4)),), timeout=20)
    for rank in (0, 1):
        failure = info.value.failures[rank]
        assert failure.reason == "timed out" and failure.peer == 2, failure
        said = "waiting for rank 2: no answer from ranks 2, 3 within 0.5 s"
        assert failure.detail.rstrip().endswith(said), failure


def late_timelines(rank: int, n: int, proofs: list[Proof], delay: float) -> list[Timeline]:
    out = []
    for i, proof in enumerate(proofs):
        buf = torch.from_numpy(payload(rank, 4096, n, "int64"))
        late = 1 if i == len(proofs) - 1 else None  # the last one: a late rank asked for
        out.append(allreduce(buf, proof, straggler_delay=delay, timeout=20, late_rank=late, tag=0))
        assert np.array_equal(buf.numpy(), expected(4096, n, "int64"))
    return out


def test_every_algorithm_waits_for_the_late_rank_on_torch() -> None:
    proofs = [prove(synthesize(a, 4)) for a in ("ring", "direct", "stragglar", "ring")]
    per_rank = launch(late_timelines, 4, (proofs, 0.15), timeout=30)
    for i, proof in enumerate(proofs):
        default = proof.schedule.straggler if proof.schedule.straggler is not None else 3
        late = 1 if i == len(proofs) - 1 else default
        timelines = [per_rank[r][i] for r in range(4)]
        arrived = timelines[late].arrived
        assert arrived - timelines[late].start >= 0.15
        for t in timelines:  # nobody finishes before the late rank's data could reach it
            assert t.done >= arrived, (proof.schedule.algorithm, t.rank)
            if t.rank != late:
                assert t.arrived - t.start < 0.1  # the others did not sleep


def test_arguments_that_do_not_apply_are_refused_before_the_group_is_touched() -> None:
    """A group named by a string was a raw ValueError from torch; a masked array (no tensor) and a
    non-bool stream_ordered were taken as given."""
    proof = prove(synthesize("stragglar", 2))
    with pytest.raises(
        ArgumentError, match=r"^group must be a torch process group or None \(the world\), got 'world'"
    ):
        allreduce(torch.zeros(4), proof, group="world")
    with pytest.raises(InputError) as e:  # what new_group gives a rank it leaves out
        allreduce(torch.zeros(4), proof, group=torch.distributed.GroupMember.NON_GROUP_MEMBER)
    assert str(e.value) == (
        "group is GroupMember.NON_GROUP_MEMBER: this rank is not in that group (new_group gives that to the "
        "ranks it leaves out); only the group's ranks may use it"
    )
    with pytest.raises(ArgumentError, match=r"^stream_ordered must be True or False, got 'yes'$"):
        allreduce(torch.zeros(4), proof, stream_ordered="yes")  # type: ignore[call-overload]
    with pytest.raises(
        ArgumentError, match=r"^cannot allreduce a MaskedArray across processes: pass a torch"
    ):
        allreduce(np.ma.masked_array(np.zeros(4)), proof)  # (with an NcclGroup its header says "no data")
    with pytest.raises(InputError, match=r"^allreduce needs a process group: call torch.distributed.init"):
        allreduce(torch.zeros(4), proof)  # was torch's raw ValueError
    with pytest.raises(ArgumentError, match=r"^expected a Proof, got Schedule: prove the schedule first"):
        allreduce(torch.zeros(4), proof.schedule)  # type: ignore[call-overload]
    with pytest.raises(InputError, match=r"^graphs applies to stream-ordered rounds"):
        allreduce(torch.zeros(4), proof, graphs=False)
    with pytest.raises(ArgumentError, match=r"^graphs must be True or False, got 1$"):
        allreduce(torch.zeros(4), proof, stream_ordered=True, graphs=1)  # type: ignore[call-overload]


def stream_ordered_rank(rank: int, n: int, proof: Proof) -> str:
    try:
        allreduce(torch.ones(4), proof, stream_ordered=True, timeout=10)
    except InputError as e:
        return str(e)
    return "accepted"


def test_stream_ordered_on_gloo_is_refused_on_every_rank() -> None:
    """It waits on CUDA streams, which gloo does not have: accepted silently before."""
    results = launch(stream_ordered_rank, 2, (prove(synthesize("stragglar", 2)),), timeout=30)
    assert (
        results[0]
        == results[1]
        == ("stream_ordered applies to an NCCL process group, not gloo: its waits are on the host")
    )
