"""The MSCCL XML prover on hand-written files (one per kind of bug, and a correct ring), on the
executor's syntax and structure rules, and on mutants of exported files: each rejected with a
one-line message naming the GPU, thread block, step and chunk."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from cli_results import one_error, run
from msccl_model import run_numeric, run_orders, unordered_accesses

from stragglar import msccl
from stragglar.msccl import (
    MscclExportError,
    MscclFormatError,
    MscclVerificationError,
    MscclViolation,
    XmlOptions,
    check_msccl,
)
from stragglar.msccl.prover import machine
from stragglar.msccl.prover.read import MAX_LOCATIONS, MAX_SCRATCH
from stragglar.msccl.prover.tokens import MAX_IGNORED
from stragglar.msccl.vocabulary import MAX_NODES
from stragglar.synth import synthesize
from stragglar.verify import prove

FIXTURES = Path(__file__).parent / "fixtures" / "msccl"


def fixture(name: str) -> str:
    return (FIXTURES / f"{name}.xml").read_text()


def rejected(text: str) -> MscclViolation:
    violation = check_msccl(text)
    assert violation is not None
    assert "\n" not in violation.message
    return violation


# ---------------------------------------------------------------------------- hand-written files


def test_handwritten_ring_is_proved() -> None:
    proof = msccl.prove(fixture("ring3"))
    assert proof.summary == (
        "proved: ring3-handwritten: in-place allreduce over 3 GPUs, 3 chunks per loop, 3 thread blocks, "
        "15 steps, 1 channel, Simple"
    )
    assert proof.details == (
        "Simple (2 chunks per connection), 2 pipeline iterations: no deadlock, no race, "
        "every send matched, every chunk on every GPU holds each GPU's contribution exactly once"
    )


@pytest.mark.parametrize(
    ("name", "kind", "place", "message"),
    [
        (
            "missing_hasdep",
            "structure",
            (0, 1, 0, None),
            'line 8: gpu 0 tb 1 step 0: depends on tb 0 step 0, which lacks hasdep="1", as do all later '
            "steps of tb 0: the wait never ends (only hasdep steps signal)",
        ),
        (
            "wrong_srcoff",
            "mixed",
            (0, 0, 3, 1),
            "gpu 0 tb 0 step 3 (rrc chunk 1) adds chunk 0 data to chunk 1 data; "
            "the wrong value survives in gpu 0 chunk 1",
        ),
        (
            "mismatched_cnt",
            "mismatch",
            (1, 0, 1, 0),
            "gpu 1 tb 0 step 1 (rrc chunk 0, cnt 1) meets the send of gpu 0 tb 0 step 0 (chunk 0, cnt 2) on "
            "channel 0: counts differ",
        ),
        (
            "send_cycle",
            "deadlock",
            (0, 0, 2, 2),
            "deadlock (Simple, 2 chunks per connection): gpu 0 tb 0 step 2 (s chunk 2) waits for room to "
            "send to gpu 1 on channel 0 -> gpu 1 tb 0 step 2 (s chunk 2) waits for room to send to gpu 0 "
            "on channel 0 -> back to the first",
        ),
        (
            "double_count",
            "duplicate",
            (0, 0, 1, 0),
            "gpu 0 tb 0 step 1 (rrc chunk 0) counts the contributions of gpus [0] twice in chunk 0 data; "
            "the wrong value survives in gpu 0 chunk 0",
        ),
        (
            "race",
            "race",
            (1, 1, 0, 0),
            "gpu 1 tb 1 step 0 (rrc chunk 0) writes i[0] (iteration 0) with no dependency path from tb 0 "
            "step 0, which reads it: a race",
        ),
    ],
)
def test_handwritten_bug(name: str, kind: str, place: tuple[int, ...], message: str) -> None:
    violation = rejected(fixture(name))
    assert (violation.kind, (violation.gpu, violation.tb, violation.step, violation.chunk)) == (kind, place)
    assert violation.message == message


@pytest.mark.parametrize("proto", ["LL", "LL128"])
def test_send_cycle_fits_the_larger_buffers(proto: str) -> None:
    text = fixture("send_cycle").replace('proto="Simple"', f'proto="{proto}"')
    assert msccl.prove(text).capacity == 8


def test_fused_reductions_and_nop_chains() -> None:
    """Each GPU receives the others' chunk into scratch, then one fused ``re`` pair adds both."""
    gpus = []
    for g in range(3):
        a, b = (g + 1) % 3, (g + 2) % 3
        gpus.append(
            f'<gpu id="{g}" i_chunks="1" o_chunks="0" s_chunks="2">\n'
            f'<tb id="0" send="{a}" recv="-1" chan="0">\n{step(0, "s", hasdep=1)}\n</tb>\n'
            f'<tb id="1" send="{b}" recv="-1" chan="0">\n{step(0, "s", hasdep=1)}\n</tb>\n'
            f'<tb id="2" send="-1" recv="{a}" chan="0">\n{step(0, "r", dst=("s", 0), hasdep=1)}\n</tb>\n'
            f'<tb id="3" send="-1" recv="{b}" chan="0">\n{step(0, "r", dst=("s", 1), hasdep=1)}\n</tb>\n'
            '<tb id="4" send="-1" recv="-1" chan="0">\n'
            + "\n".join(step(i, "nop", dep=(i, 0)) for i in range(3))
            + "\n"
            + step(3, "re", src=("s", 0), dep=(3, 0))
            + "\n"
            + step(4, "re", src=("s", 1))
            + "\n</tb>\n</gpu>"
        )
    text = algo("fused", 3, 1, "\n".join(gpus))
    assert msccl.prove(text).steps == 3 * 9
    unfused = text.replace(
        '<step s="4" type="re" srcbuf="s" srcoff="1"', '<step s="4" type="re" srcbuf="s" srcoff="0"'
    )
    assert rejected(unfused).kind == "duplicate"


