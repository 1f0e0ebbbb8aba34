"""Read MSCCL XML exactly as the MSCCL executor's parser does, and list every rule it breaks.

The executor (Azure/msccl-executor-nccl, RCCL) has its own tokenizer, not an XML library: spaces
and newlines between elements only, attributes separated by single spaces on the element's line,
double-quoted values, comments skipped, unknown elements ignored.  :func:`read_msccl` follows
those rules, then checks what the executor checks when it loads a rank's part (required
attributes, ranges, thread-block and step limits) and what it silently gets wrong (a step index
that is not the step's position, a dependency on a step without ``hasdep``, operands out of
bounds), and returns the program as the executor stores it: nops folded into dependencies and
consecutive ``re`` steps fused.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from dataclasses import dataclass, field

__all__ = ["Algo", "Gpu", "MscclViolation", "ThreadBlock", "Tx", "read_msccl"]

PROTOCOLS = {"Simple": 2, "LL": 8, "LL128": 8}  # protocol -> chunk transfers a connection buffers
SEND_TYPES = frozenset({"s", "rcs", "rrs", "rrcs"})
RECV_TYPES = frozenset({"r", "rcs", "rrs", "rrc", "rrcs"})
READS_SRC = frozenset({"s", "rrs", "rrc", "rrcs", "cpy", "re"})
WRITES_DST = frozenset({"r", "rcs", "rrc", "rrcs", "cpy", "re"})
TYPES = SEND_TYPES | RECV_TYPES | {"cpy", "re", "nop"}
MAX_STEPS, MAX_COUNT, MAX_DEPENDENCY_TB, MAX_CHANNELS = 64, 72, 127, 32
MAX_TBS_PER_CHANNEL, MAX_TBS, MAX_NODES, MAX_SUBS, MAX_OFFSET = 32, 1024, 4096, 1024, 32767
MAX_ATTRS, MAX_STR = 16, 255
MAX_REDUCE_FUSION = 16
_INT = re.compile(r"-?(0|[1-9][0-9]*)")
_TOKEN = re.compile(r"[^ >/\n\r=]*")
_HANDLERS = {"": ("algo",), "algo": ("gpu",), "gpu": ("tb",), "tb": ("step",)}
_ALGO_KEYS = (
    "name",
    "proto",
    "nchannels",
    "nchunksperloop",
    "ngpus",
    "coll",
    "inplace",
    "outofplace",
    "minBytes",
    "maxBytes",
)
_STEP_KEYS = ("s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep")


@dataclass(frozen=True)
class MscclViolation:
    """Why an MSCCL file is rejected, with the GPU, thread block, step and chunk where known."""

    kind: str
    gpu: int | None
    tb: int | None
    step: int | None
    chunk: int | None
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class Tx:
    """One transmission as the executor stores it; ``pos`` is its (last) step's position."""

    type: str
    pos: int
    deps: tuple[tuple[int, int], ...]  # (tb id, step position), waited for before the transmission
    srcbuf: str
    srcoffs: tuple[int, ...]  # several for fused ``re`` steps
    dstbuf: str
    dstoff: int
    cnt: int
    hasdep: bool


@dataclass(frozen=True)
class ThreadBlock:
    id: int
    send: int
    recv: int
    chan: int
    txs: tuple[Tx, ...]
    tx_at: tuple[int, ...]  # step position -> index in txs (-1 for a nop)


@dataclass(frozen=True)
class Gpu:
    id: int
    chunks: dict[str, int]  # buffer -> declared chunks
    tbs: tuple[ThreadBlock, ...]


@dataclass(frozen=True)
class Algo:
    name: str
    proto: str
    nchannels: int
    nchunks: int
    ngpus: int
    inplace: bool
    outofplace: bool
    gpus: tuple[Gpu, ...]

    @property
    def capacity(self) -> int:
        return PROTOCOLS[self.proto]


class SyntaxProblem(Exception):
    """The executor's tokenizer stops here; nothing after it is read."""


@dataclass
class Element:
    name: str
    line: int
    attrs: dict[str, str]
    children: list[Element] = field(default_factory=list)


# ---------------------------------------------------------------------------- tokenizer


