"""torch.distributed point-to-point transport (gloo on CPU, NCCL on GPU).

Gloo: every irecv of the round is posted before any isend, with the round as tag, then all are
waited with a timeout (``batch_isend_irecv`` is a plain loop on gloo and can hang).  NCCL: one
``batch_isend_irecv`` per round, which NCCL runs as one group; it ignores tags and matches in issue
order, which is the same on both ends.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from stragglar.runtime.engine import RankError, describe
from stragglar.runtime.program import BoundStep, Plan

__all__ = ["TorchTransport"]


class TorchTransport:
    """Moves a rank's rounds over ``group`` (None: the default group)."""

    def __init__(self, plan: Plan, group: Any, timeout: float | None) -> None:
        self.plan = plan
        self.group = group
        self.timeout = timedelta(seconds=timeout) if timeout is not None else None
        self.nccl = dist.get_backend(group) == "nccl"
        self.ranks = [
            dist.get_global_rank(group, r) if group is not None else r for r in range(plan.program.num_ranks)
        ]

    def exchange(self, step: BoundStep, sends: list[torch.Tensor], recvs: list[torch.Tensor]) -> None:
        try:
            works = self._post(step, sends, recvs)
            for work in works:
                ok = work.wait(self.timeout) if self.timeout is not None else work.wait()
                if ok is False:
                    raise TimeoutError(f"no answer within {self.timeout}")
        except Exception as e:  # the engines raise RuntimeError, DistBackendError or TimeoutError
            raise RankError(f"allreduce failed at {describe(self.plan, step)}: {e}") from e

    def _post(self, step: BoundStep, sends: list[torch.Tensor], recvs: list[torch.Tensor]) -> list[Any]:
        g, ranks = self.group, self.ranks
        if self.nccl:
            ops = [
                dist.P2POp(dist.irecv, t, ranks[m.peer], g, m.tag)
                for m, t in zip(step.recvs, recvs, strict=True)
            ]
            ops += [
                dist.P2POp(dist.isend, t, ranks[m.peer], g, m.tag)
                for m, t in zip(step.sends, sends, strict=True)
            ]
            return list(dist.batch_isend_irecv(ops))
        works = [dist.irecv(t, ranks[m.peer], g, m.tag) for m, t in zip(step.recvs, recvs, strict=True)]
        works += [dist.isend(t, ranks[m.peer], g, m.tag) for m, t in zip(step.sends, sends, strict=True)]
        return works

    def finish(self) -> None:
        """Nothing queued: every round was waited for."""