def test_out_of_place() -> None:
    ring = fixture("ring3").replace('inplace="1" outofplace="0"', 'inplace="0" outofplace="1"')
    ring = ring.replace('o_chunks="0"', 'o_chunks="3"')
    violation = rejected(ring)
    assert violation.message == "final state: gpu 0 chunk 0 holds uninitialized memory (never written)"
    for kind in ("rrcs", "rcs", '"r"'):  # results to o; the input stays intact for the local operands
        ring = re.sub(
            rf'(type={kind if kind[0] == chr(34) else chr(34) + kind + chr(34)} .*?dstbuf=)"i"',
            r'\1"o"',
            ring,
        )
    assert msccl.prove(ring).modes == ("out-of-place",)
    both = ring.replace('inplace="0"', 'inplace="1"')
    assert msccl.prove(both).modes == ("in-place", "out-of-place")


def test_dependency_on_own_later_step_deadlocks() -> None:
    text = (
        fixture("ring3")
        .replace(
            'type="s" srcbuf="i" srcoff="2" dstbuf="i" dstoff="2" cnt="1" depid="-1" deps="-1"',
            'type="s" srcbuf="i" srcoff="2" dstbuf="i" dstoff="2" cnt="1" depid="0" deps="4"',
        )
        .replace(
            'type="r" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"',
            'type="r" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="1"',
        )
    )
    violation = rejected(text)
    assert violation.kind == "deadlock"
    assert (
        "gpu 0 tb 0 step 0 (s chunk 2) waits for tb 0 step 4 to signal -> back to the first"
        in violation.message
    )


# ---------------------------------------------------------------------------- syntax and structure


def step(
    s: int,
    kind: str,
    src: tuple[str, int] = ("i", 0),
    dst: tuple[str, int] = ("i", 0),
    cnt: int = 1,
    dep: tuple[int, int] = (-1, -1),
    hasdep: int = 0,
) -> str:
    if kind == "nop":
        src, dst, cnt = ("i", -1), ("i", -1), 0
    return (
        f'<step s="{s}" type="{kind}" srcbuf="{src[0]}" srcoff="{src[1]}" dstbuf="{dst[0]}" '
        f'dstoff="{dst[1]}" cnt="{cnt}" depid="{dep[0]}" deps="{dep[1]}" hasdep="{hasdep}"/>'
    )


