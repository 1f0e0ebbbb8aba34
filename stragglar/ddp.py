"""A PyTorch DDP communication hook that all-reduces gradient buckets with a StragglAR schedule.

>>> from stragglar.ddp import StragglarState, stragglar_hook          # doctest: +SKIP
>>> ddp.register_comm_hook(StragglarState(straggler=3), stragglar_hook)  # doctest: +SKIP
>>> ddp.register_comm_hook(StragglarState(detect=20), stragglar_hook)    # doctest: +SKIP

The hook runs the schedule's rounds before it returns and hands back a completed Future: gloo has
no futures for point-to-point work, and every bucket finishing in order keeps tags simple.
Gradients are summed, then divided by the world size, as the default hook does.  (No
``from __future__ import annotations`` here: DDP compares the hook's annotations with the classes.)

With ``detect=W`` the hook finds the straggler itself: :class:`LateRankProbe` notes which rank
arrives last at each step, and once one rank has been last in at least ``share`` of the last
``W`` steps it becomes the straggler (the schedule is relabelled, every rank deciding from the
same gathered figures, so all switch at the same bucket).
"""

import collections
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed import GradBucket  # type: ignore[attr-defined, unused-ignore]

from stragglar.args import as_int, as_rank, as_seconds
from stragglar.errors import ArgumentError, InputError
from stragglar.measure.launch import heartbeat
from stragglar.runtime import allreduce
from stragglar.synth import ALGORITHMS, synthesize
from stragglar.verify import Proof, prove

__all__ = ["LateRankProbe", "StragglarState", "persistent_late_rank", "stragglar_hook"]


def persistent_late_rank(history: Sequence[int], window: int, share: float) -> int | None:
    """The rank that arrived last in at least ``share`` of the last ``window`` steps, if any.

    >>> persistent_late_rank([2, 2, 1, 2], window=4, share=0.75)
    2
    >>> persistent_late_rank([2, 2, 1], window=4, share=0.75) is None  # not a full window yet
    True
    """
    recent = list(history)[-window:]
    if len(recent) < window:
        return None
    rank, count = collections.Counter(recent).most_common(1)[0]
    return rank if count >= share * window else None


class LateRankProbe:
    """Which rank arrives last at each step, found without making the others wait for it.

    At each step every rank posts a tiny asynchronous all_gather on its own gloo group and notes
    when it posted; the time until that gather completes is how long the rank would have waited
    for the last one (about 0 for the late rank itself).  Each step's gather carries the waits of
    the step before, and is read one step later, when it has surely completed: this rank has
    finished the AllReduce after it, which needs every rank to have arrived.
    """

    def __init__(self, world_size: int, window: int) -> None:
        self.world_size = world_size
        self.group = dist.new_group(backend="gloo")  # off the data path: CPU, its own sockets
        self.history: collections.deque[int] = collections.deque(maxlen=window)
        self._wait = 0.0  # this rank's wait at the last step whose gather has completed
        self._pending: tuple[Any, list[torch.Tensor], float] | None = None

    def step(self) -> None:
        """Call once per step, first thing: adds the rank that was last two steps ago to ``history``."""
        if self._pending is not None:
            done, gathered, posted = self._pending
            self._wait = done.wait() - posted
            waits = [float(t) for t in gathered]
            if any(waits):  # the first gather carries no waits yet
                self.history.append(min(range(self.world_size), key=waits.__getitem__))
        gathered = [torch.zeros(1, dtype=torch.float64) for _ in range(self.world_size)]
        posted = time.perf_counter()
        work = dist.all_gather(
            gathered, torch.tensor([self._wait], dtype=torch.float64), group=self.group, async_op=True
        )
        done = work.get_future().then(lambda _: time.perf_counter())
        self._pending = (done, gathered, posted)


