"""What the MSCCL executor accepts: its limits, protocols and step types, stated once.

These are facts about the executor (Azure/msccl-executor-nccl, RCCL, the older microsoft/msccl
runtime, in a default build), not about our lowering: the exporter refuses what breaks them and
the reader rejects files that do, so both name the same numbers from here.
"""

from __future__ import annotations

from stragglar.errors import InputError

__all__ = [
    "CAPACITY",
    "MAX_ATTRS",
    "MAX_CHANNELS",
    "MAX_COUNT",
    "MAX_DEPENDENCY_TB",
    "MAX_NODES",
    "MAX_OFFSET",
    "MAX_REDUCE_FUSION",
    "MAX_STEPS",
    "MAX_STR",
    "MAX_SUBS",
    "MAX_TBS",
    "MAX_TBS_PER_CHANNEL",
    "PROTOCOLS",
    "READS_SRC",
    "RECV_TYPES",
    "SEND_TYPES",
    "TYPES",
    "WRITES_DST",
    "MscclExportError",
]

CAPACITY = {"Simple": 2, "LL": 8, "LL128": 8}  # protocol -> chunk transfers a connection buffers
PROTOCOLS = tuple(CAPACITY)

MAX_STEPS = 64  # MSCCL_MAX_NUM_STEPS: steps per thread block (TB), nops included
MAX_COUNT = 72  # MSCCL_MAX_COUNT: a step's cnt must stay below it
MAX_DEPENDENCY_TB = 127  # dependentBid is an int8
MAX_CHANNELS = 32  # MAXCHANNELS
MAX_TBS_PER_CHANNEL = 32  # sending (receiving) TBs per channel and rank
MAX_TBS = 1024  # MSCCL_MAX_NUM_THREAD_BLOCKS
MAX_NODES = 4096  # XML elements the parser keeps for one rank: algo, gpus, its tbs and steps
MAX_SUBS = 1024  # children of one element the parser keeps
MAX_OFFSET = 32767  # offsets are int16
MAX_ATTRS = 16  # attributes of one element the parser keeps
MAX_STR = 255  # characters of a name or value
MAX_REDUCE_FUSION = 16  # consecutive ``re`` steps the executor fuses into one

SEND_TYPES = frozenset({"s", "rcs", "rrs", "rrcs"})
RECV_TYPES = frozenset({"r", "rcs", "rrs", "rrc", "rrcs"})
READS_SRC = frozenset({"s", "rrs", "rrc", "rrcs", "cpy", "re"})
WRITES_DST = frozenset({"r", "rcs", "rrc", "rrcs", "cpy", "re"})
TYPES = SEND_TYPES | RECV_TYPES | {"cpy", "re", "nop"}


class MscclExportError(InputError):
    """A schedule or option the executor cannot take; the one-line message names the limit and the fix."""
