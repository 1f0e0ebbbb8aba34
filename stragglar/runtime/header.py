"""What every rank checks before a call's rounds: that all ranks run the same AllReduce.

A schedule only computes the sum when every rank runs the same one, on buffers of the same dtype
and element count: a rank with another count cuts its chunks elsewhere, one with another
straggler pairs with other peers, and engines move bytes without asking what they mean, so any
of these gives a wrong sum or a hang.  Before a call's rounds, each rank therefore all-gathers a
small :class:`Header` (the schedule's size, algorithm, straggler and fingerprint, the dtype, the
element count, the tag, the late rank and the rounds it runs, and any problem of its own with
the call: its buffer, its data, the engine it asked for) on the same group, with the call's
timeout, and every rank raises the same one-line :class:`MismatchError` when they differ.
Which calls check is the channels' rule (:mod:`stragglar.runtime.channels`), so that a call that
repeats its channel's setup costs a dictionary lookup.

>>> h = Header(MAGIC, 0, 4, 0, 3, 7, 2, 1000, 0, 3, 0, -1)
>>> print(mismatch([h, h._replace(elements=999), h, h], 4))
ranks disagree on the allreduce: element count: ranks 0, 2, 3 have 1000, rank 1 has 999
>>> mismatch([h] * 4, 4) is None
True
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from enum import IntEnum
from typing import Any, NamedTuple

from stragglar.args import as_int
from stragglar.errors import ArgumentError, InputError, described
from stragglar.runtime.arrays import DTYPES, dtype_name, flat_view, in_place_refusal, summable_refusal
from stragglar.schedule import ALGORITHMS
from stragglar.verify import Proof

__all__ = [
    "MAGIC",
    "PROBLEMS",
    "Header",
    "MismatchError",
    "Problem",
    "agree",
    "inspect_call",
    "make_header",
    "mismatch",
    "ranks_in_words",
]

MAGIC = 0x53_54_52_41_47  # "STRAG": a peer that sends anything else is not in this call


class Problem(IntEnum):
    """Why a rank cannot take part in a call, as its header says it (0: it can)."""

    NONE = 0
    DTYPE = 1  # a dtype nothing here supports
    NOT_CONTIGUOUS = 2
    UNSENDABLE = 3  # data its engine cannot send (an NCCL build without bfloat16, a CPU tensor on NCCL)
    NOT_WRITABLE = 4  # requires grad, an inference tensor outside inference mode, read-only, sparse
    NO_DATA = 5  # values that are not its data: a meta tensor, a masked array
    NOT_ON_DEVICE = 6  # the device engine asked for on a buffer off the GPU (a NumPy array, a CPU tensor)
    NOT_A_TENSOR = 7  # data that is no torch tensor, on a torch process group
    NO_DEVICE_CALL = 8  # a device call it could not set up (no CuPy in its process)


PROBLEMS: dict[int, str] = {  # what a rank with a problem has, in words
    Problem.DTYPE: "has a buffer of a dtype no engine here supports",
    Problem.NOT_CONTIGUOUS: "has a buffer that is not contiguous",
    Problem.UNSENDABLE: "has data its engine cannot send (its dtype, or a CPU tensor on NCCL)",
    Problem.NOT_WRITABLE: (
        "has a buffer it cannot write in place (it requires grad, or is an inference tensor, "
        "read-only memory or sparse)"
    ),
    Problem.NO_DATA: "has a buffer whose values are not its data (a meta tensor, or a masked array)",
    Problem.NOT_ON_DEVICE: (
        "has a buffer the device engine cannot run on (neither a CuPy array nor a torch CUDA tensor)"
    ),
    Problem.NOT_A_TENSOR: "has data that is not a torch tensor, on a torch process group",
    Problem.NO_DEVICE_CALL: "could not set up its device call (its own error says why: no CuPy, say)",
}


class MismatchError(InputError):
    """The ranks of a group called the AllReduce with different schedules, dtypes or sizes (exit 2).

    Every rank raises it, with the same message, before any data moves.
    """


class Header(NamedTuple):
    """One rank's description of the AllReduce it is about to run, as integers."""

    magic: int
    problem: int  # a Problem: NONE, or why this rank cannot take part
    ranks: int  # the schedule's rank count
    algorithm: int  # index in ALGORITHMS, -1 for another name
    straggler: int  # -1: none
    fingerprint: int  # the schedule's fingerprint, first 60 bits
    dtype: int  # index in DTYPES, -1: unsupported
    elements: int  # -1: unknown
    tag: int
    late_rank: int
    first: int  # the first round this call runs
    stop: int  # the round it stops before, -1: the end
    on_device: int = 0  # 1: the device engine (one kernel a call), 0: rounds driven from the host
    registered: int = 0  # the buffer's registration number on the group, 0: not registered


