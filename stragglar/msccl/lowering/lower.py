"""Export a proved schedule as MSCCL XML: one in-place AllReduce ``<algo>`` for NCCL's MSCCL executor.

:func:`lower` checks the request and the options (:class:`XmlOptions`), then runs the stages, one
module each (msccl-tools' habit):

1. :mod:`~stragglar.msccl.lowering.rounds`: each round cut into pieces, steps' worth of chunks per
   FIFO, with scratch where an in-place receive would overwrite a chunk still being sent;
2. :mod:`~stragglar.msccl.lowering.threadblocks`: a thread block pair per FIFO, channels, and the
   operations in issue order;
3. :mod:`~stragglar.msccl.lowering.dependencies`: dependencies that order every chunk access
   within a GPU; a thread block past the executor's step limit sends stages 2-3 round again with
   its FIFO split (the limits a split can only bring nearer are checked on each pass:
   :func:`~stragglar.msccl.lowering.threadblocks.check_growing`);
4. :func:`~stragglar.msccl.lowering.threadblocks.number`: thread-block ids and the remaining limits;
5. :mod:`~stragglar.msccl.lowering.emit`: the text.

The file is then proved from its text by :mod:`stragglar.msccl.prover`, which shares none of
these structures.

>>> from stragglar.synth import synthesize
>>> from stragglar.verify import prove
>>> xml = lower(prove(synthesize("stragglar", 4)))
>>> xml.splitlines()[0][:72]
'<algo name="stragglar-n4-s3-simple" proto="Simple" nchannels="1" nchunks'
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from stragglar.args import as_int
from stragglar.errors import ArgumentError, described
from stragglar.files import write_text
from stragglar.msccl.errors import MscclExportError
from stragglar.msccl.lowering.dependencies import Programs, order
from stragglar.msccl.lowering.emit import Header, render
from stragglar.msccl.lowering.rounds import schedule_pieces
from stragglar.msccl.lowering.threadblocks import Fifo, assign, check_growing, number
from stragglar.msccl.vocabulary import (
    MAX_CHANNELS,
    MAX_DEPENDENCY_TB,
    MAX_OFFSET,
    MAX_STEPS,
    MAX_TBS,
    MAX_TBS_PER_CHANNEL,
    PROTOCOLS,
    legacy_scratch,
    size_window,
)
from stragglar.schedule import Schedule, base_name, gc_paused
from stragglar.units import count_of, format_bytes
from stragglar.verify import Proof, require_proof

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_SCRATCH_MAX_BYTES",
    "MAX_XML_CELLS",
    "MAX_XML_RANKS",
    "XmlOptions",
    "check_export_size",
    "check_request",
    "default_name",
    "lower",
    "lower_with",
    "write_msccl",
]

DEFAULT_MAX_BYTES = 1 << 40
# A file with scratch (Direct's) gets a smaller default: the older microsoft/msccl runtime reserves
# maxBytes x s_chunks / nchunksperloop of GPU memory for it as it loads (see legacy_scratch).
DEFAULT_SCRATCH_MAX_BYTES = 1 << 30
# The largest files written: lowering and proving a file grow as N^3 (Ring: 16 s at N = 128, 2
# minutes at 256), and StragglAR, the reason for the format, stops at N = 128 anyway (see
# check_request).  Cells are (GPU, chunk) pairs of a loop: N x chunks x instances.
MAX_XML_RANKS = 128
MAX_XML_CELLS = MAX_XML_RANKS * MAX_XML_RANKS
_NAME = re.compile(r"[A-Za-z0-9_.:+-]{1,128}")


def default_name(schedule: Schedule, proto: str = "Simple", instances: int = 1) -> str:
    """``stragglar-n8-s7-simple`` style: :func:`~stragglar.schedule.base_name`, protocol, instances if > 1."""
    more = f"-x{instances}" if instances > 1 else ""
    return f"{base_name(schedule)}-{proto.lower()}{more}"


@dataclass(frozen=True, slots=True)
class XmlOptions:
    """How to write the file.

    ``instances`` copies of the schedule run side by side on consecutive slices of the chunks;
    ``min_bytes``/``max_bytes`` are the message sizes the executor selects the file for
    (``max_bytes`` None: :data:`DEFAULT_MAX_BYTES`, or :data:`DEFAULT_SCRATCH_MAX_BYTES` for a file
    that needs scratch, whose reserve on the older microsoft/msccl runtime grows with it); ``name``
    defaults to :func:`default_name`.  The counts may be any integral type (``np.int64(2)``) and
    are kept as ``int``; a bool or a float is refused here with an
    :class:`~stragglar.errors.ArgumentError`, as everywhere in the API (:mod:`stragglar.args`),
    values out of range by :func:`lower`.
    """

    name: str | None = None
    proto: str = "Simple"
    instances: int = 1
    min_bytes: int = 0
    max_bytes: int | None = None

    def __post_init__(self) -> None:
        for label in ("instances", "min_bytes", "max_bytes"):
            value = getattr(self, label)
            if value is not None or label != "max_bytes":
                object.__setattr__(self, label, as_int(value, label))


def lower(proof: Proof, options: XmlOptions | None = None) -> str:
    """The MSCCL XML text of the proved schedule: deterministic, ends with a newline.

    Raises :class:`~stragglar.msccl.errors.MscclExportError` for a bad option or a schedule that
    does not fit the executor.
    """
    require_proof(proof)
    options = XmlOptions() if options is None else options
    if not isinstance(options, XmlOptions):
        raise ArgumentError(f"options must be an XmlOptions, got {type(options).__name__}")
    _check_options(options)
    instances = options.instances
    name = default_name(proof.schedule, options.proto, instances) if options.name is None else options.name
    check_request(proof.num_ranks, proof.num_chunks, instances)
    check_export_size(proof, instances)
    chunks = proof.num_chunks * instances
    header = Header(name, options.proto, 0, chunks, proof.num_ranks, options.min_bytes, options.max_bytes)
    # The pieces, dependencies and thread blocks of 128 GPUs are millions of small acyclic records,
    # all alive until the text is written: the collector's passes over them were a third of the
    # lowering.  _stages returns the text alone, the rest freed while still paused.
    with gc_paused():
        return _stages(proof, header)


def check_request(num_ranks: int, num_chunks: int, instances: int = 1, algorithm: str | None = None) -> None:
    """Refuse, before the schedule is even made, a file larger than stragglar writes or one the
    executor would refuse: at most :data:`MAX_XML_RANKS` GPUs and :data:`MAX_XML_CELLS` (GPU,
    chunk) cells per loop; and for ``algorithm="stragglar"`` (a schedule of stragglar's generator:
    callers name it only then) at most ``N x instances = 128`` for N >= 3.

    StragglAR's straggler exchanges a chunk with every other GPU, sending it from one thread block
    and adding the peer's into it in another, so one of the two waits for the other: a thread
    block that others wait on per peer and instance, and the executor's int8 ``depid`` names only
    128.  From N = 3 on the lowering needs one more per instance (N x instances: measured for
    every N up to 128, and some take N + 1, which the lowering itself refuses, in seconds).

    >>> check_request(128, 127, algorithm="stragglar")
    >>> check_request(65, 64, instances=2, algorithm="stragglar")
    Traceback (most recent call last):
    ...
    stragglar.msccl.errors.MscclExportError: StragglAR over 65 GPUs with 2 instances needs at least 130 \
