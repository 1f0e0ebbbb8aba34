"""What a call across processes runs on: the :class:`Engine` interface, and which engine a call gets.

:func:`~stragglar.runtime.distributed.allreduce` takes its steps once for every engine; what
differs between torch.distributed (:class:`~stragglar.runtime.torch_dist.TorchEngine`) and
CuPy/NCCL (:class:`~stragglar.runtime.cupy_nccl.NcclEngine`) is what an :class:`Engine` offers: the
group, the header gather, a transport for the rounds, the packing, the graphs and the check that
they may be captured.  :func:`engine_for` picks one from a call's data and group, and
:func:`engine_for_call` keeps this rank's own problem with its data for after the header's gather
(:mod:`stragglar.runtime.refusals`) wherever a group can carry the header.  Another engine is
another implementation of :class:`Engine`, picked here.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Hashable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from stragglar.errors import ArgumentError, InputError
from stragglar.runtime.arrays import Array
from stragglar.runtime.cupy_nccl import NcclEngine, NcclGroup
from stragglar.runtime.graphs import Capturing
from stragglar.runtime.header import Problem
from stragglar.runtime.interpreter import Packing, Transport
from stragglar.runtime.program import Plan
from stragglar.runtime.refusals import RankProblem

__all__ = ["Engine", "engine_for", "engine_for_call"]


class Engine(Protocol):
    """What a call across processes runs on: one group of one engine (torch.distributed,
    CuPy/NCCL), made by :func:`engine_for` once the call's options fit it.

    - the group: ``rank`` and ``size`` (this rank's, the group's); ``owner``, the group as the
      channels and a graph's key know it; ``stream``, what the whole call runs inside (the stream
      its rounds run on, or nothing);
    - the header check: :meth:`channel`, the call's channel for its tag; :meth:`sendable`, a
      TypeError for a buffer the engine cannot send (its dtype, or where it is); :meth:`gather`,
      every rank's header all-gathered (in memory like ``like``, the buffer);
    - the rounds: :meth:`transport` moves them (a
      :class:`~stragglar.runtime.interpreter.Transport`); :meth:`buffer` names a buffer whose rounds
      replay from a CUDA graph (all a graph of them bakes in; None: they run eagerly), and
      :meth:`packing` packs and lands its messages (``tables``: what tables made for them depend
      on);
    - the graphs: ``capturing`` makes them (:class:`~stragglar.runtime.graphs.Capturing`), and
      :meth:`uncapturable` says why none may be made (an NCCL too old to be captured), or None.
    """

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    @property
    def owner(self) -> Hashable: ...

    @property
    def stream(self) -> AbstractContextManager[Any]: ...

    @property
    def capturing(self) -> Callable[[], Capturing]: ...

    def channel(self, tag: int) -> int | None: ...

    def sendable(self, flat: Array) -> None: ...

    def gather(
        self, header: Sequence[int], like: Array, timeout: float | None, channel: int | None
    ) -> list[tuple[int, ...]]: ...

    def transport(self, plan: Plan, flat: Array, timeout: float | None) -> Transport: ...

    def buffer(self, flat: Array, plan: Plan) -> Hashable | None: ...

    def packing(self, plan: Plan, flat: Array, tables: Hashable) -> Packing: ...

    def uncapturable(self) -> str | None: ...


def engine_for(
    data: Any, group: Any, stream_ordered: bool, graphs: bool | None, action: str = "allreduce"
) -> Engine:
    """The engine a call with ``data`` on ``group`` runs on, once its options fit it: an
    :class:`NcclGroup`'s, else torch.distributed's for a torch tensor; an ArgumentError, saying
    what the caller could not do (``action``), for anything else."""
    if isinstance(group, NcclGroup):
        return NcclEngine(data, group, stream_ordered, graphs)
    torch = sys.modules.get("torch")  # never imported here: a torch tensor means it is loaded
    if torch is not None and isinstance(data, torch.Tensor):
        from stragglar.runtime.torch_dist import TorchEngine

        return TorchEngine(group, stream_ordered, graphs)
    raise _no_tensor(data, action)


def _no_tensor(data: Any, action: str) -> ArgumentError:
    return ArgumentError(
        f"cannot {action} a {type(data).__name__} across processes: pass a torch tensor, or an array "
        "with an NcclGroup (allreduce_local takes one array per rank)"
    )


def engine_for_call(
    data: Any, group: Any, stream_ordered: bool, graphs: bool | None, problem: RankProblem | None
) -> tuple[Engine, RankProblem | None]:
    """A call's engine (:func:`engine_for`), and this rank's own problem with its data, raised
    after the header's gather (None: none): ``problem`` (the device engine's), else data that is no
    torch tensor on a torch process group, whose header a
    :class:`~stragglar.runtime.torch_dist.TorchEngine` of the group gathers all the same.  Where no
    group can carry the header (no torch process group; a device problem on an :class:`NcclGroup`:
    :mod:`stragglar.runtime.refusals`), the problem's error is raised at once."""
    torch = sys.modules.get("torch")  # never imported here: a torch group means it is loaded
    if problem is None and (torch is None or isinstance(group, NcclGroup) or isinstance(data, torch.Tensor)):
        return engine_for(data, group, stream_ordered, graphs), None
    own = problem or RankProblem(Problem.NOT_A_TENSOR, _no_tensor(data, "allreduce"))
    if torch is None or isinstance(group, NcclGroup):
        raise own.error
    from stragglar.runtime.torch_dist import TorchEngine

    try:
        return TorchEngine(group, stream_ordered, graphs), own
    except (ArgumentError, InputError):  # no group to carry the header: this rank's own error, at once
        raise own.error from None
