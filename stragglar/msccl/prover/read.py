"""Read MSCCL XML exactly as the MSCCL executor's parser does, and list every rule it breaks.

:func:`read` reads the elements with the executor's own tokenizer
(:mod:`stragglar.msccl.prover.tokens`), then checks what the executor checks when it loads a rank's
part (required attributes, ranges, thread-block and step limits) and what it silently gets wrong (a
dependency no step will ever release, operands out of bounds), and returns the program as the
executor stores it (:mod:`stragglar.msccl.prover.parsed`): nops folded into dependencies and
consecutive ``re`` steps fused.  This module reads the ``<algo>`` and ``<gpu>`` elements, and
:mod:`stragglar.msccl.prover.blocks` each GPU's thread blocks and their steps.  What the executor
runs otherwise than written is a warning (:attr:`~stragglar.msccl.prover.parsed.Algo.warnings`),
not a violation, and the proof judges what it runs: a dependency on a step without ``hasdep`` that
a later ``hasdep`` step of the same thread block releases (the kernel waits for ``flag >= goal``,
so the wait ends then, later than written), and a step index ``s`` that is not the step's position
(the executor checks its range and otherwise numbers steps by position, as dependencies count
them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from stragglar.errors import ArgumentError, described
from stragglar.msccl.errors import MscclViolation
from stragglar.msccl.prover.blocks import Checker, Header, thread_blocks
from stragglar.msccl.prover.parsed import Algo, Gpu, XmlDocument, XmlSource
from stragglar.msccl.prover.tokens import Element, LimitProblem, SyntaxProblem, elements, first_name
from stragglar.msccl.vocabulary import (
    CAPACITY,
    MAX_CHANNELS,
    MAX_OFFSET,
    MAX_SUBS,
    MAX_TBS,
    legacy_scratch,
    size_window,
)
from stragglar.schedule import MAX_CELLS

__all__ = ["MAX_LOCATIONS", "MAX_SCRATCH", "read"]

# Scratch chunks a GPU may declare: the executor's int16 offsets address no more (a step must end
# by MAX_OFFSET + 1, see blocks._check_step), and stragglar's lowering writes at most nchunksperloop.
# Without the bound, s_chunks="2000000000" made the model a list of two billion chunks.
MAX_SCRATCH = MAX_OFFSET + 1
# Chunks in all GPUs' buffers (input, output unless in place, scratch): the executor's model holds
# an N-bit value for each, in each of its two pipeline iterations, so MAX_CELLS of them at N = 1024
# take about 1.5 GB, as MAX_CELLS (rank, chunk) cells take the schedule simulator at N = 2048.  The
# executor's own limits allow 1024 GPUs of 32767 chunks: a 60 KB file of empty <gpu> elements went
# past 5.8 GB.  The files stragglar's lowering writes hold some thousands (16,384 for a ring over 32
# GPUs at 16 instances): what fits the executor's 4095 elements a rank.
MAX_LOCATIONS = MAX_CELLS


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
    checker = Checker()
    algo = _algo(checker, top[0])
    if algo is None or checker.problems:
        return XmlDocument(None, tuple(checker.problems))
    return XmlDocument(dataclasses.replace(algo, warnings=tuple(checker.warnings)), ())


_ALGO_STRINGS = ("name", "proto", "coll")
_ALGO_INTS = ("nchannels", "nchunksperloop", "ngpus", "inplace", "outofplace")
_ALGO_SIZES = ("minBytes", "maxBytes")


def _algo(ck: Checker, el: Element) -> Algo | None:
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
        ck.warn(el, window.partial)
    header = Header(
        nums["nchannels"], nums["nchunksperloop"], nums["ngpus"], nums["inplace"], nums["outofplace"]
    )
    gpus = _gpus(ck, el, header)
    if ck.problems or gpus is None:
        return None
    reserve = legacy_scratch(sizes["maxBytes"], max(gpu.chunks["s"] for gpu in gpus), header.nchunks)
    if reserve is not None:
        ck.warn(el, reserve)
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


def _gpus(ck: Checker, el: Element, algo: Header) -> tuple[Gpu, ...] | None:
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
        gpus[g] = Gpu(g, chunks, thread_blocks(ck, g_el, g, chunks, algo))
    for g in sorted(set(range(n)) - set(gpus)):
        ck.fail(el, f"no <gpu> element for rank {g} (ngpus={n})")
    _locations(ck, el, algo, gpus.values())
    return tuple(gpus[g] for g in sorted(gpus)) if len(gpus) == n else None


def _locations(ck: Checker, el: Element, algo: Header, gpus: Iterable[Gpu]) -> None:
    """Bound the chunks the executor's model will hold (:data:`MAX_LOCATIONS`) before it holds them."""
    buffers = 2 if algo.outofplace else 1
    total = sum(buffers * algo.nchunks + gpu.chunks["s"] for gpu in gpus)
    if total > MAX_LOCATIONS:
        what = f"{total:,} chunks in the GPUs' buffers: stragglar proves files of at most {MAX_LOCATIONS:,}"
        ck.fail(el, what)


def _gpu_limits(ck: Checker, el: Element, g: int, chunks: dict[str, int], algo: Header) -> None:
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