def make_header(
    proof: Proof,
    dtype: str | None,
    count: int | None,
    tag: int,
    late_rank: int,
    problem: Problem = Problem.NONE,
    rounds: tuple[int, int | None] = (0, None),
) -> Header:
    """This rank's header (``dtype`` and ``count`` None when its buffer has a ``problem``)."""
    s = proof.schedule
    return Header(
        MAGIC,
        problem,
        s.num_ranks,
        ALGORITHMS.index(s.algorithm) if s.algorithm in ALGORITHMS else -1,
        -1 if s.straggler is None else s.straggler,
        int(s.fingerprint[:15], 16),
        DTYPES.index(dtype) if dtype in DTYPES else -1,
        -1 if count is None else count,
        tag,
        late_rank,
        rounds[0],
        -1 if rounds[1] is None else rounds[1],
    )


def ranks_in_words(ranks: Iterable[int], limit: int = 8) -> str:
    """``rank 2`` or ``ranks 0-3, 5``: ranks in words, the first ``limit`` runs of them; ``no
    rank`` for none (it was "ranks ", a sentence without its subject).

    Messages are made of it, often while another error is on its way: ranks that are none (None,
    a string, a rank of -1 or 1.5) are one line of ours, where None was a TypeError that hid the
    error the caller was saying.

    >>> ranks_in_words([5, 0, 1, 2, 3]), ranks_in_words([4]), ranks_in_words(range(0, 20, 2), limit=3)
    ('ranks 0-3, 5', 'rank 4', 'ranks 0, 2, 4 and 7 more')
    >>> ranks_in_words(set())
    'no rank'
    """
    if isinstance(ranks, (str, bytes)) or not isinstance(ranks, Iterable):
        raise ArgumentError(f"ranks must be an iterable of ranks, got {described(ranks)}")
    limit = as_int(limit, "limit", minimum=1)  # 0 printed "ranks  and 4 more"
    ordered = sorted({as_int(r, "each rank", minimum=0) for r in ranks})
    if not ordered:
        return "no rank"
    if len(ordered) == 1:
        return f"rank {ordered[0]}"
    runs: list[list[int]] = []
    for r in ordered:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    parts = [f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)) for run in runs]
    words = ", ".join(parts)
    if len(runs) > limit:
        shown = sum(len(run) for run in runs[:limit])
        words = ", ".join(parts[:limit]) + f" and {len(ordered) - shown} more"
    return "ranks " + words


def _schedule(h: Header) -> str:
    name = f"the '{ALGORITHMS[h.algorithm]}'" if 0 <= h.algorithm < len(ALGORITHMS) else "another algorithm's"
    straggler = f"straggler {h.straggler}" if h.straggler >= 0 else "no straggler"
    return f"{name} schedule for {h.ranks} ranks ({straggler}, fingerprint {h.fingerprint:015x})"


def _rounds(h: Header) -> str:
    return f"rounds {h.first}.." + ("the end" if h.stop < 0 else f"{h.stop - 1}")


_FIELDS: tuple[tuple[str, Callable[[Header], Any], Callable[[Header], str]], ...] = (
    (
        "schedule",
        lambda h: (h.ranks, h.algorithm, h.straggler, h.fingerprint),
        lambda h: "run " + _schedule(h),
    ),
    ("dtype", lambda h: h.dtype, lambda h: f"have {DTYPES[h.dtype]}"),
    ("element count", lambda h: h.elements, lambda h: f"have {h.elements}"),
    ("tag", lambda h: h.tag, lambda h: f"use tag {h.tag}"),
    ("late rank", lambda h: h.late_rank, lambda h: f"wait for rank {h.late_rank}"),
    ("rounds", lambda h: (h.first, h.stop), lambda h: f"run {_rounds(h)}"),
    (  # a rank of one waits on flags in its peers' memory, a rank of the other on messages
        "engine",
        lambda h: h.on_device,
        lambda h: "run the device engine" if h.on_device else "run the rounds engine",
    ),
    (  # a registered buffer's call reaches its peers' buffers, an unregistered one's their inboxes
        "registered buffer",
        lambda h: h.registered,
        lambda h: f"use registration {h.registered}" if h.registered else "use a buffer not registered",
    ),
)


