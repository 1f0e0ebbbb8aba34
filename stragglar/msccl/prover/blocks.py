"""Read one GPU's thread blocks as the MSCCL executor loads them, and list every rule they break.

The file's reader (:func:`~stragglar.msccl.prover.read.read`) checks the ``<algo>`` and ``<gpu>``
elements and hands each GPU's ``<tb>`` elements here (:func:`thread_blocks`): their attributes and
connections, each step's fields and operands, and each dependency (one that no step will ever
release is a violation, one released later than written a warning), then the program each thread
block runs as the executor stores it (:class:`~stragglar.msccl.prover.parsed.ThreadBlock`: nops
folded into dependencies, consecutive ``re`` steps fused).  The :class:`Checker` that collects the
violations and warnings, each with its place, and the :class:`Header` they are checked against
live here, so that this module needs nothing of the reader's (which imports it).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from dataclasses import dataclass

from stragglar.msccl.errors import MscclViolation
from stragglar.msccl.prover.parsed import ThreadBlock, Tx
from stragglar.msccl.prover.tokens import Element
from stragglar.msccl.vocabulary import (
    MAX_COUNT,
    MAX_DEPENDENCY_TB,
    MAX_OFFSET,
    MAX_REDUCE_FUSION,
    MAX_STEPS,
    MAX_TBS,
    MAX_TBS_PER_CHANNEL,
    READS_SRC,
    RECV_TYPES,
    SEND_TYPES,
    TYPES,
    WRITES_DST,
    StepRecord,
)

__all__ = ["Checker", "Header", "thread_blocks"]

_INT = re.compile(r"-?(0|[1-9][0-9]*)")


@dataclass(frozen=True)
class Header:
    """The numbers of ``<algo>`` that the rest of the file is checked against."""

    nchannels: int
    nchunks: int
    ngpus: int
    inplace: int
    outofplace: int


@dataclass(frozen=True)
class _TbHeader:
    """A ``<tb>`` element's attributes."""

    id: int
    send: int
    recv: int
    chan: int


class Checker:
    """Collects every structural violation, each one line naming the place."""

    def __init__(self) -> None:
        self.problems: list[MscclViolation] = []
        self.warnings: list[str] = []  # what the executor does otherwise than written, without harm

    def fail(
        self,
        el: Element,
        what: str,
        gpu: int | None = None,
        tb: int | None = None,
        step: int | None = None,
        *,
        kind: str = "format",
    ) -> None:
        """Report a rule ``el`` breaks: ``format`` if the executor would not load the file,
        ``structure`` if it would load it and then compute the wrong thing or hang."""
        self.problems.append(MscclViolation(kind, gpu, tb, step, None, _place(el, gpu, tb, step) + what))

    def warn(
        self, el: Element, what: str, gpu: int | None = None, tb: int | None = None, step: int | None = None
    ) -> None:
        """Note something the executor runs otherwise than the file says, yet correctly."""
        self.warnings.append(_place(el, gpu, tb, step) + what)

    def ints(
        self, el: Element, keys: tuple[str, ...], *place: int | None, bits: int = 32
    ) -> dict[str, int] | None:
        """The integer attributes ``keys`` of ``el``, or None (after reporting) if any is bad."""
        out: dict[str, int] = {}
        for key in keys:
            text = el.attrs.get(key)
            if text is None:
                self.fail(el, f"<{el.name}> lacks attribute {key}", *place)
            elif not _INT.fullmatch(text) or not -(1 << (bits - 1)) <= int(text) < 1 << (bits - 1):
                self.fail(el, f'{key}="{text}" is not a plain {bits}-bit decimal integer', *place)
            else:
                out[key] = int(text)
        return out if len(out) == len(keys) else None

    def strings(self, el: Element, keys: tuple[str, ...], *place: int | None) -> dict[str, str] | None:
        missing = [k for k in keys if k not in el.attrs]
        for key in missing:
            self.fail(el, f"<{el.name}> lacks attribute {key}", *place)
        return None if missing else {k: el.attrs[k] for k in keys}


def _place(el: Element, gpu: int | None, tb: int | None, step: int | None) -> str:
    """``line 8: gpu 0 tb 1 step 0: ``: where a message is about."""
    where = " ".join(f"{k} {v}" for k, v in (("gpu", gpu), ("tb", tb), ("step", step)) if v is not None)
    return f"line {el.line}: " + (f"{where}: " if where else "")


