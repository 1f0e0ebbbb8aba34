"""The rank launcher: long healthy runs pass, silent ranks fail in time, signals leave nothing behind,
and a failure's first line names every failed rank."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from stragglar.errors import ArgumentError, InputError
from stragglar.files import ABANDONED_AFTER, working_folder
from stragglar.measure import launch as launcher
from stragglar.measure.launch import LaunchError, RankFailure, launch, summary
from stragglar.measure.run import run_benchmark
from stragglar.runtime import heartbeat
from stragglar.synth import synthesize
from stragglar.verify import Proof, prove


def steady(rank: int, n: int, proof: Proof, steps: int, beat: bool) -> int:
    import torch

    from stragglar.runtime import allreduce

    for _ in range(steps):
        time.sleep(0.25)
        buf = torch.ones(16)
        allreduce(buf, proof, timeout=1.0)
        assert torch.all(buf == n)
        if beat:
            heartbeat()
    return steps


def test_a_healthy_run_longer_than_timeout_plus_slack_succeeds() -> None:
    start = time.monotonic()
    assert launch(steady, 2, (prove(synthesize("ring", 2)), 10, True), timeout=1.0, slack=0.5) == [10, 10]
    assert time.monotonic() - start > 1.5  # longer than timeout + slack, and still fine


def test_the_launcher_ticks_from_its_own_loop_while_the_ranks_run() -> None:
    """For a progress line: no thread may be alive when the ranks are forked."""
    ticks: list[float] = []
    start = time.monotonic()
    launch(steady, 2, (prove(synthesize("ring", 2)), 6, True), timeout=5.0, tick=lambda: ticks.append(1))
    assert len(ticks) >= (time.monotonic() - start) / 0.25 - 1  # at least every quarter second


class FileDevice:
    """A graph device that says in a file when the graphs were waited for before being dropped."""

    def __init__(self, path: str) -> None:
        self.path = path

    def capture(self, work: object) -> object:
        return work

    def replay(self, graph: object) -> None:
        pass

    def synchronize(self) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(f"synchronized {os.getpid()}\n")


def graphed(rank: int, n: int, path: str) -> int:
    """A rank that leaves a graph on the world group, as stream-ordered NCCL calls do."""
    import torch.distributed as dist

    from stragglar.runtime import graphs

    replayer = graphs.shared(lambda: FileDevice(path))
    for _ in range(2):  # eager, then captured
        replayer((dist.group.WORLD, "rounds"), lambda: None)
    assert len(replayer.captured) == 1
    return rank


def test_the_ranks_graphs_are_dropped_before_their_process_group_is_destroyed(tmp_path: Path) -> None:
    """NCCL destroys no communicator that a live CUDA graph holds (destroy_process_group() waited
    forever on a GPU): the launcher releases every rank's graphs first."""
    path = tmp_path / "released"
    assert launch(graphed, 2, (str(path),), timeout=20.0) == [0, 1]
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 2 and len(set(lines)) == 2, lines  # once in each rank


def test_a_rank_that_reports_no_progress_fails_after_timeout_plus_slack() -> None:
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(steady, 2, (prove(synthesize("ring", 2)), 40, False), timeout=1.0, slack=0.5)
    assert time.monotonic() - start < 6
    assert str(info.value).startswith("2 of 2 ranks failed: ")
    silent = [f for f in info.value.failures.values() if f.reason == "sent no progress for 1.5 s"]
    assert silent, str(info.value)  # both, or (a loaded machine) one while the other still beat
    for failure in silent:  # each says where it was stuck: every thread's stack
        assert "in steady" in failure.stacks and "thread 0x" in failure.stacks, failure.stacks
        assert failure.detail == ""  # the message's line for the rank stays its reason
    others = [f.reason for f in info.value.failures.values() if f not in silent]
    assert others in ([], ["was ended with the silent ranks"]), others


def one_silent(rank: int, n: int, proof: Proof) -> None:
    import torch

    from stragglar.runtime import allreduce

    allreduce(torch.ones(16), proof, timeout=1.0)
    if rank == 1:
        time.sleep(60)  # alive, silent, never reports
    allreduce(torch.ones(16), proof, timeout=1.0)