class _Scanner:
    """The executor's tokenizer, one node at a time."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0
        self.counted, self.lines = 0, 1  # newlines before ``counted`` are in ``lines``

    def line(self, at: int | None = None) -> int:
        end = min(self.pos if at is None else at, len(self.text))
        if end < self.counted:
            self.counted, self.lines = 0, 1
        self.lines += self.text.count("\n", self.counted, end)
        self.counted = end
        return self.lines

    def fail(self, what: str) -> SyntaxProblem:
        return SyntaxProblem(f"line {self.line(self.pos - 1)}: {what}")  # the character just read

    def char(self) -> str:
        if self.pos >= len(self.text):
            raise self.fail("unexpected end of file")
        c = self.text[self.pos]
        self.pos += 1
        return c

    def token(self, *, value: dict[str, str] | None = None) -> tuple[str, str]:
        """Characters up to a space, '>', '/' or newline (or an attribute's '=' and value)."""
        match = _TOKEN.match(self.text, self.pos)
        assert match is not None
        name = match.group()
        if len(name) >= MAX_STR:
            raise self.fail(f"name {name[:20]!r}... longer than {MAX_STR - 1} characters")
        self.pos = match.end()
        c = self.char()
        if c != "=":
            return name, c
        if value is None:
            raise self.fail(f"unexpected '=' after {name!r}")
        return name, self.value(value, name)

    def value(self, out: dict[str, str], key: str) -> str:
        quote = self.char()
        if quote == "'":
            raise self.fail(f"attribute {key}: single quotes (the executor reads up to a double quote)")
        if quote != '"':
            raise self.fail(f"attribute {key}: expected a double quote, got {quote!r}")
        end = self.text.find('"', self.pos)
        if end < 0:
            raise self.fail(f"attribute {key}: unterminated value")
        if end - self.pos > MAX_STR:
            raise self.fail(f"attribute {key}: value longer than {MAX_STR} characters overflows the executor")
        out.setdefault(key, self.text[self.pos : end])
        self.pos = end + 1
        return self.char()

    def node(self) -> tuple[str, Element] | None:
        """The next (kind, element) with kind open, single or close; None at the end."""
        while self.pos < len(self.text) and self.text[self.pos] in " \n\r":
            self.pos += 1
        if self.pos == len(self.text):
            return None
        line = self.line()
        c = self.char()
        if c != "<":
            raise self.fail(f"expected '<', got {c!r} (only spaces and newlines may separate elements)")
        start = self.pos
        name, c = self.token()
        if name.startswith("!--"):
            end = self.text.find("-->", start + 3)
            if end < 0:
                raise self.fail("unterminated comment")
            self.pos = end + 3
            return self.node()
        if name == "" and c == "/":
            name, c = self.token()
            if c != ">":
                raise self.fail(f"unexpected {c!r} in closing tag </{name}")
            return "close", Element(name, line, {})
        attrs: dict[str, str] = {}
        count = 0
        while c == " ":
            kept = attrs if count < MAX_ATTRS else {}
            _, c = self.token(value=kept)
            count += 1
        kind = "open"
        if c == "/":
            kind = "single"
            _, c = self.token()
        if c != ">":
            raise self.fail(f"<{name}>: expected '>', got {c!r} (attributes must share the element's line)")
        return kind, Element(name, line, attrs)


def _load(scanner: _Scanner, head: Element | None) -> list[Element]:
    """The children of ``head`` (or the top level) that the executor keeps; others are skipped."""
    keep = _HANDLERS.get(head.name if head else "", ())
    kept: list[Element] = []
    while True:
        got = scanner.node()
        if got is None:
            if head is not None:
                raise scanner.fail(f"<{head.name}> from line {head.line} is never closed")
            return kept
        kind, el = got
        if kind == "close":
            if head is None or el.name != head.name:
                raise scanner.fail(f"closing tag </{el.name}> does not match <{head.name if head else ''}>")
            return kept
        if head is not None and head.name == "step":
            raise scanner.fail("a <step> must not contain elements (the executor's parser crashes)")
        children = _load(scanner, el) if kind == "open" else []
        if el.name in keep:
            el.children = children
            kept.append(el)


# ---------------------------------------------------------------------------- structure


class _Checker:
    """Collects every structural violation, each one line naming the place."""

    def __init__(self) -> None:
        self.problems: list[MscclViolation] = []

    def fail(
        self, el: Element, what: str, gpu: int | None = None, tb: int | None = None, step: int | None = None
    ) -> None:
        where = " ".join(f"{k} {v}" for k, v in (("gpu", gpu), ("tb", tb), ("step", step)) if v is not None)
        prefix = f"line {el.line}: " + (f"{where}: " if where else "")
        self.problems.append(MscclViolation("structure", gpu, tb, step, None, prefix + what))

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


def read_msccl(text: str) -> tuple[Algo | None, list[MscclViolation]]:
    """Parse ``text`` with the executor's rules: the program, or None and every violation found."""
    try:
        scanner = _Scanner(text)
        first = scanner.node()
        scanner.pos = 0
        top = _load(scanner, None)
    except SyntaxProblem as e:
        return None, [MscclViolation("syntax", None, None, None, None, str(e))]
    if first is None or first[1].name != "algo" or not top:
        what = "the file must start with an <algo> element (the executor reads its first element)"
        return None, [MscclViolation("syntax", None, None, None, None, what)]
    checker = _Checker()
    algo = _algo(checker, top[0], sum(len(a.children) for a in top) + len(top))
    return (algo if not checker.problems else None), checker.problems


def _algo(ck: _Checker, el: Element, shared_nodes: int) -> Algo | None:
    strings = ck.strings(el, ("name", "proto", "coll"))
    nums = ck.ints(el, ("nchannels", "nchunksperloop", "ngpus", "inplace", "outofplace"))
    sizes = ck.ints(el, ("minBytes", "maxBytes"), bits=64)
    if strings is None or nums is None or sizes is None:
        return None
    if strings["proto"] not in PROTOCOLS:
        ck.fail(el, f"proto {strings['proto']!r} is not one of {', '.join(PROTOCOLS)}")
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
        ck.fail(el, 'inplace="0" and outofplace="0": the algorithm is never selected')
    low, high = sizes["minBytes"], sizes["maxBytes"]
    if low < 0 or high < 0 or (high and high < low):
        ck.fail(el, f"minBytes {low} / maxBytes {high}: no message size selects the algorithm")
    gpus = _gpus(ck, el, nums, shared_nodes)
    if ck.problems or gpus is None:
        return None
    return Algo(
        strings["name"],
        strings["proto"],
        nums["nchannels"],
        nums["nchunksperloop"],
        nums["ngpus"],
        bool(nums["inplace"]),
        bool(nums["outofplace"]),
        gpus,
    )


def _gpus(ck: _Checker, el: Element, algo: dict[str, int], shared_nodes: int) -> tuple[Gpu, ...] | None:
    n = algo["ngpus"]
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
        _gpu_limits(ck, g_el, g, chunks, algo, shared_nodes)
        gpus[g] = Gpu(g, chunks, _tbs(ck, g_el, g, chunks, algo))
    for g in sorted(set(range(n)) - set(gpus)):
        ck.fail(el, f"no <gpu> element for rank {g} (ngpus={n})")
    return tuple(gpus[g] for g in sorted(gpus)) if len(gpus) == n else None


def _gpu_limits(
    ck: _Checker, el: Element, g: int, chunks: dict[str, int], algo: dict[str, int], shared_nodes: int
) -> None:
    nodes = shared_nodes + len(el.children) + sum(len(tb.children) for tb in el.children)
    if nodes >= MAX_NODES:
        ck.fail(
            el,
            f"rank's part of the file has {nodes} elements, the executor's parser holds {MAX_NODES - 1}",
            g,
        )
    if len(el.children) > MAX_TBS:
        ck.fail(el, f"{len(el.children)} thread blocks, the executor allows {MAX_TBS}", g)
    if chunks["s"] < 0:
        ck.fail(el, f"s_chunks {chunks['s']} is negative", g)
    for buf, size in (("i", chunks["i"]), ("o", chunks["o"])):
        if not 0 <= size <= algo["nchunksperloop"]:
            ck.fail(el, f"{buf}_chunks {size} outside 0..nchunksperloop ({algo['nchunksperloop']})", g)
    if algo["outofplace"] and chunks["o"] != algo["nchunksperloop"]:
        ck.fail(
            el,
            f"o_chunks {chunks['o']} != nchunksperloop {algo['nchunksperloop']} in an out-of-place algo",
            g,
        )


def _tbs(
    ck: _Checker, el: Element, g: int, chunks: dict[str, int], algo: dict[str, int]
) -> tuple[ThreadBlock, ...]:
    raw: dict[int, tuple[Element, dict[str, int]]] = {}
    for tb_el in el.children:
        attrs = ck.ints(tb_el, ("id", "send", "recv", "chan"), g)
        if attrs is None:
            continue
        t = attrs["id"]
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


def _tb_attrs(ck: _Checker, el: Element, g: int, attrs: dict[str, int], algo: dict[str, int]) -> None:
    t = attrs["id"]
    for key in ("send", "recv"):
        peer = attrs[key]
        if not -1 <= peer < algo["ngpus"] or peer == g:
            ck.fail(el, f"{key}={peer} must be -1 or another gpu in 0..{algo['ngpus'] - 1}", g, t)
    if not 0 <= attrs["chan"] < algo["nchannels"]:
        ck.fail(el, f"chan {attrs['chan']} outside 0..nchannels-1 ({algo['nchannels'] - 1})", g, t)
    if len(el.children) > MAX_STEPS:
        ck.fail(el, f"{len(el.children)} steps, the executor allows {MAX_STEPS} (nops included)", g, t)


def _tb_channels(ck: _Checker, el: Element, g: int, raw: dict[int, tuple[Element, dict[str, int]]]) -> None:
    """One TB per (channel, peer, direction); at most 32 sending (receiving) TBs a channel."""
    for key in ("send", "recv"):
        owners: dict[tuple[int, int], int] = {}
        per_channel: Counter[int] = Counter()
        for t, (tb_el, attrs) in sorted(raw.items()):
            chan, peer = attrs["chan"], attrs[key]
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


@dataclass(frozen=True)
class _Row:
    """A step's attributes, as read."""

    type: str
    srcbuf: str
    srcoff: int
    dstbuf: str
    dstoff: int
    cnt: int
    depid: int
    deps: int
    hasdep: int


def _steps(
    ck: _Checker, el: Element, g: int, t: int, tb: dict[str, int], chunks: dict[str, int]
) -> list[_Row | None]:
    rows: list[_Row | None] = []
    for i, st in enumerate(el.children):
        nums = ck.ints(st, ("s", "srcoff", "dstoff", "cnt", "depid", "deps", "hasdep"), g, t, i)
        names = ck.strings(st, ("type", "srcbuf", "dstbuf"), g, t, i)
        if nums is None or names is None:
            rows.append(None)
            continue
        position = nums["s"]
        row = _Row(
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
        if position != i:
            ck.fail(
                st, f's="{position}" but it is step {i} of its tb (dependencies count positions)', g, t, i
            )
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
    row: _Row,
    tb: dict[str, int],
    chunks: dict[str, int],
) -> None:
    kind, cnt = row.type, row.cnt
    if kind == "nop":
        if row.depid == -1:
            ck.fail(st, "nop without a dependency (the executor's step numbering skips it)", *place)
        return
    if not 1 <= cnt < MAX_COUNT:
        ck.fail(st, f"cnt {cnt} outside 1..{MAX_COUNT - 1}", *place)
    if kind in SEND_TYPES and tb["send"] < 0:
        ck.fail(st, f"{kind} sends but the tb has send=-1", *place)
    if kind in RECV_TYPES and tb["recv"] < 0:
        ck.fail(st, f"{kind} receives but the tb has recv=-1", *place)
    for side, buf, off, used in (
        ("src", row.srcbuf, row.srcoff, kind in READS_SRC),
        ("dst", row.dstbuf, row.dstoff, kind in WRITES_DST),
    ):
        if used and buf in chunks and not (off >= 0 and off + cnt <= min(chunks[buf], MAX_OFFSET + 1)):
            what = f"{side} {buf}[{off}..{off + cnt - 1}] outside the {chunks[buf]} chunks of buffer {buf}"
            ck.fail(st, what, *place)


def _check_dependency(
    ck: _Checker, st: Element, place: tuple[int, int, int], steps: dict[int, list[_Row | None]]
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
        ck.fail(st, f"depid {depid} > {MAX_DEPENDENCY_TB}: the executor stores it in an int8", *place)
    if depid not in steps:
        ck.fail(st, f"depends on tb {depid}, which this gpu does not have", *place)
    elif not 0 <= deps < len(steps[depid]):
        ck.fail(
            st, f"depends on tb {depid} step {deps}, outside its steps 0..{len(steps[depid]) - 1}", *place
        )
    else:
        target = steps[depid][deps]
        if target is not None and target.type == "nop":
            ck.fail(st, f"depends on tb {depid} step {deps}, a nop, which never signals", *place)
        elif target is not None and target.hasdep == 0:
            what = (
                f'depends on tb {depid} step {deps}, which lacks hasdep="1" (only such steps signal progress)'
            )
            ck.fail(st, what, *place)


def _program(t: int, attrs: dict[str, int], rows: list[_Row]) -> ThreadBlock:
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
    return ThreadBlock(t, attrs["send"], attrs["recv"], attrs["chan"], tuple(txs), tuple(tx_at))