def algo(name: str, ngpus: int, nchunks: int, body: str) -> str:
    return (
        f'<algo name="{name}" proto="Simple" nchannels="1" nchunksperloop="{nchunks}" ngpus="{ngpus}" '
        f'coll="allreduce" inplace="1" outofplace="0" minBytes="0" maxBytes="0">\n{body}\n</algo>\n'
    )


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda t: t.replace("  <gpu", "\t<gpu", 1),
            "line 3: expected '<', got '\\t' (only spaces and newlines",
        ),
        (
            lambda t: '<?xml version="1.0"?>\n' + t,
            "line 1: <?xml: the executor's parser reads no <?...?> declaration",
        ),
        (
            lambda t: t.replace(' proto="Simple"', '\n proto="Simple"'),
            "line 2: <algo>: expected '>', got '\\n'",
        ),
        (lambda t: t.replace('coll="allreduce"', "coll='allreduce'"), "attribute coll: single quotes"),
        (lambda t: t.replace("</algo>\n", ""), "line 29: <algo> from line 2 is never closed"),
        (lambda t: t.replace("</tb>", "</gpu>", 1), "closing tag </gpu> does not match <tb>"),
        (lambda t: "<algos>\n" + t + "</algos>\n", "the file must start with an <algo> element"),
        (
            lambda t: t.replace('hasdep="0"/>', 'hasdep="0"><x/></step>', 1),
            "line 5: a <step> must not contain",
        ),
        (lambda t: t.replace("<algo ", "<algo " + 'x="" ' * 7, 1), "line 2: <algo> lacks attribute maxBytes"),
        (lambda t: t.replace(' srcbuf="i"', '  srcbuf="i"'), None),  # an empty attribute: harmless
    ],
)
def test_syntax(edit: Callable[[str], str], message: str | None) -> None:
    text = edit(fixture("ring3"))
    if message is None:
        assert check_msccl(text) is None
    else:
        assert message in rejected(text).message


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (' minBytes="0"', "", "line 2: <algo> lacks attribute minBytes"),
        ('proto="Simple"', 'proto="LL64"', "line 2: proto 'LL64' is not one of Simple, LL, LL128"),
        ('coll="allreduce"', 'coll="allgather"', "coll 'allgather': this verifier proves allreduce only"),
        ('nchannels="1"', 'nchannels="33"', "nchannels 33 outside 1..32"),
        ('inplace="1"', 'inplace="0"', 'inplace="0" and outofplace="0": the algorithm is never selected'),
        (
            'minBytes="0" maxBytes="1099511627776"',
            'minBytes="200" maxBytes="100"',
            "minBytes 200 / maxBytes 100",
        ),
        ('<gpu id="2"', '<gpu id="1"', "gpu id 1 is repeated"),
        (
            'i_chunks="3" o_chunks="0" s_chunks="0">\n    <tb id="0" send="0"',
            'i_chunks="3" o_chunks="0" s_chunks="-1">\n    <tb id="0" send="0"',
            "gpu 2: s_chunks -1 is negative",
        ),
        (
            '<tb id="0" send="1" recv="2"',
            '<tb id="1" send="1" recv="2"',
            "gpu 0: tb ids must be 0..0 without gaps: tb 0 is missing",
        ),
        (
            'send="1" recv="2" chan="0"',
            'send="1" recv="2" chan="1"',
            "gpu 0 tb 0: chan 1 outside 0..nchannels-1 (0)",
        ),
        (
            'send="1" recv="2" chan="0"',
            'send="0" recv="2" chan="0"',
            "gpu 0 tb 0: send=0 must be -1 or another gpu",
        ),
        (
            '<step s="1" type="rrs" srcbuf="i" srcoff="1"',
            '<step s="64" type="rrs" srcbuf="i" srcoff="1"',
            'gpu 0 tb 0 step 1: s="64" outside 0..63',
        ),
        (
            'type="rrs" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1"',
            'type="rrs" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="72"',
            "gpu 0 tb 0 step 1: cnt 72 outside 1..71",
        ),
        (
            'type="rrs" srcbuf="i" srcoff="1"',
            'type="rrs" srcbuf="i" srcoff="3"',
            "gpu 0 tb 0 step 1: src i[3..3] outside the 3 chunks of buffer i",
        ),
        (
            'type="rrs" srcbuf="i" srcoff="1"',
            'type="rrs" srcbuf="x" srcoff="1"',
            "gpu 0 tb 0 step 1: srcbuf 'x' is not i, o or s",
        ),
        (
            'type="rrs" srcbuf="i" srcoff="1"',
            'type="rrx" srcbuf="i" srcoff="1"',
            "gpu 0 tb 0 step 1: unknown type 'rrx'",
        ),
        (
            'type="rrs" srcbuf="i" srcoff="1"',
            'type="rrs" srcbuf="i" srcoff="01"',
            'gpu 0 tb 0 step 1: srcoff="01" is not a plain 32-bit decimal integer',
        ),
        (
            'type="rrs" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="0"',
            'type="rrs" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" deps="-1" hasdep="2"',
            "gpu 0 tb 0 step 1: hasdep must be 0 or 1, got 2",
        ),
        (
            'type="rrs" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1"',
            'type="rrs" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="128"',
            "gpu 0 tb 0 step 1: depid 128 > 127: the executor stores it in an int8",
        ),
        (
            'type="rrs" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="-1" deps="-1"',
            'type="rrs" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="0" deps="7"',
            "gpu 0 tb 0 step 1: depends on tb 0 step 7, outside its steps 0..4",
        ),
        (
            '<step s="1" type="rrs" srcbuf="i" srcoff="1"',
            '<step s="1" type="nop" srcbuf="i" srcoff="1"',
            "gpu 0 tb 0 step 2: a chain of nops must end at a step with a dependency",
        ),
    ],
)
def test_structure(old: str, new: str, message: str) -> None:
    text = fixture("ring3")
    assert old in text
    violation = rejected(text.replace(old, new, 1))
    # the executor refuses to load a file breaking its rules (exit 2); it loads one with operands
    # out of bounds or dependencies it cannot honour and then computes the wrong thing (exit 1)
    loads = (
        "outside the 3 chunks",
        "depid 128",
        "outside its steps",
        "lacks hasdep",
        "a nop, which",
        "minBytes 200",
        "never selected",
    )
    assert violation.kind == ("structure" if any(k in message for k in loads) else "format")
    assert message in violation.message
    with pytest.raises(MscclVerificationError) as e:
        msccl.prove(text.replace(old, new, 1))
    assert e.value.exit_code == (1 if violation.kind == "structure" else 2)
    assert isinstance(e.value, MscclFormatError) == (violation.kind == "format")


