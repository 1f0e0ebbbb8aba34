"""Start N torch.distributed ranks as fork-started processes on this host (CLI runs and tests).

Fork, not spawn: a spawned rank re-imports torch (seconds each).  A forked rank runs torch on one
thread: the parent's OpenMP worker threads do not survive the fork, and a parallel op in the rank
would wait for them forever (every rank hung in ``torch.ones(100_000)`` once the parent had run a
parallel op); the ranks of one host share its cores anyway.  Ranks rendezvous through a fresh
``file://`` store on the loopback interface, with the timeout passed to ``init_process_group`` so a
missing rank fails instead of hanging.  A rank reports through a pipe and leaves with
``os._exit`` (no inherited atexit handlers run in the child).

Nothing outlives the launcher and nothing waits forever:

* ``timeout`` bounds how long a rank waits for a silent peer (the process group's timeout, and
  what the rank passes to :func:`stragglar.runtime.allreduce`); it does not bound the run.  A long,
  healthy run is fine: ranks call :func:`~stragglar.runtime.liveness.heartbeat` as they
  progress (the launcher connects it to each rank's pipe), and the launcher gives up on a rank
  only when it has been silent for longer than ``timeout + slack``.  Once one rank has failed,
  the others get a few seconds to report why, then are killed.
* SIGTERM, SIGHUP (the terminal closed) and SIGINT to the launcher become exceptions
  (:class:`Stopped`, KeyboardInterrupt), so the ranks are killed and the rendezvous directory
  removed before it leaves; each rank also dies with its parent (``PR_SET_PDEATHSIG`` on Linux),
  even if the launcher is killed outright, and the next launcher removes the directory such a
  one left (:func:`~stragglar.files.working_folder`).  Processes a rank starts itself are the
  rank's to end.  A signal the launcher was started to ignore (``nohup``) stays ignored.
* A failed run raises :class:`LaunchError`, whose first line names each failed rank with what it
  was doing: ``4 of 5 ranks failed: rank 2 exited with code 3 before reporting; ranks 0, 1
  lost the connection in round 0 (phase 'reduce-scatter') waiting for rank 2; ...``.  Its exit
  code is 3 (a resource ran out) where a rank ran out of memory (MemoryError, or torch's CUDA
  OutOfMemoryError), else 1.
"""

from __future__ import annotations

import contextlib
import ctypes
import faulthandler
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any

from stragglar.args import as_int, as_seconds
from stragglar.errors import ArgumentError, InputError, ResourceError, RunError, described
from stragglar.files import working_folder
from stragglar.measure.gpus import gpu_count, placement
from stragglar.runtime import (
    RankError,
    classify,
    connect_launcher,
    failure_phrase,
    first_line,
    heartbeat,
    ranks_in_words,
    release_graphs,
    send_to_launcher,
)
from stragglar.units import count_of

__all__ = ["SLACK", "LaunchError", "RankFailure", "Stopped", "launch", "summary"]

_GRACE = 5.0  # seconds the other ranks get to report once one rank has failed
SLACK = 30.0  # seconds a rank may be silent beyond the timeout (start-up, checking a large buffer)
_SHOWN = 4  # failure groups the first line names before it counts the rest
_LENGTH = 280  # characters of failure groups the first line names before it counts the rest
_TICK = 0.25  # seconds between calls of a launch's tick, at most
_STACKS_WAIT = 1.0  # seconds silent ranks get to write their stacks before they are killed
_REAP_WAIT = 5.0  # seconds the killed ranks get, together, to be reaped
_STOPPING = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)  # what the launcher cleans up after


@dataclass(frozen=True)
class RankFailure:
    """What one rank reported (or what the launcher saw) when it failed.

    ``reason`` is short (``timed out``, ``exited with code 3 before reporting``, ``raised
    WrongResult: ...``); ``round``, ``phase``, ``peer``, ``waiting`` and ``during`` are a
    :class:`~stragglar.runtime.RankError`'s fields when the rank raised one; ``detail`` is the
    rank's traceback, or the reason when there is none; ``out_of_memory``: whether the rank ran
    out of memory (host or GPU); ``stacks``: where a silent rank was stuck, every thread's Python
    stack (empty where it could not say).
    """

    rank: int
    reason: str
    round: int | None = None
    phase: str | None = None
    peer: int | None = None
    waiting: str = "waiting for"
    during: str | None = None
    detail: str = ""
    out_of_memory: bool = False
    stacks: str = ""

    @property
    def what(self) -> str:
        """The failure in words, without the rank."""
        return failure_phrase(self.reason, self.round, self.phase, self.peer, self.waiting, self.during)

    @property
    def root(self) -> bool:
        """Whether it is a cause rather than a consequence: anything but a peer timing out or
        losing its connection."""
        return self.reason not in ("timed out", "lost the connection")


