"""The device executor: the whole AllReduce in one persistent kernel per rank.

A schedule is lowered to a flat table (:mod:`~stragglar.runtime.device.table`), proved from the
table's own contents (:mod:`~stragglar.runtime.device.prover`), and run by a CUDA kernel
(:mod:`~stragglar.runtime.device.kernel_source`) that reaches its peers' memory by pointer and
waits for each transfer on a flag its peer raises (small chunks: on packets that carry their own
mark), with every wait bounded by a clock.  Ranks in one process
run from :mod:`~stragglar.runtime.device.loopback`, ranks in processes of their own from
:mod:`~stragglar.runtime.device.group`, over CUDA IPC (:mod:`~stragglar.runtime.device.ipc`) and,
for direct transfers between processes, buffers registered once
(:mod:`~stragglar.runtime.device.shared`).
"""

from stragglar.runtime.device.programs import program_for, program_for_call
from stragglar.runtime.device.table import DeviceProgram

__all__ = ["DeviceProgram", "program_for", "program_for_call"]