@pytest.mark.parametrize(
    ("low", "high"),
    [(0, 0), (4096, 0), (5, 5), (10, 5), (-1, 100), (0, -1), (0, 1 << 40), (1024, 1 << 20)],
)
def test_export_and_verify_read_the_size_window_alike(low: int, high: int) -> None:
    """One rule (vocabulary.size_window): a window no executor selects is refused by both; one that an
    executor selects and another does not (maxBytes="0", minBytes = maxBytes) is a warning of the
    prover and refused by the exporter, which writes files every executor selects; any other
    passes both, silently."""
    proof = prove(synthesize("ring", 3))
    text = msccl.lower(proof).replace(
        'minBytes="0" maxBytes="1099511627776"', f'minBytes="{low}" maxBytes="{high}"'
    )
    try:
        exported: str | None = msccl.lower(proof, XmlOptions(min_bytes=low, max_bytes=high))
    except MscclExportError:
        exported = None
    try:
        warnings: tuple[str, ...] | None = msccl.prove(text).warnings
    except MscclVerificationError as e:
        assert e.violation.kind == "structure" and f"minBytes {low} / maxBytes {high}: " in str(e)
        warnings = None
    if exported is not None:
        assert exported == text and warnings == ()
    else:
        assert warnings is None or (len(warnings) == 1 and "microsoft/msccl" in warnings[0])


def test_a_step_index_that_is_not_its_position_is_a_warning_the_executor_runs_it_by_position() -> None:
    """The executor range-checks ``s`` and otherwise numbers steps by position (dependencies too):
    a file whose indices are off runs as its positions say, so it is proved, with a warning."""
    text = fixture("ring3").replace(
        '<step s="1" type="rrs" srcbuf="i"', '<step s="5" type="rrs" srcbuf="i"', 1
    )
    assert msccl.prove(text).warnings == (
        'line 6: gpu 0 tb 0 step 1: s="5" but it is step 1 of its tb: the executor numbers steps by '
        "position (dependencies count positions)",
    )


def test_every_structural_violation_is_reported() -> None:
    text = fixture("ring3").replace(
        '<step s="1" type="rrs" srcbuf="i" srcoff="1"', '<step s="99" type="rrs" srcbuf="i" srcoff="1"'
    )
    text = text.replace(
        'type="rrcs" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1"',
        'type="rrcs" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="0"',
    )
    text = text.replace('<tb id="0" send="0" recv="1" chan="0">', '<tb id="0" send="0" recv="1" chan="4">')
    with pytest.raises(MscclFormatError) as e:
        msccl.prove(text)
    assert [v.message for v in e.value.violations] == [  # what the executor refuses to load first
        'line 6: gpu 0 tb 0 step 1: s="99" outside 0..63',
        "line 16: gpu 1 tb 0 step 2: cnt 0 outside 1..71",
        "line 22: gpu 2 tb 0: chan 4 outside 0..nchannels-1 (0)",
    ]
    assert e.value.violation is e.value.violations[0] and e.value.exit_code == 2


