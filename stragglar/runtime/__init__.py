"""Run any proved AllReduce schedule on real data: NumPy in one process, torch.distributed, or CuPy/NCCL.

Every entry point takes a :class:`~stragglar.verify.Proof`, so only proved schedules run.  This
module names the runtime's surface; each part lives in a module named for what it does:
:func:`allreduce` across processes, with the header check that all ranks run the same one
(:mod:`~stragglar.runtime.distributed`, :mod:`~stragglar.runtime.header`, and which calls check it
and may run at once: :mod:`~stragglar.runtime.channels`), :func:`allreduce_local`
with every rank in this process (:mod:`~stragglar.runtime.local`), plans cached by the schedule's
fingerprint (:mod:`~stragglar.runtime.plans`), all over the one interpreter every transport shares
(:mod:`~stragglar.runtime.interpreter`), the buffers it sums (:mod:`~stragglar.runtime.arrays`)
and the words it fails in (:mod:`~stragglar.runtime.failures`).  Code that launches and watches
ranks (:mod:`stragglar.measure`) uses this surface only: the failure words, the host's clock
(:mod:`~stragglar.runtime.clock`) and a rank's heartbeat (:mod:`~stragglar.runtime.liveness`) are
named here for it.

>>> import numpy as np
>>> from stragglar.synth import synthesize
>>> from stragglar.verify import prove
>>> bufs = [np.arange(5, dtype=np.int64) * (r + 1) for r in range(3)]
>>> _ = allreduce_local(bufs, prove(synthesize("stragglar", 3)))
>>> bufs[2].tolist()
[0, 6, 12, 18, 24]
"""

from __future__ import annotations

from stragglar.errors import ArgumentError, InputError
from stragglar.runtime.arrays import DTYPES
from stragglar.runtime.channels import MAX_TAG
from stragglar.runtime.clock import Timeline, poll
from stragglar.runtime.cupy_nccl import NcclGroup
from stragglar.runtime.device.buffers import ENGINES
from stragglar.runtime.device.group import DeviceWork
from stragglar.runtime.device.shared import Registration
from stragglar.runtime.distributed import allreduce, register_buffer, release_graphs
from stragglar.runtime.failures import RankError, classify, failure_phrase, first_line
from stragglar.runtime.header import MismatchError, ranks_in_words
from stragglar.runtime.layout import Layout
from stragglar.runtime.liveness import connect_launcher, heartbeat, send_to_launcher
from stragglar.runtime.local import allreduce_local
from stragglar.runtime.plans import plan_for, rounds_without

__all__ = [
    "DTYPES",
    "ENGINES",
    "MAX_TAG",
    "ArgumentError",
    "DeviceWork",
    "InputError",
    "Layout",
    "MismatchError",
    "NcclGroup",
    "RankError",
    "Registration",
    "Timeline",
    "allreduce",
    "allreduce_local",
    "classify",
    "connect_launcher",
    "failure_phrase",
    "first_line",
    "heartbeat",
    "plan_for",
    "poll",
    "ranks_in_words",
    "register_buffer",
    "release_graphs",
    "rounds_without",
    "send_to_launcher",
]