def test_a_silent_rank_fails_the_run_within_about_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "_GRACE", 1.0)
    start = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(one_silent, 3, (prove(synthesize("stragglar", 3)),), timeout=1.0)
    assert time.monotonic() - start < 1.0 + 1.0 + 3.0  # the timeout, the grace, start-up
    first = str(info.value).splitlines()[0]
    assert first.startswith("3 of 3 ranks failed: rank 1 was still running when the others had failed; ")
    assert " timed out in round " in first and "waiting for rank 1" in first, first


def one_stopped(rank: int, n: int, proof: Proof) -> None:
    import torch

    from stragglar.runtime import allreduce

    allreduce(torch.ones(16), proof, timeout=1.0)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGSTOP)  # as Ctrl-Z or kill -STOP would
    allreduce(torch.ones(16), proof, timeout=1.0)


@pytest.mark.skipif(
    not os.path.exists("/proc/self/stat"), reason="the kernel says a process is stopped in /proc"
)
def test_a_stopped_rank_is_reported_stopped_not_still_running(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "_GRACE", 1.0)
    with pytest.raises(LaunchError) as info:
        launch(one_stopped, 3, (prove(synthesize("stragglar", 3)),), timeout=1.0)
    first = str(info.value).splitlines()[0]
    assert first.startswith("3 of 3 ranks failed: rank 1 was stopped (SIGSTOP or Ctrl-Z) when the others"), (
        first
    )


def test_run_benchmark_on_torch_is_bounded_per_wait_not_per_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(launcher, "SLACK", 0.5)
    start = time.monotonic()
    r = run_benchmark("torch", 2, 1024, "float32", delay=0.2, iters=5, warmup=0, timeout=1.0)
    assert time.monotonic() - start > 1.5 and len(r.times) == 5  # 2 s of delays: well past 1 s + 0.5 s
    r = run_benchmark("torch", 2, 1024, "float32", delay=1.3, iters=1, warmup=0, timeout=1.0)
    assert min(r.times) >= 1.3  # a wait for a late rank may last its delay plus the timeout


def raises_in_rank(rank: int, n: int, error: Exception | None = None) -> None:
    import torch.distributed as dist

    dist.barrier()  # every rank connected first: else a slow one, on a loaded box, loses it in setup
    if rank == 1:
        raise ValueError("boom\nsecond line") if error is None else error
    time.sleep(0.2)


def parallel_op_rank(rank: int, n: int) -> float:
    import torch

    return float((torch.ones(1_000_000) * (rank + 1)).sum())  # large enough for a parallel fill