def test_connection_shared_by_two_thread_blocks() -> None:
    text = fixture("missing_hasdep").replace(
        '<tb id="1" send="-1" recv="1" chan="0">', '<tb id="1" send="1" recv="1" chan="0">', 1
    )
    violation = rejected(text)
    assert (
        "gpu 0 tb 1: tb 0 already uses channel 0 to send gpu 1: a connection carries one thread block"
        in violation.message
    )


def test_nop_chain_must_end_with_a_dependency() -> None:
    body = (
        '<gpu id="0" i_chunks="1" o_chunks="0" s_chunks="0">\n<tb id="0" send="1" recv="1" chan="0">\n'
        + step(0, "s", hasdep=1)
        + "\n"
        + step(1, "nop", dep=(0, 0))
        + "\n"
        + step(2, "rrc")
        + '\n</tb>\n</gpu>\n<gpu id="1" i_chunks="1" o_chunks="0" s_chunks="0">\n</gpu>'
    )
    violation = rejected(algo("chain", 2, 1, body))
    assert "gpu 0 tb 0 step 2: a chain of nops must end at a step with a dependency" in violation.message


# ---------------------------------------------------------------------------- limits

RING3_TB = '<tb id="0" send="1" recv="2" chan="0">\n'  # gpu 0's only tb, on line 4 of ring3


def wide(ngpus: int, nchunks: int, scratch: int) -> str:
    """GPUs with buffers and no thread blocks: every chunk of every GPU wrong, never written."""
    gpus = "\n".join(
        f'<gpu id="{g}" i_chunks="{nchunks}" o_chunks="0" s_chunks="{scratch}"/>' for g in range(ngpus)
    )
    return algo("wide", ngpus, nchunks, gpus)


@pytest.mark.parametrize("scratch", [MAX_SCRATCH + 1, 20_000_000, 2_000_000_000])
def test_scratch_past_the_cap_is_refused_before_the_model_holds_it(scratch: int, tmp_path: Path) -> None:
    """s_chunks="2000000000" made the model a list of two billion chunks: now one line, exit 2, from
    verify and show alike; a GPU may declare all the scratch chunks int16 offsets address."""
    text = fixture("ring3").replace('s_chunks="0"', f's_chunks="{MAX_SCRATCH}"', 1)
    assert msccl.prove(text).gpus == 3
    path = tmp_path / "scratch.xml"
    path.write_text(text.replace(f's_chunks="{MAX_SCRATCH}"', f's_chunks="{scratch}"'))
    for command in ("verify", "show"):
        assert one_error(run(command, str(path)), 2) == (
            f"Error: {path} is not valid MSCCL XML: line 3: gpu 0: s_chunks {scratch:,}: stragglar proves "
            "files of at most 32,768 scratch chunks per GPU (int16 offsets)"
        )


def test_the_chunks_of_all_buffers_are_bounded_before_the_model_holds_them() -> None:
    """1024 GPUs of 32767 chunks pass the executor's limits, and a 60 KB file of them took the model
    past 5.8 GB: the reader refuses more chunks in all than it was made for."""
    assert MAX_LOCATIONS == 128 * 32767 + 128
    at_limit = msccl.read(wide(128, 32767, 1))
    assert at_limit.violations == () and at_limit.algo is not None  # proving it takes 1.5 GB: not here
    violation = rejected(wide(128, 32767, 1).replace('s_chunks="1"', 's_chunks="2"', 1))
    assert (violation.kind, violation.message) == (
        "format",
        "line 1: 4,194,305 chunks in the GPUs' buffers: stragglar proves files of at most 4,194,304",
    )
    violation = rejected(wide(1024, 32767, 0))
    assert violation.message.startswith("line 1: 33,553,408 chunks in the GPUs' buffers")


