"""The engine's own all_reduce, for the buckets the policy does not give to StragglAR's rounds.

Such a bucket is reduced as DDP's default hook reduces it: one asynchronous all_reduce of the
engine's (gloo, NCCL).  What the hook adds to it is kept here, apart from StragglAR's rounds
(:mod:`stragglar.ddp.worker`), which it shares nothing with but the state: the call is timed for
the policy (:mod:`stragglar.ddp.probe`), on the host bounded by the state's timeout
(:mod:`stragglar.ddp.deadlines`) on a gloo group of the hook's own whose own timeout outlasts it
(:data:`ENGINE_GRACE`), and a failure is a :class:`~stragglar.runtime.RankError` that says which
timeout ended it, and on the host which ranks had not reached the call (or, where a peer was
lost, were not in it) (:mod:`stragglar.runtime.roll_call`).
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from stragglar.ddp import deadlines
from stragglar.ddp.orders import Order
from stragglar.ddp.state_parts import Resources
from stragglar.ddp.worker import CLOSE_WAIT, named_globally
from stragglar.model.policy import ALLREDUCE
from stragglar.runtime import RankError
from stragglar.runtime.failures import checking_error, classify, error_line
from stragglar.runtime.roll_call import MARK, with_absent

__all__ = ["ENGINE_GRACE", "all_reduce", "engine_error", "gloo_on_host", "value"]

# Seconds by which gloo's own timeout on the engine's group (Connection.engine_group) outlasts the
# state's deadline.  A rank whose gloo call times out closes its pairs, and its peers then read a
# lost connection: so each rank's own deadline ends its wait first, however the ranks' calls were
# spread in time (by less than this), and gloo ends the call soon after, well within close()'s wait.
ENGINE_GRACE = 2.0
assert ENGINE_GRACE < CLOSE_WAIT


def all_reduce(
    buffer: torch.Tensor,
    divisor: int,
    order: Order,
    host_group: Any,
    in_call: bool,
    group: Any,
    seconds: float,
    resources: Resources,
) -> torch.futures.Future[torch.Tensor]:
    """The engine's own all_reduce, as DDP's default hook runs it, timed for the policy: its
    Future completes (through the engine's stream on CUDA) with the sum divided by
    ``divisor``, or fails with a :class:`RankError`.  On CUDA it runs on DDP's group ``group``; on
    the host on ``host_group`` (:attr:`Connection.engine_group`; None: DDP's group), bounded by
    the state's deadline of ``seconds``, past which the error names the ranks that had not
    reached the call (the connection's roll call, where it has one).  ``in_call`` (a caller that
    waits for the Future itself: FSDP's hook): the Future whose ``wait`` raises the RankError
    itself, not torch's RuntimeError that quotes it with the stack of the callback that read it.
    ``resources``: the state's, where the call's watch and (on the host) the call itself are kept."""
    watch = resources.engine_watch = order.clock(resources.engine_watch)
    probe = resources.probe
    record = probe.record if probe is not None else None
    size = buffer.numel() * buffer.element_size()
    rank = dist.get_rank(group)
    on_host = not buffer.is_cuda and host_group is not None
    connection = resources.connection
    roll = connection.roll_call if on_host and connection is not None else None
    call = roll.begin() if roll is not None else 0

    def averaged(future: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        watch.stop()
        if record is not None:
            record(ALLREDUCE, size, 0, watch)
        try:
            total = future.value()[0]
        except Exception as e:  # a peer died, or its group's own timeout ended the call
            resources.failed = True
            if roll is not None:  # this rank was in the call: a peer still waiting must not name it
                roll.mark(call)
            bound = None if buffer.is_cuda else seconds  # on CUDA the process group's bounds it
            raise named_globally(engine_error(rank, e, bound), group) from e
        return total if divisor == 1 else total.div_(divisor)

    work = dist.all_reduce(buffer, group=host_group if on_host else group, async_op=True)
    engine: torch.futures.Future[list[torch.Tensor]] = work.get_future()
    if buffer.is_cuda:  # ordered on CUDA streams; NCCL's watchdog bounds it (deadlines.py)
        return engine.then(averaged)

    def late() -> RankError:  # in a thread of its own, the outcome claimed (deadlines.py)
        resources.failed = True
        absent = (roll.absent(call, seconds) if roll is not None else None) or []
        return named_globally(engine_error(rank, None, seconds, absent), group, absent)

    def lost(error: BaseException) -> BaseException:  # likewise: a peer lost, in gloo's words
        gloo = error.__cause__
        if roll is None or gloo is None or classify(gloo) != "lost the connection":
            return error
        absent = roll.absent(call, seconds) or []  # gloo names an address; the roll call, ranks
        return named_globally(engine_error(rank, gloo, seconds, absent), group, absent) if absent else error

    # a call that completed in time deletes the key its roll call may have written (once no rank
    # can still be reading it); a failed one leaves it, for the ranks still reading it
    completed = (lambda: roll.completed(call)) if roll is not None else None
    outcome, callback = deadlines.bounded(engine, averaged, seconds, late, completed, lost)
    if roll is not None and seconds > MARK:  # else its deadline comes first, and notes it
        deadlines.remind(outcome, MARK, lambda: roll.mark(call))
    resources.engine_calls.append((work, weakref.ref(callback)))  # see Resources
    del callback  # from here on, only gloo's thread holds it
    return outcome if in_call else outcome.then(value)  # DDP reads a failed Future as an error


def value(future: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
    """``future``'s value, for ``then``: DDP reads a failed Future's value as its result ("Unable
    to cast ... to Tensor"); an error raised in a callback reaches it as an error, message intact."""
    return future.value()


def engine_error(
    rank: int, error: BaseException | None, seconds: float | None, absent: Sequence[int] = ()
) -> RankError:
    """The engine's all_reduce failed on ``rank`` with ``error`` (None: past its deadline of
    ``seconds``).  On the host, where the deadline bounds it, a silent peer is said alike whether
    the deadline or the group's own timeout (the deadline's and a grace) came first, with the
    ranks the roll call found ``absent`` (the first is the error's peer, so a launcher's summary
    names it); else (``seconds`` None: on CUDA, the process group's timeout) in the engine's
    words.  A lost peer is said in the engine's words, with the ranks the roll call did not find
    in the call: one that died in it before it noted itself is not told apart from one that
    never came."""
    reason = "timed out" if error is None else classify(error)
    timed_out = seconds is not None and reason == "timed out"
    if timed_out:
        detail = f"no answer within {seconds:g} s (the state's timeout)"
    else:
        detail = error_line(error) if error is not None else "no answer"
    detail, peer = with_absent(detail, absent, timed_out)
    return checking_error(rank, reason, detail, peer, during="in the engine's all_reduce")


def gloo_on_host(group: Any) -> bool:
    """Whether ``group`` (None: the world) reduces host tensors with gloo ("gloo", or a
    "cpu:gloo,cuda:nccl" pair): only then is the engine's group made, with gloo (an MPI or
    oneCCL group keeps its own backend, and its own timeouts)."""
    backend = str(dist.get_backend(group))
    return backend == "gloo" or "cpu:gloo" in backend