def test_ranks_run_torch_ops_after_the_parent_ran_parallel_ones() -> None:
    """A parallel op in the parent starts OpenMP threads, which a forked rank does not inherit: a
    rank that entered a parallel region waited for them forever (every rank silent until killed)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert float((torch.ones(4_000_000) * 3).sum()) == 12_000_000  # OpenMP's team starts here
        start = time.monotonic()
        results = launch(parallel_op_rank, 3, timeout=5, slack=3)
    finally:
        torch.set_num_threads(threads)
    assert results == [1_000_000.0 * (r + 1) for r in range(3)]
    assert time.monotonic() - start < 6


def test_a_rank_that_raises_is_named_with_its_error() -> None:
    with pytest.raises(LaunchError) as info:
        launch(raises_in_rank, 3, timeout=10)
    first = str(info.value).splitlines()[0]
    assert first == (
        "3 of 3 ranks failed: rank 1 raised ValueError: boom; "
        "ranks 0, 2 lost the connection in the closing barrier"
    )
    assert "second line" in info.value.errors[1]
    assert info.value.exit_code == 1  # a failed run


def test_a_refusal_that_mentions_a_timeout_is_the_cause_not_a_timeout() -> None:
    """A rank whose own call was refused ("timeout must be ... > 0") was summed up as "timed out",
    among the consequences, not named as the cause."""
    refused = InputError("timeout must be a finite number of seconds > 0, got -1")
    with pytest.raises(LaunchError) as info:
        launch(raises_in_rank, 2, (refused,), timeout=10)
    first = str(info.value).splitlines()[0]
    assert first.startswith(f"2 of 2 ranks failed: rank 1 raised InputError: {refused}"), first


class OutOfMemoryError(RuntimeError):
    """What torch raises when CUDA memory runs out (torch.cuda.OutOfMemoryError), minus CUDA."""


def runs_out_of_memory(rank: int, n: int, kind: str) -> None:
    if rank == 1:
        try:
            if kind == "torch host":  # torch's host allocator raises a RuntimeError, not MemoryError
                import torch

                torch.empty(2**50, dtype=torch.uint8)
            raise (
                MemoryError
                if kind == "host"
                else OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
            )
        except Exception as e:
            raise RuntimeError("the step failed") from e  # found behind what wraps it, as DDP wraps a hook's
    time.sleep(0.2)


@pytest.mark.parametrize("kind", ["host", "torch host", "cuda"])
def test_a_rank_out_of_memory_is_a_resource_that_ran_out(kind: str) -> None:
    with pytest.raises(LaunchError) as info:
        launch(runs_out_of_memory, 2, (kind,), timeout=10)
    assert info.value.exit_code == 3 and info.value.failures[1].out_of_memory
    assert str(info.value).startswith("2 of 2 ranks failed: rank 1 raised RuntimeError: the step failed")


def test_the_summary_stays_one_short_line_for_many_ranks() -> None:
    failures = [RankFailure(5, "exited with code 3 before reporting")]
    failures += [
        RankFailure(r, "timed out", round=r % 6, phase="exchange", peer=5) for r in range(64) if r != 5
    ]
    line = summary(failures, 64)
    assert line.startswith("64 of 64 ranks failed: rank 5 exited with code 3 before reporting; ranks ")
    assert "timed out in round 0 (phase 'exchange') waiting for rank 5" in line
    assert line.endswith(" more ranks failed in other ways") and len(line) < 400, line
    one = summary([RankFailure(2, "timed out", during="in gloo's all_reduce of iteration 3")], 4)
    assert one == "1 of 4 ranks failed: rank 2 timed out in gloo's all_reduce of iteration 3"


SCRIPT = """
import faulthandler, os, signal, sys, time
import torch.distributed  # once here, not in each forked rank
from stragglar.measure.launch import launch

faulthandler.register(signal.SIGUSR1, all_threads=True)  # where it is, should a stop not end it

def sleeper(rank, n, pids):
    with open(os.path.join(pids, str(os.getpid())), "w"):
        pass
    time.sleep(60)

launch(sleeper, 3, (sys.argv[1],), timeout=60)
"""


def _state(pid: int) -> str:
    """The process's state letter in /proc (R, S, D, T, Z, ...), or "gone"."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _gone(pid: int) -> bool:
    return _state(pid) in ("gone", "Z", "X")  # a zombie has ended; only its entry waits to be reaped


def _start(tmp_path: Path) -> tuple[subprocess.Popen[str], Path, Path]:
    pids, scratch = tmp_path / "pids", tmp_path / "tmp"
    pids.mkdir()
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), str(pids)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 30
    while len(list(pids.iterdir())) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=5)
        time.sleep(0.05)
    return proc, pids, scratch


