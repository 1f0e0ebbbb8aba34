"""stragglar/runtime/roll_call.py: the ranks that had not reached a call that timed out, read from the
store; nothing written on the happy path; a store that does not answer says nothing, in bounded
time.  Ranks are played here by roll calls on one store; the DDP hook's own tests
(tests/test_ddp_hook.py, tests/test_ddp_teardown.py) run them on real ranks."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from script_ranks import start_ranks

pytest.importorskip("torch")

from torch.distributed import FileStore, PrefixStore, TCPStore  # type: ignore[attr-defined, unused-ignore]

from stragglar.ddp.engine_allreduce import engine_error
from stragglar.runtime import roll_call
from stragglar.runtime.roll_call import BOUND, LAG, MARK, RollCall


@pytest.fixture
def store(tmp_path: Path) -> PrefixStore:
    """A store as init_process_group leaves it: the rendezvous store under the default group's prefix."""
    return PrefixStore("default_pg", FileStore(str(tmp_path / "store"), 1))


def ranks(store: PrefixStore, size: int, namespace: str = "group-1") -> list[RollCall]:
    return [RollCall(store, namespace, rank, size) for rank in range(size)]


def absent_at_once(calls: list[RollCall], call: int, seconds: float) -> dict[int, list[int] | None]:
    """Each roll call's ``absent`` at once, from a thread each (as each rank's deadline passes)."""
    said: dict[int, list[int] | None] = {}
    threads = [
        threading.Thread(target=lambda c=c: said.__setitem__(c.rank, c.absent(call, seconds))) for c in calls
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return said


def test_the_ranks_that_timed_out_name_the_one_that_never_came() -> None:
    store = PrefixStore("default_pg", TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False))
    zero, one, _ = ranks(store, 3)
    start = time.monotonic()
    assert absent_at_once([zero, one], 1, 10.0) == {0: [2], 1: [2]}
    assert MARK + LAG - 0.1 < time.monotonic() - start < MARK + LAG + BOUND  # long enough for a note


def test_a_rank_in_the_call_is_not_named_though_its_deadline_is_far() -> None:
    """Rank 1 reached the call just before rank 0's deadline: its note (at MARK) arrives while
    rank 0 still reads, though its own deadline is seconds away; rank 2 never came."""
    store = PrefixStore("default_pg", TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False))
    zero, one, _ = ranks(store, 3)
    timer = threading.Timer(MARK, one.mark, args=(1,))  # its reminder, MARK after it reached it
    timer.start()
    try:
        assert zero.absent(1, 10.0) == [2]
    finally:
        timer.join()


def test_every_rank_there_ends_the_roll_call_at_once(store: PrefixStore) -> None:
    calls = ranks(store, 3)
    start = time.monotonic()
    assert absent_at_once(calls, 1, 10.0) == {0: [], 1: [], 2: []}
    assert time.monotonic() - start < MARK  # nobody to wait for


def test_calls_are_numbered_and_namespaced_so_no_earlier_note_counts(store: PrefixStore) -> None:
    """A rank's note of call 1 says nothing of call 2; another group's (a later state's) neither."""
    zero, one, _ = ranks(store, 3)
    assert (zero.begin(), zero.begin(), one.begin()) == (1, 2, 1)  # every rank's k-th call is k
    one.mark(1)
    _, later_one, _ = ranks(store, 3, "group-2")
    later_one.mark(2)
    time.sleep(0.2)
    assert zero.absent(2, 0.1) == [1, 2]
    assert zero.absent(1, 0.1) == [2]