def test_a_file_wrong_in_every_chunk_describes_only_the_chunk_it_reports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Naming the GPUs a value lacks reads an N-bit mask: once per wrong chunk, a file of 1024 empty
    GPUs took minutes to say what its first chunk lacks."""
    described: list[int] = []

    def gpus(mask: int) -> str:
        described.append(mask)
        return f"{mask.bit_count()} contributions"

    monkeypatch.setattr(machine, "_gpus", gpus)
    violation = rejected(wide(64, 64, 0))
    assert violation.message == "final state: gpu 0 chunk 0 lacks 63 contributions (never written)"
    assert len(described) == 1  # of the 2 x 64 x 64 wrong chunks


def test_a_rank_past_the_parsers_elements_is_refused_at_the_element_that_passes_them(
    tmp_path: Path,
) -> None:
    """The executor's parser holds 4095 elements for a rank (<algo>, the <gpu> elements, that rank's
    <tb> and <step> elements): the reader stops at the 4096th, reading nothing after it, so 300,000
    nops cost what 4093 do, and a file broken after that point says the same."""
    nop = step(0, "nop", dep=(0, 0)) + "\n"
    text = fixture("ring3")
    pad = MAX_NODES - (1 + 3) - (1 + 5)  # nops in gpu 0's tb that take its part to 4096 elements
    assert "elements" not in rejected(text.replace(RING3_TB, RING3_TB + nop * (pad - 1), 1)).message
    holds = "the executor's parser holds 4095"
    violation = rejected(text.replace(RING3_TB, RING3_TB + nop * pad, 1))
    assert (violation.kind, violation.message) == (
        "format",
        f"line 3: gpu 0: rank's part of the file has 4096 elements by line {21 + pad}, {holds}",
    )  # the last <gpu> completes it
    path = tmp_path / "nops.xml"
    path.write_text(text.replace(RING3_TB, RING3_TB + nop * 300_000, 1).replace("</algo>", "<<broken"))
    assert one_error(run("verify", str(path)), 2) == (
        f"Error: {path} is not valid MSCCL XML: line 3: gpu 0: rank's part of the file has 4096 "
        f"elements by line {4 + 4093}, {holds}"  # nop 4093, after <algo>, <gpu> and <tb>
    )
    shared = algo("gpus", 3, 3, '<gpu id="0" i_chunks="3" o_chunks="0" s_chunks="0"/>\n' * 5000)
    assert rejected(shared).message == (
        f"line 4096: every rank's part of the file has 4096 elements by here (<algo> and <gpu> "
        f"elements), {holds}"
    )


def test_elements_the_executor_ignores_are_read_up_to_a_cap() -> None:
    """The executor skips unknown elements, however many; the reader skips 4095 and stops at the
    next (1.5 million took it 9 seconds to read), and stops at the first element of a file if it
    is not <algo> (the executor reads that element alone first)."""
    text = fixture("ring3")
    foo = '<foo a="1"/>\n'
    assert msccl.prove(text.replace(RING3_TB, RING3_TB + foo * MAX_IGNORED, 1)).gpus == 3
    message = (
        f"line {4 + MAX_IGNORED + 1}: 4,096 elements the executor ignores (unknown or out of place) by "
        "here: stragglar reads files of at most 4,095"
    )
    for count in (MAX_IGNORED + 1, 1_500_000):
        violation = rejected(text.replace(RING3_TB, RING3_TB + foo * count, 1) + "<<broken")
        assert (violation.kind, violation.message) == ("format", message)
    violation = rejected(foo * 1_500_000 + "<<broken")
    assert (
        violation.message
        == "the file must start with an <algo> element (the executor reads its first element)"
    )


# ---------------------------------------------------------------------------- mutants of exported files

MUTATED = [("stragglar", 4), ("stragglar", 6), ("ring", 4), ("rhd", 4), ("direct", 4)]
_STEP = re.compile(r'      <step s="(\d+)" type="(\w+)" .*depid="(-?\d+)" deps="(-?\d+)" hasdep="(\d)"/>')


def step_lines(text: str) -> list[tuple[int, int, int, re.Match[str]]]:
    """(line index, gpu, tb, match) of every step line."""
    out, gpu, tb = [], -1, -1
    for i, line in enumerate(text.splitlines()):
        if line.startswith("  <gpu"):
            gpu = int(line.split('"')[1])
        elif line.startswith("    <tb"):
            tb = int(line.split('"')[1])
        elif (m := _STEP.fullmatch(line)) is not None:
            out.append((i, gpu, tb, m))
    return out


def drop(text: str, first: int, last: int, gpu: int, tb: int) -> str:
    """Remove step lines ``first..last`` of one tb; renumber it and the dependencies into it."""
    lines = text.splitlines()
    pos, count = int(_STEP.fullmatch(lines[first]).group(1)), last + 1 - first  # type: ignore[union-attr]
    del lines[first : last + 1]
    for i, g, t, m in step_lines("\n".join(lines)):
        s, depid, deps = int(m.group(1)), int(m.group(3)), int(m.group(4))
        line = lines[i]
        if (g, t) == (gpu, tb) and s > pos:
            line = line.replace(f'<step s="{s}"', f'<step s="{s - count}"')
        if g == gpu and depid == tb and deps > pos:
            line = line.replace(f'deps="{deps}"', f'deps="{deps - count}"')
        lines[i] = line
    return "\n".join(lines) + "\n"


def assert_located(violation: MscclViolation) -> None:
    assert None not in (violation.gpu, violation.tb, violation.step, violation.chunk), violation
    for part in (
        f"gpu {violation.gpu}",
        f"tb {violation.tb}",
        f"step {violation.step}",
        f"chunk {violation.chunk}",
    ):
        assert part in violation.message, violation.message


def mutants(text: str) -> list[tuple[str, str]]:
    """Every single-step mutant: drop a transfer step, shift an offset, remove a dependency."""
    lines = text.splitlines()
    chunks = int(re.search(r'nchunksperloop="(\d+)"', text).group(1))  # type: ignore[union-attr]
    out = []
    for i, gpu, tb, m in step_lines(text):
        kind, depid, hasdep = m.group(2), int(m.group(3)), m.group(5)
        after_nop = 'type="nop"' in lines[i - 1]
        where = f"gpu {gpu} tb {tb} line {i + 1}"
        if kind in ("s", "r", "rrc") and hasdep == "0":  # with the nops that carry its dependencies
            first = i
            while 'type="nop"' in lines[first - 1]:
                first -= 1
            out.append((f"drop {where}", drop(text, first, i, gpu, tb)))
        if kind == "nop":
            out.append((f"drop nop {where}", drop(text, i, i, gpu, tb)))
        cnt = int(re.search(r'cnt="(\d+)"', lines[i]).group(1))  # type: ignore[union-attr]
        if kind != "nop" and cnt < chunks:  # shift within the buffer
            field = "dstoff" if kind == "r" else "srcoff"
            off = int(re.search(rf'{field}="(\d+)"', lines[i]).group(1))  # type: ignore[union-attr]
            shifted = lines[i].replace(f'{field}="{off}"', f'{field}="{(off + 1) % (chunks - cnt + 1)}"')
            out.append((f"shift {field} {where}", "\n".join([*lines[:i], shifted, *lines[i + 1 :]]) + "\n"))
        if kind != "nop" and depid >= 0 and not after_nop:
            undep = re.sub(r'depid="\d+" deps="\d+"', 'depid="-1" deps="-1"', lines[i])
            out.append((f"undepend {where}", "\n".join([*lines[:i], undep, *lines[i + 1 :]]) + "\n"))
    return out


@pytest.mark.parametrize(("algorithm", "n"), MUTATED)
def test_every_mutant_of_an_exported_file_is_rejected_or_still_correct(algorithm: str, n: int) -> None:
    """Rejected with a located message; an accepted mutant must pass the independent numeric model.

    A dependency removed (with its nop, if any) leaves the data flow as it was: the prover must
    refuse it as a race exactly when the independent graph of chunk moves has two accesses with no
    path between them, and accept it when the accesses stay ordered, inside the GPU or through
    other GPUs' sends and receives."""
    text = msccl.lower(prove(synthesize(algorithm, n)))
    rejected_kinds: set[str] = set()
    accepted: list[str] = []
    for name, mutant in mutants(text):
        violation = check_msccl(mutant)
        if name.startswith(("undepend", "drop nop")):
            assert (violation is None) == (unordered_accesses(mutant) == []), (name, violation)
        if violation is None:
            accepted.append(name)
            assert all(run_numeric(mutant, seed) == (True, True) for seed in range(3)), name
            continue
        assert_located(violation)
        rejected_kinds.add(name.split()[0])
        if name.startswith(("undepend", "drop nop")):
            assert violation.kind == "race", (name, violation)
    assert rejected_kinds == {"drop", "shift", "undepend"}
    assert len([name for name in accepted if not name.startswith(("undepend", "drop nop"))]) <= 2, accepted