def _ended(proc: subprocess.Popen[str], ranks: list[int], timeout: float) -> tuple[str, str]:
    """The launcher's output once it has ended; if it has not within ``timeout``, a failure that
    says where it was (its threads' stacks, which SCRIPT has it write on SIGUSR1) and what its
    ranks were doing (their states in /proc), so that a rare hang can be read from one failure."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        alive = proc.poll() is None
        if alive:
            proc.send_signal(signal.SIGUSR1)
            time.sleep(1.0)
        for pid in ranks:  # their ends of the output pipes: without them communicate() can end
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
        proc.kill()
        out, err = proc.communicate()
        states = {pid: _state(pid) for pid in ranks}
        pytest.fail(f"not ended in {timeout:g} s (launcher alive: {alive}); ranks {states}\n{err}{out}")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGKILL])
def test_a_signal_to_the_launcher_ends_every_rank_and_removes_its_files(
    tmp_path: Path, sig: signal.Signals, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc, pids, scratch = _start(tmp_path)
    ranks = [int(p.name) for p in pids.iterdir()]
    assert list(scratch.iterdir())  # the rendezvous directory exists while it runs
    sent = time.monotonic()
    proc.send_signal(sig)
    try:
        _, err = _ended(proc, ranks, timeout=15)  # seconds at most, ~0.3 s alone; 5 s flaked on a loaded box
        deadline = sent + 15
        while not all(_gone(pid) for pid in ranks) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(_gone(pid) for pid in ranks), [pid for pid in ranks if not _gone(pid)]
        assert proc.returncode != 0
        if sig != signal.SIGKILL:  # a killed launcher cannot clean up; its ranks still die with it
            assert list(scratch.iterdir()) == []
            stopped = f"Stopped: stopped by {sig.name}: every rank was ended"
            assert (stopped if sig != signal.SIGINT else "KeyboardInterrupt") in err
        else:  # the next launcher removes its folder (once it is older than a minute: made so)
            (left,) = scratch.iterdir()
            old = time.time() - 2 * ABANDONED_AFTER
            os.utime(left / ".lock", (old, old))
            monkeypatch.setattr(tempfile, "tempdir", str(scratch))
            with working_folder("stragglar-") as fresh:
                assert list(scratch.iterdir()) == [Path(fresh)]
    finally:
        for pid in ranks:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def placed(rank: int, n: int) -> tuple[int, str | None, str | None, object]:
    """What a rank of a faked nccl launch was given: its GPU, host id, socket interface, device_id."""
    import torch

    return (
        torch.cuda.current_device(),
        os.environ.get("NCCL_HOSTID"),
        os.environ.get("NCCL_SOCKET_IFNAME"),
        os.environ.get("FAKE_DEVICE_ID"),
    )


def test_nccl_ranks_are_bound_to_gpu_r_mod_the_count_with_a_host_each_where_they_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No GPU here: the forked ranks inherit fakes of CUDA's device calls and an init that records
    what NCCL would get and starts gloo instead (the barrier and teardown then run as ever)."""
    import torch
    import torch.distributed as dist

    current = {"device": -1}
    real_init = dist.init_process_group

    def fake_init(backend: str, **kwargs: object) -> None:
        assert backend == "nccl"
        device = kwargs.pop("device_id")
        os.environ["FAKE_DEVICE_ID"] = str(device)  # what the rank reads back
        real_init("gloo", **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(dist, "init_process_group", fake_init)
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: current.update(device=d))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current["device"])
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for name in ("NCCL_HOSTID", "NCCL_SOCKET_IFNAME"):
        monkeypatch.delenv(name, raising=False)
    shared = launch(placed, 3, timeout=10.0, backend="nccl", gpus=2)
    assert shared == [(r % 2, f"host-{r}", "lo", f"cuda:{r % 2}") for r in range(3)]
    alone = launch(placed, 2, timeout=10.0, backend="nccl", gpus=2)
    assert alone == [(r, None, None, f"cuda:{r}") for r in range(2)]


def test_an_nccl_launch_needs_a_gpu_count() -> None:
    with pytest.raises(ValueError, match="gpus must be at least 1, got 0"):
        launch(placed, 2, backend="nccl")


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"backend": "foo"}, InputError, r"^backend must be 'gloo' or 'nccl', got 'foo'$"),
        ({"backend": "nccl", "gpus": 1}, InputError, r"^gpus=1, but torch sees 0 CUDA GPUs here$"),
        ({"gpus": 2}, InputError, r"^gpus places backend='nccl' ranks on GPUs; gloo's take none, got 2$"),
        ({"tick": 5}, ArgumentError, r"^tick must be a function of no arguments, got 5$"),
    ],
)
def test_a_launch_refuses_options_before_any_rank_is_forked(
    monkeypatch: pytest.MonkeyPatch, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    """Each was forked first: an unknown backend failed in every rank on an assertion, nccl
    without CUDA on an AttributeError; ``gpus`` with gloo was ignored."""
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr("stragglar.measure.launch.multiprocessing.get_context", never_forked)
    with pytest.raises(error, match=message):
        launch(placed, 2, **options)


def never_forked(method: str) -> None:
    raise AssertionError("a rank was forked before the options were checked")


def test_the_summary_says_were_for_several_ranks() -> None:
    failures = [RankFailure(r, "was still running when the others had failed") for r in (1, 3)]
    line = summary([RankFailure(0, "raised ValueError: x"), *failures], 4)
    assert line.endswith("ranks 1, 3 were still running when the others had failed"), line
    assert "rank 1 was still" in summary([failures[0]], 4)