thread blocks that others wait on, but dependency targets must have ids <= 127: MSCCL XML takes \
StragglAR up to N = 128 with one instance (N x instances <= 128)
    """
    num_ranks = as_int(num_ranks, "num_ranks", minimum=2)
    num_chunks = as_int(num_chunks, "num_chunks", minimum=1)
    instances = as_int(instances, "instances", minimum=1)
    if algorithm is not None and not isinstance(algorithm, str):
        raise ArgumentError(f"algorithm must be a name (a str) or None, got {type(algorithm).__name__}")
    if num_ranks > MAX_XML_RANKS:
        raise MscclExportError(
            f"{num_ranks} GPUs: stragglar writes MSCCL XML for at most {MAX_XML_RANKS} (StragglAR stops "
            "there, and a file's lowering and proof grow as N^3)"
        )
    waited_on = (num_ranks if num_ranks >= 3 else 1) * instances  # the instances can pass the limit
    if algorithm == "stragglar" and waited_on > MAX_DEPENDENCY_TB + 1:
        raise MscclExportError(
            f"StragglAR over {num_ranks} GPUs with {count_of(instances, 'instance')} needs at least "
            f"{waited_on} thread blocks that others wait on, but dependency targets must have ids <= "
            f"{MAX_DEPENDENCY_TB}: MSCCL XML takes StragglAR up to N = {MAX_DEPENDENCY_TB + 1} with one "
            f"instance (N x instances <= {MAX_DEPENDENCY_TB + 1})"
        )
    cells = num_ranks * num_chunks * instances
    if cells > MAX_XML_CELLS:
        raise MscclExportError(
            f"{num_ranks} GPUs x {num_chunks} chunks x {count_of(instances, 'instance')}: stragglar writes "
            f"MSCCL XML of at most {MAX_XML_CELLS:,} (GPU, chunk) cells per loop"
        )


def check_export_size(proof: Proof, instances: int = 1) -> None:
    """Refuse, in milliseconds, a schedule the executor cannot hold, before minutes of lowering.

    Each (sender, receiver) pair of each instance needs a thread block on both GPUs, and a
    channel carries at most 32 sending (receiving) thread blocks per GPU; these are lower bounds
    on what the lowering needs, so a schedule over them would fail anyway.
    """
    sends: dict[int, set[int]] = {}
    receives: dict[int, set[int]] = {}
    for _, _, t in proof.schedule.transfers():
        sends.setdefault(t.src, set()).add(t.dst)
        receives.setdefault(t.dst, set()).add(t.src)
    for gpu in range(proof.num_ranks):
        out, into = len(sends.get(gpu, ())) * instances, len(receives.get(gpu, ())) * instances
        if out + into > MAX_TBS:
            raise MscclExportError(
                f"gpu {gpu} needs at least {out + into} thread blocks (one per peer and direction), the "
                f"executor allows {MAX_TBS}: use fewer instances or a smaller N"
            )
        if -(-max(out, into) // MAX_TBS_PER_CHANNEL) > MAX_CHANNELS:
            raise MscclExportError(
                f"gpu {gpu} talks to {max(out, into)} peers one way, more than {MAX_CHANNELS} channels of "
                f"{MAX_TBS_PER_CHANNEL} can carry: use fewer instances or a smaller N"
            )


def lower_with(proof: Proof, **options: Any) -> str:
    """:func:`lower` with the fields of :class:`XmlOptions` as keywords (``name``, ``proto``,
    ``instances``, ``min_bytes``, ``max_bytes``)."""
    return lower(require_proof(proof), XmlOptions(**options))


def write_msccl(proof: Proof, path: str | os.PathLike[str], **options: Any) -> None:
    """Write :func:`lower_with` of ``proof`` (same keyword options) to the file ``path``."""
    write_text(path, lower_with(proof, **options))


def _stages(proof: Proof, header: Header) -> str:
    """The stages, in order (see the module docstring); ``header.nchannels`` is filled in here."""
    schedule = proof.schedule
    instances = header.nchunksperloop // schedule.num_chunks
    if header.nchunksperloop > MAX_OFFSET:
        raise MscclExportError(
            f"{header.nchunksperloop} chunks per loop exceed the executor's int16 offsets "
            f"({MAX_OFFSET}): use fewer instances"
        )
    rounds, back = schedule_pieces(schedule, instances)
    splits: defaultdict[Fifo, set[int]] = defaultdict(set)
    while True:
        assignment = assign(rounds, back, schedule.num_ranks, schedule.num_chunks, splits)
        check_growing(assignment, schedule.num_ranks)
        programs = order(assignment)
        over = _overflows(programs)
        if not over:
            break
        for fifo, item in over:
            if item == 0 or item in splits[fifo]:
                raise MscclExportError(
                    f"one step needs more than {MAX_STEPS} step slots (nops for its dependencies): "
                    "the schedule is too dense for the executor"
                )
            splits[fifo].add(item)
    targets = {s.dep[0] for steps in programs.steps.values() for s in steps if s.dep is not None}
    sizes = {tb: len(programs.steps[tb]) for tb in programs.tbs}
    numbered = number(programs.tbs, targets, sizes, schedule.num_ranks, assignment.nchannels)
    max_bytes = _max_bytes(header, max(assignment.scratch))
    return render(
        dataclasses.replace(header, nchannels=assignment.nchannels, max_bytes=max_bytes),
        programs,
        numbered,
        assignment.scratch,
    )


def _max_bytes(header: Header, scratch: int) -> int:
    """The file's maxBytes: the one asked for, or the default for a file with ``scratch`` chunks on
    a GPU at most; refused where the older runtime's scratch reserve outgrows every GPU."""
    chosen = header.max_bytes
    if chosen is None:
        chosen = DEFAULT_SCRATCH_MAX_BYTES if scratch else DEFAULT_MAX_BYTES
        window = size_window(header.min_bytes, chosen)
        if window.never or window.partial:
            raise MscclExportError(  # in words: the command line calls it --min-bytes and --max-bytes
                f"the smallest message size, {format_bytes(header.min_bytes)}, is not below the default "
                f"largest of a file with scratch, {format_bytes(chosen)} (the older microsoft/msccl runtime "
                "reserves maxBytes x s_chunks / nchunksperloop of GPU memory for it): give a largest "
                "message size"
            )
    reserve = legacy_scratch(chosen, scratch, header.nchunksperloop)
    if reserve is not None:  # a choice, as for the size window: files every executor loads
        raise MscclExportError(f"{reserve}: give a smaller largest message size")
    return chosen