def thread_blocks(
    ck: Checker, el: Element, g: int, chunks: dict[str, int], algo: Header
) -> tuple[ThreadBlock, ...]:
    """GPU ``g``'s thread blocks (the children of its ``<gpu>`` element ``el``, whose buffers hold
    ``chunks``), each as the executor runs it; none if ``ck`` holds any violation by then."""
    raw: dict[int, tuple[Element, _TbHeader]] = {}
    for tb_el in el.children:
        nums = ck.ints(tb_el, ("id", "send", "recv", "chan"), g)
        if nums is None:
            continue
        attrs = _TbHeader(nums["id"], nums["send"], nums["recv"], nums["chan"])
        t = attrs.id
        if t in raw or not 0 <= t < MAX_TBS:
            ck.fail(tb_el, f"tb id {t} is {'repeated' if t in raw else f'outside 0..{MAX_TBS - 1}'}", g)
            continue
        raw[t] = (tb_el, attrs)
        _tb_attrs(ck, tb_el, g, attrs, algo)
    for t in sorted(set(range(len(raw))) - set(raw)):
        ck.fail(el, f"tb ids must be 0..{len(raw) - 1} without gaps: tb {t} is missing", g)
    _tb_channels(ck, el, g, raw)
    steps = {t: _steps(ck, tb_el, g, t, attrs, chunks) for t, (tb_el, attrs) in raw.items()}
    for t, rows in sorted(steps.items()):
        for i in range(len(rows)):
            _check_dependency(ck, raw[t][0].children[i], (g, t, i), steps)
    if ck.problems:
        return ()
    return tuple(_program(t, raw[t][1], [r for r in steps[t] if r is not None]) for t in sorted(raw))


def _tb_attrs(ck: Checker, el: Element, g: int, attrs: _TbHeader, algo: Header) -> None:
    t = attrs.id
    for key, peer in (("send", attrs.send), ("recv", attrs.recv)):
        if not -1 <= peer < algo.ngpus or peer == g:
            ck.fail(el, f"{key}={peer} must be -1 or another gpu in 0..{algo.ngpus - 1}", g, t)
    if not 0 <= attrs.chan < algo.nchannels:
        ck.fail(el, f"chan {attrs.chan} outside 0..nchannels-1 ({algo.nchannels - 1})", g, t)
    if len(el.children) > MAX_STEPS:
        ck.fail(el, f"{len(el.children)} steps, the executor allows {MAX_STEPS} (nops included)", g, t)


def _tb_channels(ck: Checker, el: Element, g: int, raw: dict[int, tuple[Element, _TbHeader]]) -> None:
    """One TB per (channel, peer, direction); at most 32 sending (receiving) TBs a channel."""
    for key in ("send", "recv"):
        owners: dict[tuple[int, int], int] = {}
        per_channel: Counter[int] = Counter()
        for t, (tb_el, attrs) in sorted(raw.items()):
            chan, peer = attrs.chan, attrs.send if key == "send" else attrs.recv
            if peer < 0:
                continue
            per_channel[chan] += 1
            if (chan, peer) in owners:
                what = f"tb {owners[chan, peer]} already uses channel {chan} to {key} gpu {peer}"
                ck.fail(tb_el, f"{what}: a connection carries one thread block", g, t)
            owners.setdefault((chan, peer), t)
        for chan, count in sorted(per_channel.items()):
            if count > MAX_TBS_PER_CHANNEL:
                ck.fail(el, f"{count} thread blocks {key} on channel {chan}, the executor allows 32", g)


def _steps(
    ck: Checker, el: Element, g: int, t: int, tb: _TbHeader, chunks: dict[str, int]
) -> list[StepRecord | None]:
    rows: list[StepRecord | None] = []
    for i, st in enumerate(el.children):
        nums = ck.ints(st, ("s", "srcoff", "dstoff", "cnt", "depid", "deps", "hasdep"), g, t, i)
        names = ck.strings(st, ("type", "srcbuf", "dstbuf"), g, t, i)
        if nums is None or names is None:
            rows.append(None)
            continue
        position = nums["s"]
        row = StepRecord(
            names["type"],
            names["srcbuf"],
            nums["srcoff"],
            names["dstbuf"],
            nums["dstoff"],
            nums["cnt"],
            nums["depid"],
            nums["deps"],
            nums["hasdep"],
        )
        rows.append(row)
        if not 0 <= position < MAX_STEPS:
            ck.fail(st, f's="{position}" outside 0..{MAX_STEPS - 1}', g, t, i)
        elif position != i:
            what = f's="{position}" but it is step {i} of its tb: the executor numbers steps by position'
            ck.warn(st, what + " (dependencies count positions)", g, t, i)
        if row.type not in TYPES:
            ck.fail(st, f"unknown type {row.type!r}", g, t, i)
            continue
        for key, buf in (("srcbuf", row.srcbuf), ("dstbuf", row.dstbuf)):
            if buf not in ("i", "o", "s"):
                ck.fail(st, f"{key} {buf!r} is not i, o or s", g, t, i)
        if row.hasdep not in (0, 1):
            ck.fail(st, f"hasdep must be 0 or 1, got {row.hasdep}", g, t, i)
        _check_step(ck, st, (g, t, i), row, tb, chunks)
    return rows