@dataclass
class StragglarState:
    """What the hook needs: the algorithm and straggler rank, the process group (None: world), a
    timeout in seconds, and the schedule per world size, synthesized and proved on first use.
    ``straggler_delay`` makes the straggler late on purpose, for experiments (with an algorithm
    that has no straggler, such as Ring, ``straggler`` is only the rank that is made late).
    ``detect=W`` (world group only) lets the hook find the straggler over windows of W steps;
    ``switches`` records each change as (step, new straggler).

    Arguments are checked here, in these terms: ``straggler=1.5`` or ``True`` is an
    :class:`~stragglar.runtime.ArgumentError` (a TypeError), a NumPy integer is a fine rank."""

    algorithm: str = "stragglar"
    straggler: int | None = None
    process_group: Any = None
    timeout: float = 300.0
    straggler_delay: float = 0.0
    detect: int = 0
    share: float = 0.75
    proofs: dict[tuple[int, int | None], Proof] = field(default_factory=dict)
    switches: list[tuple[int, int]] = field(default_factory=list)
    steps: int = 0
    probe: LateRankProbe | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.algorithm, str) or self.algorithm not in ALGORITHMS:
            raise InputError(
                f"StragglarState.algorithm must be one of {', '.join(ALGORITHMS)}, got {self.algorithm!r}"
            )
        if self.straggler is not None:
            self.straggler = as_int(self.straggler, "StragglarState.straggler", minimum=0)
        self.timeout = as_seconds(self.timeout, "StragglarState.timeout", positive=True)
        self.straggler_delay = as_seconds(self.straggler_delay, "StragglarState.straggler_delay")
        self.detect = as_int(self.detect, "StragglarState.detect", minimum=0)
        if isinstance(self.share, bool) or not isinstance(self.share, (int, float)):
            raise ArgumentError(f"StragglarState.share must be a number, got {self.share!r}")
        if not 0 < self.share <= 1:
            raise InputError(f"StragglarState.share must be in (0, 1], got {self.share!r}")

    def late_rank(self, world_size: int) -> int | None:
        """The straggler, checked against ``world_size`` (None: the schedule's default)."""
        if self.straggler is None:
            return None
        return as_rank(self.straggler, "StragglarState.straggler", world_size)

    def proof(self, world_size: int) -> Proof:
        """The proved schedule for ``world_size`` ranks and the current straggler."""
        late = self.late_rank(world_size)
        key = (world_size, late)
        if key not in self.proofs:
            schedule = synthesize(self.algorithm, world_size)
            if late is not None and schedule.straggler is not None and late != schedule.straggler:
                schedule = synthesize(self.algorithm, world_size, late)
            self.proofs[key] = prove(schedule)
        return self.proofs[key]

    def new_step(self, world_size: int) -> None:
        """Count the step and, when detecting, let a persistently late rank become the straggler.

        In a rank started by :func:`stragglar.measure.launch.launch` each step is also a
        heartbeat, so a long training run is not taken for a silent one."""
        self.steps += 1
        heartbeat()
        if self.detect <= 0 or world_size < 2:
            return
        if self.process_group is not None:
            raise InputError("straggler detection needs the default (world) process group")
        if self.probe is None:
            self.probe = LateRankProbe(world_size, self.detect)
        self.probe.step()
        late = persistent_late_rank(self.probe.history, self.detect, self.share)
        current = self.straggler if self.straggler is not None else world_size - 1
        if late is not None and late != current:
            self.straggler = late
            self.switches.append((self.steps, late))
            self.probe.history.clear()  # a new full window before the next change


def stragglar_hook(state: StragglarState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average ``bucket``'s gradients over the ranks with the state's schedule."""
    buffer = bucket.buffer()
    world = dist.get_world_size(state.process_group)
    if bucket.index() == 0:
        state.new_step(world)
    if world > 1:  # one rank: its gradients are the average already, nothing to send
        proof = state.proof(world)
        allreduce(
            buffer,
            proof,
            group=state.process_group,
            straggler_delay=state.straggler_delay,
            timeout=state.timeout,
            tag=bucket.index() * proof.num_rounds,
            late_rank=state.late_rank(world),
        )
        buffer.div_(world)
    else:
        state.late_rank(world)  # a straggler that is no rank of this group is still an error
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future()
    future.set_result(buffer)
    return future