def test_the_happy_path_writes_nothing_and_a_marked_call_that_completes_is_deleted(
    store: PrefixStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(roll_call, "KEEP", 0.0)  # deleted at its completion: no rank reads it
    keys = store.num_keys()
    zero = RollCall(store, "group-1", 0, 2)
    zero.completed(zero.begin())  # completed before MARK: never marked
    assert zero._thread is None and store.num_keys() == keys  # no thread, no key
    zero.mark(2)
    deadline = time.monotonic() + 5
    while not store.check(["group-1/2"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.check(["group-1/2"])
    zero.completed(2)
    while store.check(["group-1/2"]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not store.check(["group-1/2"])
    zero.close()


@pytest.fixture
def silent_host() -> Iterator[int]:
    """A port whose host accepts connections and never answers: a stopped or cut-off store host
    (the kernel completes the handshake for it)."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(8)
        yield listening.getsockname()[1]


def test_a_store_host_that_never_answers_says_nothing_in_bounded_time(
    silent_host: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TCPStore's own timeout bounds none of this: its client waited for the host forever (tried)."""

    def connected(store: object, namespace: str) -> PrefixStore:  # as the clone of its store connects
        client = TCPStore("127.0.0.1", silent_host, is_master=False, timeout=timedelta(seconds=1))
        return PrefixStore(namespace, client)

    monkeypatch.setattr(roll_call, "_own", connected)
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    zero = RollCall(PrefixStore("default_pg", master), "group-1", 0, 3)
    start = time.monotonic()
    assert zero.absent(1, 10.0) is None and zero.broken
    assert time.monotonic() - start < BOUND + 1
    start = time.monotonic()
    assert zero.absent(2, 10.0) is None  # not asked again: its thread may never come back
    zero.mark(3)
    assert time.monotonic() - start < 0.1


def test_a_failing_store_says_nothing(store: PrefixStore, monkeypatch: pytest.MonkeyPatch) -> None:
    zero = RollCall(store, "group-1", 0, 2)

    def refused(store: object, namespace: str) -> object:
        raise ConnectionRefusedError("refused")

    monkeypatch.setattr(roll_call, "_own", refused)
    assert zero.absent(1, 10.0) is None and not zero.broken  # it answered: a later one may ask


def test_the_error_names_the_absent_ranks_and_blames_the_first() -> None:
    said = "allreduce failed: rank 0 timed out in the engine's all_reduce waiting for rank 2: no answer "
    error = engine_error(0, None, 10.0, [2])
    assert str(error) == said + "within 10 s (the state's timeout); rank 2 had not reached it"
    assert (error.rank, error.reason, error.peer) == (0, "timed out", 2)
    assert "ranks 2, 3 had not reached it" in str(engine_error(1, None, 10.0, [3, 2]))
    bare = engine_error(0, None, 10.0)  # nobody found absent, or no store: as before
    assert str(bare).endswith("engine's all_reduce: no answer within 10 s (the state's timeout)")
    assert bare.peer is None


STORE_HOST_SILENT = """
import os, signal, sys, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from stragglar.ddp import StragglarState, stragglar_hook

dist.init_process_group("gloo")  # env://: a TCPStore, whose host is rank 0
model = DDP(torch.nn.Linear(16, 4))
model.register_comm_hook(StragglarState(policy="auto", timeout=2), stragglar_hook)
try:
    for step in range(5):
        if step == 3 and dist.get_rank() == 0:
            if sys.argv[1] == "stopped":
                os.kill(os.getpid(), signal.SIGSTOP)  # its store's thread too
            time.sleep(600)  # alive, silent; its store still answers
        start = time.monotonic()
        model(torch.randn(8, 16)).sum().backward()
except Exception as e:
    print(f"failed after {time.monotonic() - start:.1f} s:", str(e).splitlines()[0], flush=True)
os._exit(0)
"""


@pytest.mark.slow  # 3 processes, a 2 s timeout: about 15 s each
@pytest.mark.parametrize("host", ["asleep", "stopped"])
def test_the_store_s_host_silent_is_named_or_the_timeout_is_said_without_names(
    tmp_path: Path, host: str
) -> None:
    """Rank 0, the TCPStore's host, is the silent one.  Asleep, its store's thread still answers,
    and the others name it; stopped (SIGSTOP: the store's host answers nothing, and its client
    waits without bound), they say the timeout as before, a moment later, with no hang."""
    script = tmp_path / "silent.py"
    script.write_text(STORE_HOST_SILENT)
    ranks = start_ranks(script, 3, host)
    try:
        for rank in (1, 2):
            output, _ = ranks[rank].communicate(timeout=90)
            failure = next((line for line in output.splitlines() if line.startswith("failed after")), output)
            said = f"rank {rank} timed out in the engine's all_reduce"
            if host == "asleep":
                said += " waiting for rank 0: no answer within 2 s (the state's timeout); rank 0 had not"
            else:
                said += ": no answer within 2 s (the state's timeout)"
            assert said in failure, output
            assert host == "asleep" or failure.endswith("(the state's timeout)"), output
            seconds = float(failure.split()[2])
            assert seconds < 2 + MARK + LAG + BOUND + 2, failure  # the deadline, the roll call, a slow core
        assert ranks[0].poll() is None  # still silent
    finally:
        for process in ranks:
            process.kill()
            process.communicate()


def noted(store: PrefixStore, key: str) -> None:
    """Wait (bounded) until the roll call's thread has written ``key``."""
    deadline = time.monotonic() + 5
    while not store.check([key]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.check([key])


def test_the_peers_completions_keep_the_notes_a_rank_that_gave_up_still_reads(store: PrefixStore) -> None:
    """Ranks 1 and 2 were in the call, noted it, and completed it just after rank 0's deadline:
    their completions deleted the key, and rank 0 named both ("had not reached it")."""
    zero, one, two = ranks(store, 3)
    one.mark(1)
    two.mark(1)
    noted(store, "group-1/1")
    time.sleep(0.2)  # both notes written, each by its own roll call's thread
    one.completed(1)
    two.completed(1)
    assert zero.absent(1, 30.0) == []


def test_a_note_read_once_counts_though_the_key_goes_later(store: PrefixStore) -> None:
    """Each read's notes are kept: a key gone mid-roll-call (a store restarted, say) takes nothing."""
    zero, one, _ = ranks(store, 3)
    one.mark(1)
    noted(store, "group-1/1")
    said: list[list[int] | None] = []
    reading = threading.Thread(target=lambda: said.append(zero.absent(1, 30.0)))
    reading.start()
    time.sleep(0.3)
    store.delete_key("group-1/1")
    reading.join(30)
    assert said == [[2]]


def test_a_closed_roll_call_is_asked_nothing_more(store: PrefixStore) -> None:
    """A deadline that passed after the state closed started a thread and a connection anew,
    never closed."""
    zero = RollCall(store, "group-1", 0, 2)
    zero.mark(zero.begin())
    zero.close()
    assert zero.absent(1, 0.1) is None
    zero.mark(2)
    assert zero._thread is None  # no thread started anew, nor a connection


def gathering_rank(rank: int, size: int, absent: str) -> tuple[str | None, bool]:
    """Every rank gathers a header twice on a group of its own through NCCL's path, one all_gather
    (``channel=None``; gloo runs it here): first all of them, then all but the last, which is
    alive but ``absent`` ("silent": it sleeps past the others' deadline) or dead ("dead": it
    exits before the call).  What the gather raised on this rank, and whether the first, which
    every rank reached, made the roll call do anything (a thread of its own: the happy path
    writes nothing)."""
    import os
    from datetime import timedelta

    import torch.distributed as dist

    from stragglar.runtime import RankError
    from stragglar.runtime.torch_dist import gather_headers

    group = dist.new_group(timeout=timedelta(seconds=20))  # the world's stays whole for the launcher
    rows = gather_headers([rank, 7], group, "cpu", rank, 10.0, None)
    assert rows == [(r, 7) for r in range(size)], rows
    roll = roll_call.of_headers(group)
    assert roll is not None and roll.calls == 1
    quiet = roll._thread is None
    if rank == size - 1:
        if absent == "dead":
            os._exit(3)
        time.sleep(8)
        return None, quiet
    try:
        gather_headers([rank, 7], group, "cpu", rank, 1.5, None)
    except RankError as e:
        assert e.peer == size - 1, (e.peer, str(e))
        if absent == "dead":  # the launcher's closing barrier would fail: report it as the failure
            raise
        return str(e), quiet
    return "no error", quiet


@pytest.mark.parametrize("absent", ["silent", "dead"])
def test_a_header_gather_names_the_rank_that_never_came(absent: str) -> None:
    """An all_gather (the header check on NCCL) cannot say who is missing: the roll call does.
    Rank 2 never comes (alive and silent, or dead); ranks 0 and 1 name it, each after its own
    deadline or a lost connection (gloo closes the pairs of a call that timed out), whichever
    came first; they said only "no answer within 1.5 s" before."""
    from stragglar.measure.launch import LaunchError, launch

    if absent == "silent":
        said = launch(gathering_rank, 3, (absent,), timeout=30)
    else:
        with pytest.raises(LaunchError) as info:
            launch(gathering_rank, 3, (absent,), timeout=30)
        assert info.value.errors[2] == "exited with code 3 before reporting"
        said = [(info.value.errors[r].partition("RankError: ")[2].strip(), True) for r in range(2)]
    for rank in (0, 1):
        message, quiet = said[rank]
        assert message is not None and quiet, said
        assert message.startswith(f"allreduce failed: rank {rank} "), message
        assert "checking that every rank runs the same allreduce waiting for rank 2: " in message, message
        timed_out = f"rank {rank} timed out " in message
        if timed_out:
            assert message.endswith("no answer within 1.5 s; rank 2 had not reached it"), message
        else:
            assert f"rank {rank} lost the connection " in message, message
            assert message.endswith("; rank 2 had not reached it or had left it"), message