def _check_step(
    ck: Checker,
    st: Element,
    place: tuple[int, int, int],
    row: StepRecord,
    tb: _TbHeader,
    chunks: dict[str, int],
) -> None:
    kind, cnt = row.type, row.cnt
    if kind == "nop":
        if row.depid == -1:
            ck.fail(
                st,
                "nop without a dependency (the executor's step numbering skips it)",
                *place,
                kind="structure",
            )
        return
    if not 1 <= cnt < MAX_COUNT:
        ck.fail(st, f"cnt {cnt} outside 1..{MAX_COUNT - 1}", *place)
    if kind in SEND_TYPES and tb.send < 0:
        ck.fail(st, f"{kind} sends but the tb has send=-1", *place, kind="structure")
    if kind in RECV_TYPES and tb.recv < 0:
        ck.fail(st, f"{kind} receives but the tb has recv=-1", *place, kind="structure")
    for side, buf, off, used in (
        ("src", row.srcbuf, row.srcoff, kind in READS_SRC),
        ("dst", row.dstbuf, row.dstoff, kind in WRITES_DST),
    ):
        if used and buf in chunks and not (off >= 0 and off + cnt <= min(chunks[buf], MAX_OFFSET + 1)):
            what = f"{side} {buf}[{off}..{off + cnt - 1}] outside the {chunks[buf]} chunks of buffer {buf}"
            ck.fail(st, what, *place, kind="structure")


def _check_dependency(
    ck: Checker, st: Element, place: tuple[int, int, int], steps: dict[int, list[StepRecord | None]]
) -> None:
    _, t, i = place
    rows = steps[t]
    row = rows[i]
    if row is None:
        return
    previous = rows[i - 1] if i > 0 else None
    if row.type != "nop" and row.depid == -1 and previous is not None and previous.type == "nop":
        ck.fail(st, "a chain of nops must end at a step with a dependency (the executor rejects it)", *place)
    depid, deps = row.depid, row.deps
    if depid < 0:
        return
    if depid > MAX_DEPENDENCY_TB:
        ck.fail(
            st,
            f"depid {depid} > {MAX_DEPENDENCY_TB}: the executor stores it in an int8",
            *place,
            kind="structure",
        )
    if depid not in steps:
        ck.fail(st, f"depends on tb {depid}, which this gpu does not have", *place, kind="structure")
    elif not 0 <= deps < len(steps[depid]):
        ck.fail(
            st,
            f"depends on tb {depid} step {deps}, outside its steps 0..{len(steps[depid]) - 1}",
            *place,
            kind="structure",
        )
    else:
        target = steps[depid][deps]
        if target is not None and target.type == "nop":
            ck.fail(
                st, f"depends on tb {depid} step {deps}, a nop, which never signals", *place, kind="structure"
            )
        elif target is not None and target.hasdep == 0:
            _late_release(ck, st, place, depid, deps, steps[depid])


def _late_release(
    ck: Checker,
    st: Element,
    place: tuple[int, int, int],
    depid: int,
    deps: int,
    rows: list[StepRecord | None],
) -> None:
    """A dependency on a step without ``hasdep``: the kernel's wait (``flag >= goal``, the flag
    set by a TB's ``hasdep`` steps only) ends when a later ``hasdep`` step of that TB signals,
    which is correct, only later than written; with no such step it never ends."""
    later = next(
        (
            k
            for k in range(deps + 1, len(rows))
            if (r := rows[k]) is not None and r.type != "nop" and r.hasdep
        ),
        None,
    )
    lacks = f'depends on tb {depid} step {deps}, which lacks hasdep="1"'
    if later is None:
        what = f"{lacks}, as do all later steps of tb {depid}: the wait never ends (only hasdep steps signal)"
        ck.fail(st, what, *place, kind="structure")
    else:
        ck.warn(st, f"{lacks}: released late, when tb {depid} step {later} (hasdep) signals", *place)


def _program(t: int, attrs: _TbHeader, rows: list[StepRecord]) -> ThreadBlock:
    """The executor's transmissions: nops become dependencies, consecutive ``re`` steps fuse."""
    txs: list[Tx] = []
    tx_at: list[int] = []
    pending: list[tuple[int, int]] = []
    fusing: tuple[str, int, str] | None = None
    reductions = 0
    for i, row in enumerate(rows):
        if row.depid >= 0:
            pending.append((row.depid, row.deps))
        if row.type == "nop":
            tx_at.append(-1)
            continue
        key = (row.dstbuf, row.dstoff, row.srcbuf)
        if row.type == "re" and fusing == key and row.depid == -1:
            last = txs[-1]
            srcoffs = (*last.srcoffs, row.srcoff)
            txs[-1] = dataclasses.replace(last, pos=i, srcoffs=srcoffs, cnt=row.cnt, hasdep=bool(row.hasdep))
        else:
            txs.append(
                Tx(
                    row.type,
                    i,
                    tuple(pending),
                    row.srcbuf,
                    (row.srcoff,),
                    row.dstbuf,
                    row.dstoff,
                    row.cnt,
                    bool(row.hasdep),
                )
            )
            pending = []
        tx_at.append(len(txs) - 1)
        if row.type == "re":
            reductions += 1
            fusing = None if row.hasdep or reductions == MAX_REDUCE_FUSION else key
        else:
            fusing = None
    return ThreadBlock(t, attrs.send, attrs.recv, attrs.chan, tuple(txs), tuple(tx_at))
