"""MSCCL XML's own vocabulary, shared by the lowering and the prover: what the executor accepts, and
the ``<step>`` element as a typed record.

The limits, protocols and step types are facts about the executor (Azure/msccl-executor-nccl,
RCCL, the older microsoft/msccl runtime, in a default build), not about our lowering: the exporter
refuses what breaks them and the reader rejects files that do, so both name the same numbers from
here.

A :class:`StepRecord` is the file format's own vocabulary too (like the IR is the schedules'), not
a structure of the lowering: the writer turns its steps into records only to print them, and the
prover judges records parsed back from the text, so a writer that prints the wrong thing is judged
by what it printed.

>>> StepRecord("s", "i", 0, "i", 0, 1, -1, -1, 0).line(0).split()[:4]
['<step', 's="0"', 'type="s"', 'srcbuf="i"']
"""

from __future__ import annotations

from dataclasses import dataclass

from stragglar.units import format_bytes

__all__ = [
    "CAPACITY",
    "LEGACY_SCRATCH_LIMIT",
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
    "Operands",
    "SizeWindow",
    "StepRecord",
    "legacy_scratch",
    "size_window",
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


@dataclass(frozen=True, slots=True)
class SizeWindow:
    """What the executors make of ``minBytes``/``maxBytes``: ``never`` says why none of them selects
    the file (a file that is never run: the reader refuses it), ``partial`` why one selects it and
    another does not (the reader warns; the exporter refuses both, as it writes files every
    executor selects); None where there is nothing to say."""

    never: str | None
    partial: str | None


# The older microsoft/msccl runtime reserves maxBytes x s_chunks / nchunksperloop bytes of scratch on
# each GPU as it loads a file (the Azure executor sizes scratch per call): past every GPU's memory
# (the largest hold 288 GB) its communicator fails to start.
LEGACY_SCRATCH_LIMIT = 1 << 39


def legacy_scratch(max_bytes: int, scratch_chunks: int, nchunks: int) -> str | None:
    """What the older runtime would reserve for a file's scratch, in words, where no GPU holds it;
    None where it may.  One rule for the reader (a warning) and the exporter (a refusal).

    >>> legacy_scratch(1 << 30, 7, 7) is None
    True
    >>> legacy_scratch(1 << 40, 7, 7).split(": ")[1]
    'microsoft/msccl reserves maxBytes x 7/7 = 1 TiB of scratch on a GPU as it loads the file'
    """
    reserve = max_bytes * scratch_chunks // nchunks
    if reserve <= LEGACY_SCRATCH_LIMIT:
        return None
    return (
        f"maxBytes {max_bytes} with s_chunks {scratch_chunks} of nchunksperloop {nchunks}: microsoft/msccl "
        f"reserves maxBytes x {scratch_chunks}/{nchunks} = {format_bytes(reserve)} of scratch on a GPU as "
        "it loads the file: more than any GPU holds (the Azure executor sizes scratch per call)"
    )


def size_window(min_bytes: int, max_bytes: int) -> SizeWindow:
    """The message sizes selecting a file, for the reader and the exporter alike.

    The Azure executor (and RCCL) selects a file for ``minBytes <= size <= maxBytes``,
    ``maxBytes="0"`` meaning no limit, comparing the int64 fields with an unsigned size; the older
    microsoft/msccl runtime selects it for ``minBytes <= size < maxBytes`` and refuses to load a
    file with a negative field or ``minBytes > maxBytes``.

    >>> size_window(0, 1 << 40)
    SizeWindow(never=None, partial=None)
    >>> size_window(0, 0).partial.startswith("maxBytes 0 is no limit to the Azure executor")
    True
    """
    if min_bytes < 0 or max_bytes < 0:
        why = "microsoft/msccl refuses a negative one, the Azure executor compares them unsigned"
        return SizeWindow(f"minBytes {min_bytes} / maxBytes {max_bytes}: {why}", None)
    if max_bytes and max_bytes < min_bytes:
        never = f"minBytes {min_bytes} / maxBytes {max_bytes}: no message size selects the algorithm"
        return SizeWindow(never, None)
    microsoft = "microsoft/msccl (minBytes <= size < maxBytes)"
    if max_bytes == 0:
        return SizeWindow(
            None, f"maxBytes 0 is no limit to the Azure executor, never selected by {microsoft}"
        )
    if max_bytes == min_bytes:
        one = f"minBytes = maxBytes = {max_bytes}: one size to the Azure executor, none to {microsoft}"
        return SizeWindow(None, one)
    return SizeWindow(None, None)


@dataclass(frozen=True)
class Operands:
    """What a step does: its type, where it reads and writes (buffer and chunk offset), how many chunks."""

    type: str
    srcbuf: str
    srcoff: int
    dstbuf: str
    dstoff: int
    cnt: int


@dataclass(frozen=True)
class StepRecord(Operands):
    """One ``<step>``: its operands and its dependency."""

    depid: int  # the thread block waited for, -1 for none
    deps: int  # the step of that thread block waited for
    hasdep: int  # 1 if other thread blocks wait for this step

    @classmethod
    def of(cls, operands: Operands, depid: int, deps: int, hasdep: int) -> StepRecord:
        o = operands
        return cls(o.type, o.srcbuf, o.srcoff, o.dstbuf, o.dstoff, o.cnt, depid, deps, hasdep)

    def line(self, position: int) -> str:
        """The element's text as the executor's tokenizer wants it: one line, double quotes."""
        return (
            f'      <step s="{position}" type="{self.type}" srcbuf="{self.srcbuf}" srcoff="{self.srcoff}" '
            f'dstbuf="{self.dstbuf}" dstoff="{self.dstoff}" cnt="{self.cnt}" depid="{self.depid}" '
            f'deps="{self.deps}" hasdep="{self.hasdep}"/>'
        )
