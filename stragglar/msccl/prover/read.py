"""Read MSCCL XML exactly as the MSCCL executor's parser does, and list every rule it breaks.

:func:`read` reads the elements with the executor's own tokenizer
(:mod:`stragglar.msccl.prover.tokens`), then checks what the executor checks when it loads a rank's
part (required attributes, ranges, thread-block and step limits) and what it silently gets wrong (a
dependency no step will ever release, operands out of bounds), and returns the program as the
executor stores it (:mod:`stragglar.msccl.prover.parsed`): nops folded into dependencies and
consecutive ``re`` steps fused.  What the executor runs otherwise than written is a warning
(:attr:`~stragglar.msccl.prover.parsed.Algo.warnings`), not a violation, and the proof judges what
it runs: a dependency on a step without ``hasdep`` that a later ``hasdep`` step of the same thread
block releases (the kernel waits for ``flag >= goal``, so the wait ends then, later than written),
and a step index ``s`` that is not the step's position (the executor checks its range and
otherwise numbers steps by position, as dependencies count them).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from stragglar.errors import ArgumentError, described
from stragglar.msccl.errors import MscclViolation
from stragglar.msccl.prover.parsed import Algo, Gpu, ThreadBlock, Tx, XmlDocument, XmlSource
from stragglar.msccl.prover.tokens import Element, LimitProblem, SyntaxProblem, elements, first_name
from stragglar.msccl.vocabulary import (
    CAPACITY,
    MAX_CHANNELS,
    MAX_COUNT,
    MAX_DEPENDENCY_TB,
    MAX_OFFSET,
    MAX_REDUCE_FUSION,
    MAX_STEPS,
    MAX_SUBS,
    MAX_TBS,
    MAX_TBS_PER_CHANNEL,
    READS_SRC,
    RECV_TYPES,
    SEND_TYPES,
    TYPES,
    WRITES_DST,
    StepRecord,
    legacy_scratch,
    size_window,
)
from stragglar.schedule import MAX_CELLS

__all__ = ["MAX_LOCATIONS", "MAX_SCRATCH", "read"]

# Scratch chunks a GPU may declare: the executor's int16 offsets address no more (a step must end
# by MAX_OFFSET + 1, see _check_step), and stragglar's lowering writes at most nchunksperloop.
# Without the bound, s_chunks="2000000000" made the model a list of two billion chunks.
MAX_SCRATCH = MAX_OFFSET + 1
# Chunks in all GPUs' buffers (input, output unless in place, scratch): the executor's model holds
# an N-bit value for each, in each of its two pipeline iterations, so MAX_CELLS of them at N = 1024
# take about 1.5 GB, as MAX_CELLS (rank, chunk) cells take the schedule simulator at N = 2048.  The
# executor's own limits allow 1024 GPUs of 32767 chunks: a 60 KB file of empty <gpu> elements went
# past 5.8 GB.  The files stragglar's lowering writes hold some thousands (16,384 for a ring over 32
# GPUs at 16 instances): what fits the executor's 4095 elements a rank.
MAX_LOCATIONS = MAX_CELLS

_INT = re.compile(r"-?(0|[1-9][0-9]*)")


@dataclass(frozen=True)
class _Header:
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


# ---------------------------------------------------------------------------- structure


class _Checker:
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

    def warn(self, el: Element, what: str, gpu: int, tb: int, step: int) -> None:
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


def read(source: XmlSource) -> XmlDocument:
    """Parse the text with the executor's rules: the program, or None and every violation found
    (a document is returned as it is).  A file nothing can be made of is a document too, not an
    exception: the prover says how wrong it is, the description that it is not readable.

    >>> read('<algo name="x" proto="Simple" ngpus="2" inplace="1" '
    ...     'outofplace="0" minBytes="0" maxBytes="0"></algo>').violations[0].message
    'line 1: <algo> lacks attributes coll, nchannels, nchunksperloop'
    """
    if isinstance(source, XmlDocument):
        return source
    if not isinstance(source, str):  # bytes, a path, a proof: the regular expressions raised TypeError
        raise ArgumentError(
            f"an MSCCL XML source is the file's text (a str) or its read document, got {described(source)}"
        )
    try:
        if first_name(source) != "algo":  # the executor reads the first element alone, and stops there
            what = "the file must start with an <algo> element (the executor reads its first element)"
            return XmlDocument(None, (MscclViolation("syntax", None, None, None, None, what),))
        top = elements(source)
    except SyntaxProblem as e:
        kind = "format" if isinstance(e, LimitProblem) else "syntax"
        return XmlDocument(None, (MscclViolation(kind, None, None, None, None, str(e)),))
    checker = _Checker()
    algo = _algo(checker, top[0])
    if algo is None or checker.problems:
        return XmlDocument(None, tuple(checker.problems))
    return XmlDocument(dataclasses.replace(algo, warnings=tuple(checker.warnings)), ())


_ALGO_STRINGS = ("name", "proto", "coll")
_ALGO_INTS = ("nchannels", "nchunksperloop", "ngpus", "inplace", "outofplace")
_ALGO_SIZES = ("minBytes", "maxBytes")


def _algo(ck: _Checker, el: Element) -> Algo | None:
    missing = [key for key in (*_ALGO_STRINGS, *_ALGO_INTS, *_ALGO_SIZES) if key not in el.attrs]
    if missing:  # all in one line: a file from msccl-tools lacks three, and one a run was slow to tell
        what = f"<algo> lacks attribute{'s' * (len(missing) > 1)} {', '.join(missing)}"
        if set(missing) <= {"outofplace", *_ALGO_SIZES}:
            what += " (msccl-tools does not write them; the Azure executor requires them)"
        ck.fail(el, what)
        return None
    strings = ck.strings(el, _ALGO_STRINGS)
    nums = ck.ints(el, _ALGO_INTS)
    sizes = ck.ints(el, _ALGO_SIZES, bits=64)
    if strings is None or nums is None or sizes is None:
        return None
    if strings["proto"] not in CAPACITY:
        ck.fail(el, f"proto {strings['proto']!r} is not one of {', '.join(CAPACITY)}")
    if strings["coll"] != "allreduce":
        ck.fail(el, f"coll {strings['coll']!r}: this verifier proves allreduce only")
    if not 1 <= nums["nchannels"] <= MAX_CHANNELS:
        ck.fail(el, f"nchannels {nums['nchannels']} outside 1..{MAX_CHANNELS}")
    if not 1 <= nums["nchunksperloop"] <= MAX_OFFSET:
        ck.fail(el, f"nchunksperloop {nums['nchunksperloop']} outside 1..{MAX_OFFSET}")
    if not 1 <= nums["ngpus"] <= MAX_SUBS:
        ck.fail(el, f"ngpus {nums['ngpus']} outside 1..{MAX_SUBS}")
    for key in ("inplace", "outofplace"):
        if nums[key] not in (0, 1):
            ck.fail(el, f"{key} must be 0 or 1, got {nums[key]}")
    if not nums["inplace"] and not nums["outofplace"]:
        ck.fail(el, 'inplace="0" and outofplace="0": the algorithm is never selected', kind="structure")
    window = size_window(sizes["minBytes"], sizes["maxBytes"])
    if window.never is not None:
        ck.fail(el, window.never, kind="structure")
    if window.partial is not None:
        ck.warnings.append(_place(el, None, None, None) + window.partial)
    header = _Header(
        nums["nchannels"], nums["nchunksperloop"], nums["ngpus"], nums["inplace"], nums["outofplace"]
    )
    gpus = _gpus(ck, el, header)
    if ck.problems or gpus is None:
        return None
    reserve = legacy_scratch(sizes["maxBytes"], max(gpu.chunks["s"] for gpu in gpus), header.nchunks)
    if reserve is not None:
        ck.warnings.append(_place(el, None, None, None) + reserve)
    h = header
    return Algo(
        strings["name"],
        strings["proto"],
        h.nchannels,
        h.nchunks,
        h.ngpus,
        bool(h.inplace),
        bool(h.outofplace),
        gpus,
    )


def _gpus(ck: _Checker, el: Element, algo: _Header) -> tuple[Gpu, ...] | None:
    n = algo.ngpus
    gpus: dict[int, Gpu] = {}
    for g_el in el.children:
        attrs = ck.ints(g_el, ("id", "i_chunks", "o_chunks", "s_chunks"))
        if attrs is None:
            continue
        g = attrs["id"]
        if not 0 <= g < n or g in gpus:
            ck.fail(g_el, f"gpu id {g} is {'repeated' if g in gpus else f'outside 0..{n - 1}'}")
            continue
        chunks = {"i": attrs["i_chunks"], "o": attrs["o_chunks"], "s": attrs["s_chunks"]}
        _gpu_limits(ck, g_el, g, chunks, algo)
        gpus[g] = Gpu(g, chunks, _tbs(ck, g_el, g, chunks, algo))
    for g in sorted(set(range(n)) - set(gpus)):
        ck.fail(el, f"no <gpu> element for rank {g} (ngpus={n})")
    _locations(ck, el, algo, gpus.values())
    return tuple(gpus[g] for g in sorted(gpus)) if len(gpus) == n else None


def _locations(ck: _Checker, el: Element, algo: _Header, gpus: Iterable[Gpu]) -> None:
    """Bound the chunks the executor's model will hold (:data:`MAX_LOCATIONS`) before it holds them."""
    buffers = 2 if algo.outofplace else 1
    total = sum(buffers * algo.nchunks + gpu.chunks["s"] for gpu in gpus)
    if total > MAX_LOCATIONS:
        what = f"{total:,} chunks in the GPUs' buffers: stragglar proves files of at most {MAX_LOCATIONS:,}"
        ck.fail(el, what)


