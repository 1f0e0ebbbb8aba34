"""Start N torch.distributed ranks as fork-started processes on this host (CLI runs and tests).

Fork, not spawn: a spawned rank re-imports torch (seconds each).  Ranks rendezvous through a fresh
``file://`` store on the loopback interface, with the timeout passed to ``init_process_group`` so a
missing rank fails instead of hanging.  A rank reports through a pipe and leaves with
``os._exit`` (no inherited atexit handlers run in the child).
"""

from __future__ import annotations

import multiprocessing
import os
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any

from stragglar.errors import RunError

__all__ = ["LaunchError", "launch"]

_GRACE = 5.0  # seconds the other ranks get to report once one rank has failed


class LaunchError(RunError):
    """Some ranks failed; ``errors`` maps each failed rank to what it reported."""

    def __init__(self, errors: dict[int, str]) -> None:
        lines = [f"rank {rank}: {msg.strip().splitlines()[-1]}" for rank, msg in sorted(errors.items())]
        super().__init__(f"{len(errors)} rank(s) failed:\n  " + "\n  ".join(lines))
        self.errors = errors


def launch(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple[Any, ...] = (),
    timeout: float = 60.0,
    backend: str = "gloo",
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` ranks; return the results in rank order.

    Raises :class:`LaunchError` if a rank raises, dies, or has not reported ``timeout`` seconds
    (plus start-up slack) after the start; once one rank has failed the others get a few seconds
    to report, then the remaining ranks are killed.
    """
    ctx = multiprocessing.get_context("fork")
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "rendezvous")
        pipes: list[Connection] = []
        procs = []
        for rank in range(world_size):
            parent, child = ctx.Pipe(duplex=False)
            proc = ctx.Process(
                target=_child, args=(child, fn, rank, world_size, args, store, timeout, backend)
            )
            proc.start()
            child.close()
            pipes.append(parent)
            procs.append(proc)
        try:
            return _collect(pipes, procs, time.monotonic() + timeout + 30.0)
        finally:
            for proc in procs:
                if proc.is_alive():
                    proc.kill()
                proc.join()


def _collect(pipes: list[Connection], procs: list[Any], deadline: float) -> list[Any]:
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    pending = dict(enumerate(pipes))
    while pending and time.monotonic() < deadline:
        ready = wait(list(pending.values()), timeout=max(0.0, deadline - time.monotonic()))
        for rank, pipe in list(pending.items()):
            if pipe not in ready:
                continue
            del pending[rank]
            try:
                ok, value = pipe.recv()
            except EOFError:
                procs[rank].join(5.0)
                ok, value = False, f"exited with code {procs[rank].exitcode} before reporting"
            (results if ok else errors)[rank] = value
            if not ok:  # the run has failed: give the others a moment to report why, not the timeout
                deadline = min(deadline, time.monotonic() + _GRACE)
    for rank in pending:
        errors[rank] = "did not finish within the timeout"
    if errors:
        raise LaunchError(errors)
    return [results[r] for r in range(len(pipes))]


def _child(
    pipe: Connection,
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    args: tuple[Any, ...],
    store: str,
    timeout: float,
    backend: str,
) -> None:
    code = 1
    try:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        import torch.distributed as dist

        dist.init_process_group(
            backend,
            init_method=f"file://{store}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout),
        )
        result = fn(rank, world_size, *args)
        dist.barrier()  # peers may still be waiting on our last sends
        dist.destroy_process_group()
        pipe.send((True, result))
        code = 0
    except BaseException:
        pipe.send((False, traceback.format_exc()))
    finally:
        pipe.close()
        os._exit(code)