def test_a_dependency_ordered_through_other_gpus_may_go() -> None:
    """gpu 0 tb 3 step 1 receives chunk 2 into i[2], which tb 0 step 0 sent to gpu 1 before: the
    written dependency orders the write after the read, and so does the chunk itself, which goes
    round through gpus 1, 2 and 3 before it comes back.  Without the dependency the file is still
    correct.  Without tb 0 step 1's, its send of i[1] races with the straggler's exchange into i[1]
    (tb 2 step 0), which nothing else orders."""
    text = msccl.lower(prove(synthesize("stragglar", 4)))
    through = 'type="r" srcbuf="i" srcoff="2" dstbuf="i" dstoff="2" cnt="1" depid="0" deps="0"'
    inside = '<step s="1" type="s" srcbuf="i" srcoff="1" dstbuf="i" dstoff="1" cnt="1" depid="2" deps="0"'
    assert text.count(through) == 1 and text.count(inside) == 1
    mutant = text.replace(through, through.replace('depid="0" deps="0"', 'depid="-1" deps="-1"'))
    assert msccl.prove(mutant).warnings == () and unordered_accesses(mutant) == []
    racy = text.replace(inside, inside.replace('depid="2" deps="0"', 'depid="-1" deps="-1"'))
    violation = rejected(racy)
    assert violation.kind == "race" and unordered_accesses(racy) == [(0, "i", 1)]
    assert violation.message == (
        "gpu 0 tb 2 step 0 (rrc chunk 1) writes i[1] (iteration 0) with no dependency path from tb 0 step 1, "
        "which reads it: a race"
    )