def _gpu_limits(ck: _Checker, el: Element, g: int, chunks: dict[str, int], algo: _Header) -> None:
    """The executor's limits on a rank's part (its count of elements is the tokenizer's), and ours
    on its scratch buffer."""
    if len(el.children) > MAX_TBS:
        ck.fail(el, f"{len(el.children)} thread blocks, the executor allows {MAX_TBS}", g)
    if chunks["s"] < 0:
        ck.fail(el, f"s_chunks {chunks['s']} is negative", g)
    elif chunks["s"] > MAX_SCRATCH:
        what = f"stragglar proves files of at most {MAX_SCRATCH:,} scratch chunks per GPU (int16 offsets)"
        ck.fail(el, f"s_chunks {chunks['s']:,}: {what}", g)
    for buf, size in (("i", chunks["i"]), ("o", chunks["o"])):
        if not 0 <= size <= algo.nchunks:
            ck.fail(el, f"{buf}_chunks {size} outside 0..nchunksperloop ({algo.nchunks})", g)
    if algo.outofplace and chunks["o"] != algo.nchunks:
        ck.fail(el, f"o_chunks {chunks['o']} != nchunksperloop {algo.nchunks} in an out-of-place algo", g)


def _tbs(ck: _Checker, el: Element, g: int, chunks: dict[str, int], algo: _Header) -> tuple[ThreadBlock, ...]:
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


def _tb_attrs(ck: _Checker, el: Element, g: int, attrs: _TbHeader, algo: _Header) -> None:
    t = attrs.id
    for key, peer in (("send", attrs.send), ("recv", attrs.recv)):
        if not -1 <= peer < algo.ngpus or peer == g:
            ck.fail(el, f"{key}={peer} must be -1 or another gpu in 0..{algo.ngpus - 1}", g, t)
    if not 0 <= attrs.chan < algo.nchannels:
        ck.fail(el, f"chan {attrs.chan} outside 0..nchannels-1 ({algo.nchannels - 1})", g, t)
    if len(el.children) > MAX_STEPS:
        ck.fail(el, f"{len(el.children)} steps, the executor allows {MAX_STEPS} (nops included)", g, t)


def _tb_channels(ck: _Checker, el: Element, g: int, raw: dict[int, tuple[Element, _TbHeader]]) -> None:
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
    ck: _Checker, el: Element, g: int, t: int, tb: _TbHeader, chunks: dict[str, int]
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
    ck: _Checker,
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
    ck: _Checker, st: Element, place: tuple[int, int, int], steps: dict[int, list[StepRecord | None]]
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
    ck: _Checker,
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