def _overflows(programs: Programs) -> list[tuple[Fifo, int]]:
    """For each TB past the step limit, the FIFO item that must start a new TB pair."""
    over: dict[Fifo, int] = {}
    for tb in programs.tbs:
        first = next(((fifo, item) for pos, fifo, item in programs.items[tb] if pos >= MAX_STEPS), None)
        if first is not None:
            over[first[0]] = min(over.get(first[0], first[1]), first[1])
    return sorted(over.items())


def _check_options(options: XmlOptions) -> None:
    """Everything the caller chose, before a default name is made from ``proto`` (None: the default)."""
    name, proto, instances = options.name, options.proto, options.instances
    if name is not None and (not isinstance(name, str) or not _NAME.fullmatch(name)):
        raise MscclExportError(f"name {described(name)}: use 1-128 characters from A-Z a-z 0-9 _ . : + -")
    if proto not in PROTOCOLS:
        raise MscclExportError(f"proto {described(proto)}: choose from {', '.join(PROTOCOLS)}")
    if instances < 1:
        raise MscclExportError(f"instances must be an integer >= 1, got {described(instances)}")
    for label, value in (("min_bytes", options.min_bytes), ("max_bytes", options.max_bytes)):
        if value is not None and not 0 <= value < 1 << 63:
            raise MscclExportError(f"{label} must be an integer in [0, 2**63), got {described(value)}")
    # the reader's rule: it refuses `never`, warns of `partial`
    high = DEFAULT_MAX_BYTES if options.max_bytes is None else options.max_bytes  # or less: _max_bytes
    window = size_window(options.min_bytes, high)
    problem = window.never or window.partial
    if problem is not None:  # a choice: we write files that every executor selects
        raise MscclExportError(
            f"{problem}: give a smallest message size below the largest (default 1 TiB, 1 GiB for a file "
            "with scratch)"
        )
