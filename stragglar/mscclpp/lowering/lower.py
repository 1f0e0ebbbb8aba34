"""Lower a schedule to an MSCCL++ execution plan (JSON) for the MSCCL++ executor.

The plan is an in-place AllReduce on the Simple protocol over memory channels (direct NVLink/PCIe
peer access): every transfer is a one-sided ``put`` into a scratch slot of the receiver reserved
for it, a ``signal``, a ``wait`` on the receiver and a local ``re`` (reduce) or ``copy``.  The stages:

1. :func:`stragglar.mscclpp.lowering.rounds.build_programs`: per GPU and round, the runs of
   chunks it sends and receives, and the scratch slot of every transfer;
2. :func:`stragglar.mscclpp.lowering.threadblocks.cut_segments` and
   :func:`~stragglar.mscclpp.lowering.threadblocks.place_blocks`: rounds cut into thread blocks
   within the executor's per-block limits, with nops, ready handshakes and the device semaphores
   that chain a GPU's blocks;
3. the thread-block count check (:data:`DEFAULT_MAX_THREADBLOCKS`) and the size fields
   (:mod:`stragglar.mscclpp.sizes`);
4. :func:`stragglar.mscclpp.lowering.emit.plan_dict` and
   :func:`~stragglar.mscclpp.lowering.emit.plan_text`: channels, remote buffers, semaphores and
   indices, then the text.

It takes a :class:`~stragglar.verify.Proof` (``stragglar.verify.prove``), so nothing unproved is
exported; the plan itself is proved again from its text by :mod:`stragglar.mscclpp.prover`, which
shares no code with this.

>>> from stragglar.synth import synthesize
>>> from stragglar.verify import prove
>>> plan = lower(prove(synthesize("stragglar", 8)))
>>> plan.name, plan.num_chunks, plan.threadblocks
('stragglar-n8-s7', 7, (2, 2, 2, 2, 2, 2, 2, 2))
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from stragglar.args import as_int
from stragglar.errors import ArgumentError, described
from stragglar.files import write_text
from stragglar.mscclpp.errors import MscclppExportError
from stragglar.mscclpp.lowering.emit import Header, plan_dict, plan_text
from stragglar.mscclpp.lowering.rounds import build_programs
from stragglar.mscclpp.lowering.threadblocks import BlockError, cut_segments, place_blocks
from stragglar.mscclpp.sizes import SizeRule, offset_limit
from stragglar.mscclpp.vocabulary import alignment_problem
from stragglar.schedule import Schedule, base_name, gc_paused
from stragglar.units import count_of
from stragglar.verify import Proof, require_proof

__all__ = [
    "DEFAULT_MAX_THREADBLOCKS",
    "MAX_PLAN_CELLS",
    "MAX_PLAN_RANKS",
    "MscclppPlan",
    "PlanOptions",
    "check_request",
    "default_name",
    "lower",
    "write_plan",
]

# Every block of the kernel must be resident at once, because blocks spin-wait on each other's
# semaphores: a block that is never scheduled deadlocks the rest.  The kernel is launched with
# 1024-thread blocks and __launch_bounds__(1024, 1), so one block per SM is what is guaranteed:
# 108 SMs on an A100, 132 on an H100 SXM.  The default is the smaller one.
DEFAULT_MAX_THREADBLOCKS = 108
# The largest plans written.  A plan's proof (stragglar.mscclpp.prover) grows as about N^3.6 at
# C = N-1: 0.7 GB and 6 s at N = 128, 2.7 GB and 21 s at 192, 7.5 GB and 53 s at 256; at N = 400,
# which 108 thread blocks per GPU would still allow, tens of GB.  So that whatever `synth` writes
# `verify` proves on the same machine, as for schedules (3.2 GB at N = 2048), plans stop at
# N = 192 and at as many (GPU, chunk) cells, N x chunks x instances (N = 96 with 4 instances:
# 2.7 GB).  MSCCL++ memory channels reach one NVLink domain anyway (72 GPUs in an NVL72).
MAX_PLAN_RANKS = 192
MAX_PLAN_CELLS = MAX_PLAN_RANKS * MAX_PLAN_RANKS


@dataclass(frozen=True, slots=True)
class PlanOptions:
    """How to write the plan.

    ``min_message_size`` defaults to the smallest usable size (``buffer_alignment x chunks``),
    ``max_message_size`` to the largest size whose chunk offsets fit the executor's 32-bit fields.
    ``max_threadblocks`` is the per-GPU limit (see :data:`DEFAULT_MAX_THREADBLOCKS`).  Counts and
    sizes may be any integral type (``np.int64(2)``) and are kept as ``int``; a bool or a float is
    refused here with an :class:`~stragglar.errors.ArgumentError` (:mod:`stragglar.args`), values
    out of range by :func:`lower`.
    """

    name: str | None = None
    instances: int = 1
    buffer_alignment: int = 16
    min_message_size: int | None = None
    max_message_size: int | None = None
    num_threads_per_block: int = 1024
    max_threadblocks: int = DEFAULT_MAX_THREADBLOCKS

    def __post_init__(self) -> None:
        for label in ("instances", "buffer_alignment", "num_threads_per_block", "max_threadblocks"):
            object.__setattr__(self, label, as_int(getattr(self, label), label))
        for label in ("min_message_size", "max_message_size"):
            value = getattr(self, label)
            if value is not None:
                object.__setattr__(self, label, as_int(value, label))


@dataclass(frozen=True, slots=True)
class MscclppPlan:
    """A written plan: its JSON text and what a caller needs to register or describe it."""

    name: str
    text: str
    num_gpus: int
    num_chunks: int
    instances: int
    threadblocks: tuple[int, ...]
    ops: int
    rule: SizeRule


def default_name(schedule: Schedule, instances: int = 1) -> str:
    """``stragglar-n8-s7``, ``stragglar-n8-s7-c32``, ``stragglar-n8-s7-x2``: one per schedule kind
    (:func:`~stragglar.schedule.base_name`) and instance count.

    The executor keys its cached contexts by plan name, so two different plans must not share one.
    """
    return base_name(schedule) + (f"-x{instances}" if instances > 1 else "")


def _positive(label: str, value: int) -> None:
    if value < 1:
        raise MscclppExportError(f"{label} must be a positive integer, got {described(value)}")


def check_request(
    num_ranks: int,
    num_chunks: int,
    instances: int = 1,
    max_threadblocks: int = DEFAULT_MAX_THREADBLOCKS,
    algorithm: str | None = None,
) -> None:
    """Refuse, before the schedule is even made, a plan larger than stragglar writes or one the
    executor would refuse: at most :data:`MAX_PLAN_RANKS` GPUs and :data:`MAX_PLAN_CELLS` (GPU,
    chunk) cells; and for ``algorithm="stragglar"`` (a schedule of stragglar's generator: callers
    name it only then) at most ``max_threadblocks`` thread blocks per GPU, of which it needs at
    least ``N // 4`` per instance.

    A GPU runs one thread block per segment of rounds it has work in, and a segment ends where one
    more round would take a block past 64 ops (:mod:`stragglar.mscclpp.lowering.threadblocks`).  A
    StragglAR round costs its busiest GPU about 8 ops (a put, a signal, a wait, a reduce or copy
    and the nops between), so a segment holds about 7.4 of its 2N + log2 N rounds and a GPU needs
    about 0.27 N thread blocks per instance: 18 at N = 64, 20 at 72, 52 at 192, 108 (an A100's SMs) at
    400.  ``N // 4`` is under the count at every N measured (2 to 192; more chunks only add
    rounds); the lowering counts exactly.

    >>> check_request(192, 191, algorithm="stragglar")
    >>> check_request(64, 63, instances=8, algorithm="stragglar")
    Traceback (most recent call last):
    ...
    stragglar.mscclpp.errors.MscclppExportError: StragglAR over 64 GPUs needs at least 16 thread \