class LaunchError(RunError):
    """Some ranks failed.  ``failures`` maps each failed rank to its :class:`RankFailure`,
    ``errors`` to its text (the traceback it reported, or what the launcher saw).

    The first line of the message names every failed rank and what it was doing, grouped, at most
    a few groups; the lines after it give each rank's last line of detail.  A rank that ran out
    of memory makes it a resource that ran out (exit 3), not a failed run (exit 1).
    """

    def __init__(self, failures: Mapping[int, RankFailure | str], world_size: int | None = None) -> None:
        self.failures = {
            rank: f if isinstance(f, RankFailure) else RankFailure(rank, first_line(f), detail=f)
            for rank, f in sorted(failures.items())
        }
        self.errors = {rank: f.detail or f.reason for rank, f in self.failures.items()}
        self.world_size = world_size
        if any(f.out_of_memory for f in self.failures.values()):
            self.exit_code = ResourceError.exit_code
        lines = [f"rank {rank}: {_last_line(text)}" for rank, text in self.errors.items()]
        super().__init__(summary(self.failures.values(), world_size) + "\n  " + "\n  ".join(lines))


class Stopped(RunError):
    """The launcher was sent SIGTERM or SIGHUP: every rank was ended and the temporary files
    removed.  Its exit code is the shell's for a process ended by that signal, 128 + its number
    (143, 129)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}: every rank was ended")
        self.exit_code = 128 + signum


def summary(failures: Any, world_size: int | None = None) -> str:
    """``4 of 5 ranks failed: rank 2 exited ...; ranks 0, 1, 3 timed out in round 5 ...``: one line.

    Ranks that failed the same way at the same place are named together; causes (a rank that
    died or raised) come before consequences (peers that timed out or lost the connection), and
    past a few groups the rest are counted.
    """
    groups: dict[tuple[bool, int | None, str], list[int]] = {}
    for f in failures:
        groups.setdefault((f.root, f.round, f.what), []).append(f.rank)
    ordered = sorted(
        groups.items(), key=lambda kv: (not kv[0][0], -1 if kv[0][1] is None else kv[0][1], min(kv[1]))
    )
    said: list[str] = []
    for key, ranks in ordered[:_SHOWN]:
        what = key[2]
        if len(ranks) > 1 and what.startswith("was "):  # the reasons speak of one rank
            what = "were " + what.removeprefix("was ")
        words = f"{ranks_in_words(ranks, limit=6)} {what}"
        if said and sum(map(len, said)) + len(words) > _LENGTH:
            break
        said.append(words)
    rest = sum(len(ranks) for _, ranks in ordered[len(said) :])
    if rest:
        said.append(f"{rest} more rank{'s' * (rest > 1)} failed in other ways")
    total = sum(len(ranks) for ranks in groups.values())
    of = f" of {world_size}" if world_size is not None else ""
    return f"{total}{of} rank{'s' * (total > 1 or bool(of))} failed: " + "; ".join(said)


def launch(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple[Any, ...] = (),
    timeout: float = 60.0,
    backend: str = "gloo",
    *,
    slack: float = SLACK,
    tick: Callable[[], None] | None = None,
    gpus: int = 0,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` ranks; return the results in rank order.

    ``timeout`` is each rank's limit for waiting on a silent peer (the process group's timeout).
    Raises :class:`LaunchError` if a rank raises, dies, or sends no
    :func:`~stragglar.runtime.liveness.heartbeat` (nor its result) for longer than ``timeout +
    slack`` seconds; once one rank has failed the others get a few seconds to report, then the
    remaining ranks are killed.  ``tick``, if given, is called from the launcher's own loop at
    least every quarter second while the ranks run (to move a progress line: no thread may run
    beside a fork).  SIGTERM raises :class:`Stopped` and SIGINT KeyboardInterrupt,
    after every rank is ended and the temporary files are removed; SIGHUP is SIGTERM's twin.
    ``backend="nccl"`` needs ``gpus``, the GPUs to place the ranks on
    (:func:`~stragglar.measure.gpus.placement`: rank r on GPU r mod ``gpus``); the process
    group is then bound to the rank's GPU (``device_id``), which also connects NCCL at once.
    """
    world_size = as_int(world_size, "world_size", minimum=1)
    timeout = as_seconds(timeout, "timeout", positive=True)
    slack = as_seconds(slack, "slack")
    if tick is not None and not callable(tick):
        raise ArgumentError(f"tick must be a function of no arguments, got {described(tick)}")
    if backend not in ("gloo", "nccl"):  # checked before any rank is forked, not in each of them
        raise InputError(f"backend must be 'gloo' or 'nccl', got {described(backend)}")
    if backend == "nccl":
        gpus = as_int(gpus, "gpus", minimum=1)
        if gpus > (seen := gpu_count()):
            raise InputError(f"gpus={gpus}, but torch sees {count_of(seen, 'CUDA GPU')} here")
    elif gpus != 0:
        raise InputError(f"gpus places backend='nccl' ranks on GPUs; gloo's take none, got {described(gpus)}")
    import torch.distributed  # noqa: F401 - once here: every forked rank shares it, none imports it

    ctx = multiprocessing.get_context("fork")
    with _signals_raise(), working_folder("stragglar-") as tmp:
        store = os.path.join(tmp, "rendezvous")
        pipes: list[Connection] = []
        procs: list[Any] = []
        try:
            for rank in range(world_size):
                parent, child = ctx.Pipe(duplex=False)
                pipes.append(parent)
                procs.append(
                    ctx.Process(
                        target=_child,
                        args=(child, fn, rank, world_size, args, store, timeout, backend, gpus, os.getpid()),
                    )
                )
                procs[-1].start()
                child.close()
            return _collect(pipes, procs, timeout + slack, tick, tmp)
        finally:
            started = [proc for proc in procs if proc.pid is not None]
            for proc in started:
                if proc.is_alive():
                    proc.kill()
            reaped_by = time.monotonic() + _REAP_WAIT  # one bound for all: a stop is seconds, not N x 5
            for proc in started:
                proc.join(max(0.0, reaped_by - time.monotonic()))
            for pipe in pipes:
                pipe.close()


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`Stopped`, SIGINT KeyboardInterrupt (main thread only;
    others are left alone, their ranks still die with this process).  A signal ignored when we
    started (``nohup``'s SIGHUP) stays ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    wanted = [s for s in _STOPPING if signal.getsignal(s) is not signal.SIG_IGN]

    def stop(signum: int, _frame: Any) -> None:
        for s in wanted:  # once: a second signal must not cut the cleanup short
            signal.signal(s, signal.SIG_IGN)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        raise Stopped(signum)

    previous = {s: signal.signal(s, stop) for s in wanted}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _collect(
    pipes: list[Connection], procs: list[Any], silence: float, tick: Callable[[], None] | None, folder: str
) -> list[Any]:
    results: dict[int, Any] = {}
    failures: dict[int, RankFailure] = {}
    pending = dict(enumerate(pipes))
    heard = dict.fromkeys(pending, time.monotonic())
    grace_end: float | None = None
    while pending:
        if tick is not None:
            tick()
        now = time.monotonic()
        if grace_end is not None and now >= grace_end:
            for rank in pending:
                failures[rank] = RankFailure(rank, f"{_stopped(procs[rank].pid)}when the others had failed")
            break
        silent = [rank for rank in pending if now - heard[rank] > silence]
        if silent:
            stacks = _stacks(procs, silent, folder)
            for rank in pending:
                failures[rank] = (
                    RankFailure(
                        rank,
                        f"sent no progress for {silence:g} s{_stopped(procs[rank].pid, ': it ')}".rstrip(),
                        stacks=stacks.get(rank, ""),
                    )
                    if rank in silent
                    else RankFailure(rank, "was ended with the silent ranks")
                )
            break
        until = min(heard[rank] for rank in pending) + silence
        if grace_end is not None:
            until = min(until, grace_end)
        if tick is not None:
            until = min(until, now + _TICK)
        ready = wait(list(pending.values()), timeout=max(0.0, until - now) + 0.01)
        for rank, pipe in list(pending.items()):
            if pipe not in ready:
                continue
            try:
                kind, value = pipe.recv()
            except EOFError:
                procs[rank].join(5.0)
                kind, value = "error", {"reason": _exit_reason(procs[rank].exitcode)}
            heard[rank] = time.monotonic()
            if kind == "beat":
                continue
            del pending[rank]
            if kind == "ok":
                results[rank] = value
            else:
                failures[rank] = RankFailure(rank, **value)
                if grace_end is None:  # give the others a moment to report why, not the timeout
                    grace_end = time.monotonic() + _GRACE
    if failures:
        raise LaunchError(failures, len(pipes))
    return [results[r] for r in range(len(pipes))]


def _stacks(procs: list[Any], ranks: list[int], folder: str) -> dict[int, str]:
    """Where each of ``ranks`` is stuck: every thread's Python stack, which a rank writes to its
    file in ``folder`` when sent SIGUSR1 (:func:`_child`), for the failure's detail."""
    for rank in ranks:
        with contextlib.suppress(OSError):
            os.kill(procs[rank].pid, signal.SIGUSR1)
    time.sleep(_STACKS_WAIT)
    found = {}
    for rank in ranks:
        path = os.path.join(folder, f"stacks-{rank}")
        with contextlib.suppress(OSError), open(path, encoding="utf-8", errors="replace") as f:
            found[rank] = f.read()
    return {rank: text for rank, text in found.items() if text.strip()}


def _stopped(pid: int, lead: str = "") -> str:
    """``"was stopped (SIGSTOP or Ctrl-Z) "`` for a rank the kernel has stopped, else ``"was still
    running "`` (``lead`` then the words; nothing after a ``lead`` for a running one): a rank
    someone paused is not a rank that is slow, and the one who paused it should hear so.  Linux
    says which in /proc; elsewhere every rank reads as running."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            state = f.read().rpartition(")")[2].split()[0]  # after the name, which may hold spaces
    except (OSError, IndexError):
        state = "R"
    if state in ("T", "t"):
        return f"{lead}was stopped (SIGSTOP or Ctrl-Z) "
    return "" if lead else "was still running "


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name} before reporting"
    return f"exited with code {code} before reporting"


def _failure_fields(error: BaseException) -> dict[str, Any]:
    """What a rank sends back about ``error``: a RankError's fields (found in the exception's
    causes too: DDP wraps a hook's error), else its type and first line."""
    found: BaseException | None = error
    while found is not None and not isinstance(found, RankError):
        found = found.__cause__ or found.__context__
    detail = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    memory = {"out_of_memory": True} if _out_of_memory(error) else {}
    if isinstance(found, RankError):
        fields = found.fields()
        fields.pop("rank", None)
        return {**fields, "detail": detail, **memory}
    kind = classify(error)
    if kind != "failed":  # an engine's error outside the rounds: a consequence, like a RankError's
        return {"reason": kind, "detail": detail, **memory}
    text = first_line(error, 150)
    reason = f"raised {type(error).__name__}" + (f": {text}" if text else "")
    return {"reason": reason, "detail": detail, **memory}


_HOST_ALLOCATOR_FAILED = "DefaultCPUAllocator: can't allocate memory"  # torch's host allocator says so


def _out_of_memory(error: BaseException) -> bool:
    """Whether ``error``, or an error it came from, is running out of memory: a MemoryError,
    torch's OutOfMemoryError (CUDA's; matched by name, so no CUDA module is imported to ask), or
    the RuntimeError torch raises when its host allocator fails (a tensor too large for RAM)."""
    seen: set[int] = set()
    found: BaseException | None = error
    while found is not None and id(found) not in seen:
        seen.add(id(found))
        if isinstance(found, MemoryError) or type(found).__name__ == "OutOfMemoryError":
            return True
        if isinstance(found, RuntimeError) and _HOST_ALLOCATOR_FAILED in str(found):
            return True
        found = found.__cause__ or found.__context__
    return False


def _die_with_parent(parent_pid: int) -> None:
    """Have the kernel kill this process when its parent dies (Linux), and leave now if it has."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent_pid:
        os._exit(1)


def _child(
    pipe: Connection,
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    args: tuple[Any, ...],
    store: str,
    timeout: float,
    backend: str,
    gpus: int,
    parent_pid: int,
) -> None:
    code = 1
    try:
        _die_with_parent(parent_pid)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for reaching_the_launcher in (signal.SIGINT, signal.SIGHUP):  # which ends us, and cleans up
            signal.signal(reaching_the_launcher, signal.SIG_IGN)
        connect_launcher(pipe)
        # where it is stuck, if the launcher finds it silent (_stacks); open for the rank's life
        stacks = open(os.path.join(os.path.dirname(store), f"stacks-{rank}"), "w", encoding="utf-8")  # noqa: SIM115
        faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)  # the parent's OpenMP threads are gone: no parallel region may start
        bound: dict[str, Any] = {}
        if backend == "nccl":
            place = placement(rank, world_size, gpus)
            os.environ.update(place.env)  # before NCCL reads it, as the process group starts
            torch.cuda.set_device(place.device)
            bound["device_id"] = torch.device("cuda", place.device)
        dist.init_process_group(
            backend,
            init_method=f"file://{store}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout),
            **bound,
        )
        heartbeat()
        result = fn(rank, world_size, *args)
        try:
            release_graphs()  # NCCL destroys no communicator that a live CUDA graph holds
            dist.barrier()  # peers may still be waiting on our last sends
            dist.destroy_process_group()
        except Exception as e:
            reason = classify(e)
            raise RankError(
                f"rank {rank} {reason} in the closing barrier: {first_line(e)}",
                rank=rank,
                reason=reason,
                during="in the closing barrier",
            ) from e
        send_to_launcher(pipe, ("ok", result))
        code = 0
    except BaseException as e:
        with contextlib.suppress(Exception):
            send_to_launcher(pipe, ("error", _failure_fields(e)))
    finally:
        pipe.close()
        os._exit(code)


def _last_line(text: str) -> str:
    lines = [x for x in text.strip().splitlines() if x.strip()]
    return lines[-1].strip() if lines else text