def hasdep_mutants(text: str) -> list[tuple[str, str]]:
    """For every step with ``hasdep="1"``: its hasdep dropped, and moved to the next step of its tb."""
    lines, steps = text.splitlines(), step_lines(text)
    out = []
    for k, (i, gpu, tb, m) in enumerate(steps):
        if m.group(5) != "1":
            continue
        where = f"gpu {gpu} tb {tb} line {i + 1}"
        edited = [*lines]
        edited[i] = lines[i].replace('hasdep="1"', 'hasdep="0"')
        out.append((f"drop hasdep {where}", "\n".join(edited) + "\n"))
        later = next(
            (j for j, g, t, n in steps[k + 1 :] if (g, t) == (gpu, tb) and n.group(2) != "nop"), None
        )
        if later is not None and 'hasdep="0"' in lines[later]:
            edited[later] = lines[later].replace('hasdep="0"', 'hasdep="1"')
            out.append((f"move hasdep {where}", "\n".join(edited) + "\n"))
    return out


@pytest.mark.parametrize(("algorithm", "n"), MUTATED)
def test_a_wait_is_released_by_a_later_hasdep_step_as_in_the_kernel(algorithm: str, n: int) -> None:
    """The kernel's wait ends at ``flag >= goal``, the flag set by hasdep steps only: a dependency on
    a step without hasdep is released by the next step of its tb that has it.  The prover proves
    such a file (with a warning) exactly when the independent numeric model, which releases waits
    the same way, finishes with the right sums; a wait that no step releases is refused."""
    text = msccl.lower(prove(synthesize(algorithm, n)))
    warned = refused = 0
    for name, mutant in hasdep_mutants(text):
        numeric = [run_numeric(mutant, seed) for seed in range(3)]
        try:
            proof = msccl.prove(mutant)
        except MscclVerificationError as e:
            refused += 1
            assert e.violation.kind in ("structure", "deadlock"), (name, e.violation)
            assert all(not finished for finished, _ in numeric), (name, e.violation)
            continue
        assert numeric == [(True, True)] * 3, name
        warned += bool(proof.warnings)
        assert all('lacks hasdep="1": released late, when tb' in w for w in proof.warnings), proof.warnings
    assert warned and refused


def test_dropping_a_copy_back_leaves_a_chunk_never_written() -> None:
    text = msccl.lower(prove(synthesize("direct", 3)))
    index, gpu, tb, _ = [s for s in step_lines(text) if s[3].group(2) == "cpy"][-1]
    first = index
    while 'type="nop"' in text.splitlines()[first - 1]:
        first -= 1
    violation = rejected(drop(text, first, index, gpu, tb))
    assert (
        violation.message
        == "final state: gpu 2 chunk 0 lacks the contributions of gpus [0, 1] (never written)"
    )
    assert (violation.gpu, violation.tb, violation.step, violation.chunk) == (2, None, None, 0)


@pytest.mark.parametrize(
    ("name", "alike"), [("fused_re_orders_apart", False), ("fused_re_orders_alike", True)]
)
def test_fused_re_steps_add_their_sources_to_dst_in_turn_as_the_kernel_does(name: str, alike: bool) -> None:
    """The executor fuses consecutive ``re`` steps into one and adds each source to the
    destination in turn, ((dst + s0) + s1); the model added the sources first, dst + (s0 + s1), so
    it missed GPUs that group a sum apart (here: GPU 0 fuses, GPUs 1 and 2 do not) and warned of
    GPUs that group it alike.  Both files are correct; the independent model, which runs the steps
    one by one, tells which."""
    text = fixture(name)
    assert all(run_orders(text, seed) == (True, alike) for seed in range(3))
    warnings = msccl.prove(text).warnings
    if alike:
        assert warnings == ()
    else:
        assert warnings == (
            "gpus 0 and 1 end with chunk 0 added in different orders (2 + (0 + 1) and 0 + (1 + 2)): in "
            "floating point their results differ in the last bits, and replicas drift apart",
        )