blocks per GPU and instance (about 0.27 N), 128 with 8 instances, more than the 108 one GPU runs at \
once (max_threadblocks): use at most 6 instances, or raise max_threadblocks for a GPU with more SMs
    """
    num_ranks = as_int(num_ranks, "num_ranks", minimum=2)
    num_chunks = as_int(num_chunks, "num_chunks", minimum=1)
    instances = as_int(instances, "instances", minimum=1)
    max_threadblocks = as_int(max_threadblocks, "max_threadblocks", minimum=1)
    if algorithm is not None and not isinstance(algorithm, str):
        raise ArgumentError(f"algorithm must be a name (a str) or None, got {type(algorithm).__name__}")
    if num_ranks > MAX_PLAN_RANKS:
        raise MscclppExportError(
            f"{num_ranks} GPUs: stragglar writes MSCCL++ plans for at most {MAX_PLAN_RANKS} (a plan's "
            "proof grows as N^3.6, to 2.7 GB there; memory channels reach one NVLink domain)"
        )
    cells = num_ranks * num_chunks * instances
    if cells > MAX_PLAN_CELLS:
        raise MscclppExportError(
            f"{num_ranks} GPUs x {num_chunks} chunks x {count_of(instances, 'instance')}: stragglar "
            f"writes MSCCL++ plans of at most {MAX_PLAN_CELLS:,} (GPU, chunk) cells"
        )
    per_instance = max(1, num_ranks // 4)
    if algorithm == "stragglar" and per_instance * instances > max_threadblocks:
        fewer = (
            f"use at most {count_of(max_threadblocks // per_instance, 'instance')}"
            if max_threadblocks >= per_instance
            else f"use fewer GPUs (at most {4 * max_threadblocks + 3})"
        )
        need = (
            f"{per_instance} thread blocks per GPU (about 0.27 N)"
            if instances == 1
            else f"{per_instance} thread blocks per GPU and instance (about 0.27 N), "
            f"{per_instance * instances} with {instances} instances"
        )
        raise MscclppExportError(
            f"StragglAR over {num_ranks} GPUs needs at least {need}, more than the {max_threadblocks} one "
            f"GPU runs at once (max_threadblocks): {fewer}, or raise max_threadblocks for a GPU with more SMs"
        )


def _check(schedule: Schedule, options: PlanOptions) -> None:
    """Options the executor cannot take (the schedule itself is proved: its transfers are sound)."""
    if schedule.num_ranks < 2 or schedule.num_chunks < 1:
        raise MscclppExportError(
            f"need at least 2 GPUs and 1 chunk, got {schedule.num_ranks} and {schedule.num_chunks}"
        )
    _positive("instances", options.instances)
    _positive("max_threadblocks", options.max_threadblocks)
    alignment = alignment_problem(options.buffer_alignment)
    if alignment is not None:
        raise MscclppExportError(alignment)
    _positive("num_threads_per_block", options.num_threads_per_block)
    if options.num_threads_per_block > 1024:
        raise MscclppExportError(
            "num_threads_per_block must be at most 1024 (the kernel's launch bound), "
            f"got {options.num_threads_per_block}"
        )
    if options.name is not None and (
        not isinstance(options.name, str)
        or not options.name
        or not options.name.isprintable()
        or len(options.name) > 128
    ):
        raise MscclppExportError(f"name must be 1 to 128 printable characters, got {described(options.name)}")


def _rule(schedule: Schedule, scratch: tuple[int, ...], options: PlanOptions) -> SizeRule:
    chunks = schedule.num_chunks * options.instances
    max_scratch = max(scratch) * options.instances
    safe = offset_limit(options.buffer_alignment, chunks, max_scratch)
    low = options.buffer_alignment * chunks if options.min_message_size is None else options.min_message_size
    high = safe if options.max_message_size is None else options.max_message_size
    if min(low, high) < 0:
        raise MscclppExportError(f"a message size cannot be negative, got {low} and {high}")
    if low > high:  # said in words: the command line calls them --min-bytes and --max-bytes
        default = (
            "" if options.max_message_size is not None else " (by default, what 32-bit chunk offsets fit)"
        )
        raise MscclppExportError(
            f"the smallest message size, {low:,} B, is above the largest, {high:,} B{default}"
        )
    if high > safe:
        raise MscclppExportError(
            f"a largest message size of {high:,} B overflows the executor's 32-bit chunk offsets "
            f"({max(chunks, max_scratch)} chunks per buffer); use at most {safe}"
        )
    rule = SizeRule(options.buffer_alignment, chunks, low, high, max_scratch)
    window = rule.window_problem()
    if window is not None:
        raise MscclppExportError(window)
    return rule


def lower(proof: Proof, options: PlanOptions | None = None) -> MscclppPlan:
    """Lower a proved schedule to an MSCCL++ in-place AllReduce plan; see the module docstring.

    Raises :class:`MscclppExportError` (one line) for an option or a schedule the executor
    cannot take, e.g. more thread blocks per GPU than one GPU runs at once.
    """
    schedule = require_proof(proof).schedule
    options = PlanOptions() if options is None else options
    if not isinstance(options, PlanOptions):
        raise ArgumentError(f"options must be a PlanOptions, got {type(options).__name__}")
    _check(schedule, options)
    check_request(schedule.num_ranks, schedule.num_chunks, options.instances)
    # The programs, segments and blocks of 192 GPUs are millions of small acyclic records, all
    # alive until the text is written: collecting them is wasted work.  _lowered returns the plan
    # (its text and counts), the rest freed while still paused.
    with gc_paused():
        return _lowered(schedule, options)


def _lowered(schedule: Schedule, options: PlanOptions) -> MscclppPlan:
    """:func:`lower`'s work, its request checked."""
    programs = build_programs(schedule)
    try:
        segmentation = cut_segments(programs)
    except BlockError as exc:
        raise MscclppExportError(str(exc)) from None
    blocks = place_blocks(segmentation, programs.num_gpus)
    per_gpu = tuple(len(b) * options.instances for b in blocks)
    worst = max(range(len(per_gpu)), key=lambda g: per_gpu[g])
    if per_gpu[worst] > options.max_threadblocks:
        raise MscclppExportError(
            f"GPU {worst} needs {per_gpu[worst]} thread blocks, more than the {options.max_threadblocks} "
            "one GPU runs at once (max_threadblocks; all must be resident, 1024 threads each); "
            "use fewer instances, or raise max_threadblocks for a GPU with more SMs (H100 SXM: 132)"
        )
    scratch = tuple(p.scratch_chunks for p in programs.gpus)
    rule = _rule(schedule, scratch, options)
    header = Header(
        name=options.name or default_name(schedule, options.instances),
        num_threads_per_block=options.num_threads_per_block,
        buffer_alignment=options.buffer_alignment,
        min_message_size=rule.min_message_size,
        max_message_size=rule.max_message_size,
        chunks=schedule.num_chunks,
        scratch=scratch,
        instances=options.instances,
    )
    text = plan_text(plan_dict(blocks, header))
    return MscclppPlan(
        name=header.name,
        text=text,
        num_gpus=schedule.num_ranks,
        num_chunks=rule.chunks,
        instances=options.instances,
        threadblocks=per_gpu,
        ops=sum(len(b.ops) for gpu_blocks in blocks for b in gpu_blocks) * options.instances,
        rule=rule,
    )


def write_plan(plan: MscclppPlan | str, path: str | os.PathLike[str]) -> Path:
    """Write the plan (or plan text) atomically (a temporary file in the same folder, then a
    rename), once the plan prover has proved the text as the executor runs it: a plan's text can
    come from anywhere (a string, or ``dataclasses.replace(plan, text=...)``), and nothing
    unproved is written.  A plan that is no correct AllReduce raises the prover's error."""
    from stragglar.mscclpp.prover.prove import prove  # the prover judges the text alone

    if isinstance(plan, MscclppPlan):
        text = plan.text
    elif isinstance(plan, str):
        text = plan
    else:
        raise ArgumentError(f"plan must be an MscclppPlan or its text, got {described(plan)}")
    prove(text)
    write_text(path, text)
    return Path(path)