def mismatch(headers: Sequence[Header], group_size: int) -> str | None:
    """Why ``headers`` (one per rank, in rank order) cannot run together, in one line; None if they can."""
    strangers = [r for r, h in enumerate(headers) if h.magic != MAGIC]
    if strangers:
        return (
            f"{ranks_in_words(strangers)} sent no allreduce header: "
            "is another collective running on this group?"
        )
    troubled = {
        code: [r for r, h in enumerate(headers) if h.problem == code] for code in {h.problem for h in headers}
    }
    problems = [
        f"{ranks_in_words(ranks)} {PROBLEMS.get(code, 'cannot take part')}"
        for code, ranks in troubled.items()
        if code
    ]
    if problems:
        return "cannot allreduce: " + "; ".join(sorted(problems))
    parts: list[str] = []
    for name, key, words in _FIELDS:
        if name == "late rank" and parts and parts[0].startswith("schedule"):
            continue  # another straggler is another late rank: say it once
        groups: dict[Any, list[int]] = {}
        for r, h in enumerate(headers):
            groups.setdefault(key(h), []).append(r)
        if len(groups) > 1:
            shown = sorted(groups.values(), key=lambda rs: (-len(rs), rs))
            said = [f"{ranks_in_words(rs)} {_plural(words(headers[rs[0]]), len(rs))}" for rs in shown[:4]]
            more = f", {len(shown) - 4} more values" if len(shown) > 4 else ""
            parts.append(f"{name}: " + ", ".join(said) + more)
    if parts:
        return "ranks disagree on the allreduce: " + "; ".join(parts)
    first = headers[0]
    if first.ranks != group_size:
        return f"{_schedule(first)} cannot run on a group of {group_size} ranks"
    return None


def _plural(verb_phrase: str, n: int) -> str:
    """``have 3`` for several ranks, ``has 3`` for one (``run`` -> ``runs``, ``use`` -> ``uses``)."""
    if n > 1:
        return verb_phrase
    verb, _, rest = verb_phrase.partition(" ")
    verb = {"have": "has"}.get(verb, verb + "s")
    return f"{verb} {rest}"


def inspect_call(
    data: Any,
    proof: Proof,
    tag: int,
    late_rank: int,
    rounds: tuple[int, int | None],
    sendable: Callable[[Any], object],
) -> tuple[Any, Header, Exception | None]:
    """A call's ``data`` as its engine sends it: (the flat view or None, this rank's header, the
    error this rank must raise after the header's gather or None)."""
    no_data = summable_refusal(data, "allreduce")
    if no_data is not None:
        header = make_header(proof, None, None, tag, late_rank, Problem.NO_DATA, rounds)
        return None, header, InputError(no_data)
    refusal = in_place_refusal(data)
    if refusal is not None:
        header = make_header(proof, None, None, tag, late_rank, Problem.NOT_WRITABLE, rounds)
        return None, header, InputError(refusal)
    try:
        flat = flat_view(data)
    except TypeError as e:  # a dtype nothing here supports
        return None, make_header(proof, None, None, tag, late_rank, Problem.DTYPE, rounds), e
    except InputError as e:  # not contiguous
        return None, make_header(proof, None, None, tag, late_rank, Problem.NOT_CONTIGUOUS, rounds), e
    dtype = dtype_name(flat)
    try:
        sendable(flat)
    except TypeError as e:  # an NCCL build without bfloat16, a CPU tensor on NCCL
        return None, make_header(proof, dtype, None, tag, late_rank, Problem.UNSENDABLE, rounds), e
    return flat, make_header(proof, dtype, int(flat.shape[0]), tag, late_rank, rounds=rounds), None


def agree(mine: Header, gathered: Sequence[Sequence[int]], size: int) -> None:
    """Raise the same MismatchError on every rank unless every header equals this rank's.

    A rank with a problem of its own raises its own error after the gather instead."""
    headers = [Header(*h) for h in gathered]
    reason = mismatch(headers, size)
    if reason is not None and not mine.problem:
        raise MismatchError(reason)
