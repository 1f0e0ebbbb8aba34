"""The device executor: the whole AllReduce in one persistent kernel per rank.

A schedule is lowered to a flat table (:mod:`~stragglar.runtime.device.table`), proved from the
table's own contents (:mod:`~stragglar.runtime.device.prover`), and run by a CUDA kernel
(:mod:`~stragglar.runtime.device.kernel`) that reaches its peers' memory by pointer and waits for
each transfer on a flag its peer raises, with every wait bounded by a clock.
"""

from stragglar.runtime.device.programs import program_for
from stragglar.runtime.device.table import DeviceProgram

__all__ = ["DeviceProgram", "program_for"]
