"""MSCCL XML export: every algorithm's file is proved from its text, has the executor's shape,
is deterministic, fits the limits or fails with a one-line reason, and computes the right sums
when run by an independent numeric model of the executor under random interleavings."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from msccl_model import run_numeric, run_orders

from stragglar import msccl
from stragglar.errors import ArgumentError
from stragglar.formats import schedule_json as json_format
from stragglar.msccl import (
    DEFAULT_MAX_BYTES,
    DEFAULT_SCRATCH_MAX_BYTES,
    MscclExportError,
    XmlOptions,
    check_request,
    write_msccl,
)
from stragglar.msccl.lowering import threadblocks as msccl_threadblocks
from stragglar.release import schedule_files, write_schedule_files
from stragglar.schedule import Op, Phase, Schedule, Transfer
from stragglar.synth import ALGORITHMS, synthesize
from stragglar.verify import VerificationError, prove

SIZES = range(2, 17)
ALGO_ATTRS = [
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
]
STEP_ATTRS = ["s", "type", "srcbuf", "srcoff", "dstbuf", "dstoff", "cnt", "depid", "deps", "hasdep"]


def cases() -> list[tuple[str, int]]:
    return [(a, n) for a in ALGORITHMS for n in SIZES if a != "rhd" or n & (n - 1) == 0]


def xml_of(schedule: Schedule, **options: Any) -> str:
    """The exporter's text for ``schedule``, which is proved first: only proofs are exported."""
    return msccl.lower(prove(schedule), XmlOptions(**options))


# ---------------------------------------------------------------------------- tests


@pytest.mark.parametrize(("algorithm", "n"), cases())
def test_every_algorithm_exports_a_proved_file(algorithm: str, n: int) -> None:
    xml = xml_of(synthesize(algorithm, n))
    proof = msccl.prove(xml)
    assert proof.gpus == n and proof.proto == "Simple" and proof.capacity == 2
    assert proof.summary.startswith(f"proved: {algorithm}-n{n}")
    assert proof.warnings == ()  # nothing run otherwise than written; every GPU adds alike


@pytest.mark.parametrize(
    ("algorithm", "n", "straggler", "proto", "instances"),
    [
        ("stragglar", 8, None, "LL", 2),
        ("stragglar", 6, 2, "LL128", 4),
        ("stragglar", 5, 0, "Simple", 3),
        ("ring", 6, None, "LL128", 3),
        ("rhd", 8, None, "Simple", 2),
        ("direct", 5, 1, "LL", 2),
    ],
)
def test_instances_protocols_and_stragglers(
    algorithm: str, n: int, straggler: int | None, proto: str, instances: int
) -> None:
    schedule = synthesize(algorithm, n, straggler)
    xml = xml_of(schedule, proto=proto, instances=instances)
    proof = msccl.prove(xml)
    assert proof.chunks == schedule.num_chunks * instances
    assert proof.proto == proto and proof.capacity == (2 if proto == "Simple" else 8)
    assert proof.channels >= instances  # each instance has its own connections
    assert proof.warnings == ()


@pytest.mark.parametrize(
    ("algorithm", "n"), [("stragglar", 4), ("stragglar", 7), ("ring", 5), ("rhd", 8), ("direct", 6)]
)
@pytest.mark.parametrize("proto", ["Simple", "LL"])
def test_independent_numeric_run_agrees(algorithm: str, n: int, proto: str) -> None:
    xml = xml_of(synthesize(algorithm, n), proto=proto, instances=2)
    for seed in range(3):
        assert run_numeric(xml, seed) == (True, True)
        assert run_orders(xml, seed) == (True, True)  # every GPU adds each chunk alike: the same bits


def test_the_order_model_tells_a_file_whose_gpus_add_a_chunk_in_different_orders() -> None:
    """The schedule of test_verify_orders that groups one sum two ways, lowered: correct, and its
    GPUs' float results differ, which the model of orders sees."""
    from test_verify_orders import GROUPED_TWO_WAYS

    xml = xml_of(GROUPED_TWO_WAYS)
    assert run_numeric(xml, 0) == (True, True) and run_orders(xml, 0) == (True, False)


def test_the_prover_warns_of_a_file_whose_gpus_add_a_chunk_in_different_orders() -> None:
    """The model's finding above, from the prover: proved (exact arithmetic), with the schedule's
    own warning naming GPUs; chunked and as two instances it is the same file's sum."""
    from test_verify_orders import GROUPED_TWO_WAYS, SAID

    said = SAID.replace("ranks 0 and 1", "gpus 0 and 1")
    assert msccl.prove(xml_of(GROUPED_TWO_WAYS)).warnings == (said,)
    for proto in ("Simple", "LL"):
        proof = msccl.prove(xml_of(GROUPED_TWO_WAYS, proto=proto, instances=2))
        assert proof.warnings == (said,), proto


def test_numeric_model_rejects_a_broken_file() -> None:
    """The model is a real check: it catches a deadlock and a wrong sum."""
    fixtures = Path(__file__).parent / "fixtures" / "msccl"
    assert run_numeric((fixtures / "send_cycle.xml").read_text(), 0)[0] is False
    assert run_numeric((fixtures / "double_count.xml").read_text(), 0) == (True, False)


def test_straggler_exchange_is_send_then_in_place_rrc() -> None:
    xml = xml_of(synthesize("stragglar", 4))
    root = ET.fromstring(xml)
    gpu0 = root.find("gpu[@id='0']")
    assert gpu0 is not None and gpu0.get("s_chunks") == "0"
    to_straggler = gpu0.find("tb[@send='3']")
    from_straggler = gpu0.find("tb[@recv='3']")
    assert to_straggler is not None and from_straggler is not None
    send = to_straggler.find("step[@srcoff='0']")
    rrc = from_straggler.find("step[@type='rrc']")
    assert send is not None and rrc is not None
    assert (rrc.get("srcbuf"), rrc.get("srcoff"), rrc.get("dstbuf"), rrc.get("dstoff")) == (
        "i",
        "0",
        "i",
        "0",
    )
    assert (rrc.get("depid"), rrc.get("deps")) == (to_straggler.get("id"), send.get("s"))
    assert send.get("hasdep") == "1"


def test_multi_chunk_exchange_goes_through_scratch() -> None:
    """direct exchanges all chunks in one cnt=N-1 step each way: received into scratch, copied back."""
    xml = xml_of(synthesize("direct", 5))
    root = ET.fromstring(xml)
    straggler = root.find("gpu[@id='4']")
    assert straggler is not None and straggler.get("s_chunks") == "4"
    rrc = straggler.find("tb[@recv='0']/step[@type='rrc']")
    assert rrc is not None and (rrc.get("srcbuf"), rrc.get("dstbuf"), rrc.get("cnt")) == ("i", "s", "4")
    copy = straggler.find("tb[@send='-1'][@recv='-1']/step[@type='cpy']")
    assert copy is not None and (copy.get("srcbuf"), copy.get("dstbuf"), copy.get("cnt")) == ("s", "i", "4")
    msccl.prove(xml)


def test_text_shape() -> None:
    xml = xml_of(
        synthesize("stragglar", 6), name="sa6", proto="LL", instances=2, min_bytes=4096, max_bytes=1 << 30
    )
    assert xml.endswith("</algo>\n") and "\t" not in xml and "'" not in xml and "<?xml" not in xml
    lines = xml.splitlines()
    assert re.findall(r'(\w+)="', lines[0]) == ALGO_ATTRS
    assert lines[0] == (
        '<algo name="sa6" proto="LL" nchannels="2" nchunksperloop="10" ngpus="6" coll="allreduce" '
        'inplace="1" outofplace="0" minBytes="4096" maxBytes="1073741824">'
    )
    shapes = {
        "  <gpu": r'  <gpu id="\d+" i_chunks="10" o_chunks="0" s_chunks="\d+">',
        "    <tb": r'    <tb id="\d+" send="-?\d+" recv="-?\d+" chan="\d+">',
        "      <step": "      <step " + " ".join(f'{k}="[-\\w]+"' for k in STEP_ATTRS) + "/>",
    }
    for line in lines[1:-1]:
        pattern = next((p for prefix, p in shapes.items() if line.startswith(prefix)), None)
        assert pattern is not None or line in ("  </gpu>", "    </tb>"), line
        assert pattern is None or re.fullmatch(pattern, line), line
    assert ET.fromstring(xml).get("maxBytes") == "1073741824"


def test_defaults() -> None:
    root = ET.fromstring(xml_of(synthesize("ring", 3)))
    assert root.get("name") == "ring-n3-simple" and root.get("maxBytes") == str(DEFAULT_MAX_BYTES)
    assert (root.get("minBytes"), root.get("inplace"), root.get("outofplace")) == ("0", "1", "0")


def test_a_file_with_scratch_defaults_to_a_largest_size_the_older_runtime_can_reserve_for() -> None:
    """microsoft/msccl reserves maxBytes x s_chunks / nchunksperloop of GPU memory as it loads a
    file: Direct's (scratch 7 of 7 chunks at N = 8) wrote maxBytes 1 TiB, a 1 TiB reserve that
    fails every communicator's start.  Its default is 1 GiB; asked for more than any GPU holds, the
    exporter refuses, and the reader warns of such a file."""
    direct = synthesize("direct", 8)
    xml = xml_of(direct)
    root = ET.fromstring(xml)
    assert root.get("maxBytes") == str(DEFAULT_SCRATCH_MAX_BYTES) == str(1 << 30)
    assert max(int(gpu.get("s_chunks", "0")) for gpu in root) == 7  # it does need scratch
    assert msccl.prove(xml).warnings == ()
    assert ET.fromstring(xml_of(direct, max_bytes=1 << 36)).get("maxBytes") == str(1 << 36)
    with pytest.raises(MscclExportError, match=r"reserves maxBytes x 7/7 = 1 TiB of scratch"):
        xml_of(direct, max_bytes=1 << 40)
    with pytest.raises(MscclExportError, match="not below the default largest of a file with scratch, 1 GiB"):
        xml_of(direct, min_bytes=1 << 31)
    assert ET.fromstring(xml_of(direct, min_bytes=1 << 31, max_bytes=1 << 32)).get("minBytes") == str(1 << 31)
    huge = xml.replace(f'maxBytes="{1 << 30}"', f'maxBytes="{1 << 40}"')
    (warning,) = msccl.prove(huge).warnings
    assert warning == (
        "line 1: maxBytes 1099511627776 with s_chunks 7 of nchunksperloop 7: microsoft/msccl reserves "
        "maxBytes x 7/7 = 1 TiB of scratch on a GPU as it loads the file: more than any GPU holds (the "
        "Azure executor sizes scratch per call)"
    )


def test_deterministic_and_json_round_trip() -> None:
    schedule = synthesize("stragglar", 10)
    first = xml_of(schedule, instances=2)
    assert xml_of(synthesize("stragglar", 10), instances=2) == first
    assert xml_of(json_format.loads(json_format.dumps(schedule)), instances=2) == first


def test_long_fifos_continue_on_more_channels() -> None:
    xml = xml_of(synthesize("ring", 40))  # 78 steps between neighbours: over the 64-step limit
    root = ET.fromstring(xml)
    assert root.get("nchannels") == "2"
    assert max(len(tb.findall("step")) for tb in root.iter("tb")) <= 64
    msccl.prove(xml)


def test_write_msccl(tmp_path: Path) -> None:
    schedule = synthesize("rhd", 4)
    write_msccl(prove(schedule), tmp_path / "x.xml", proto="LL128")
    assert (tmp_path / "x.xml").read_text() == xml_of(schedule, proto="LL128")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"proto": "ll"}, "proto 'll': choose from Simple, LL, LL128"),
        ({"instances": 0}, "instances must be an integer >= 1, got 0"),
        ({"name": 'a"b'}, "name 'a\"b': use 1-128 characters"),
        (
            {"min_bytes": 10, "max_bytes": 5},
            "minBytes 10 / maxBytes 5: no message size selects the algorithm: give a smallest message",
        ),
        (
            {"min_bytes": 5, "max_bytes": 5},
            "minBytes = maxBytes = 5: one size to the Azure executor, none to microsoft/msccl",
        ),
        (
            {"max_bytes": 0},
            "maxBytes 0 is no limit to the Azure executor, never selected by microsoft/msccl (minBytes <= "
            "size < maxBytes): give a smallest message size below the largest (default 1 TiB, 1 GiB for "
            "a file with scratch)",
        ),
        ({"max_bytes": -1}, "max_bytes must be an integer in [0, 2**63), got -1"),
        ({"proto": None}, "proto None: choose from Simple, LL, LL128"),  # was a raw AttributeError
        ({"name": 3}, "name 3: use 1-128 characters"),
    ],
)
def test_bad_options(options: dict[str, object], message: str) -> None:
    with pytest.raises(MscclExportError, match=re.escape(message)):
        xml_of(synthesize("ring", 3), **options)


def test_numpy_integers_are_counts_like_ints() -> None:
    """As everywhere in the API (stragglar.args): a count may be any integral type."""
    schedule = synthesize("stragglar", 4)
    numpy = {"instances": np.int64(2), "min_bytes": np.int32(0), "max_bytes": np.uint64(1 << 30)}
    assert xml_of(schedule, **numpy) == xml_of(schedule, instances=2, min_bytes=0, max_bytes=1 << 30)


@pytest.mark.parametrize("label", ["instances", "min_bytes", "max_bytes"])
@pytest.mark.parametrize(("value", "kind"), [(True, "bool"), (2.0, "float"), ("2", "str")])
def test_counts_of_other_types_are_refused(label: str, value: object, kind: str) -> None:
    with pytest.raises(ArgumentError) as e:
        xml_of(synthesize("ring", 3), **{label: value})
    assert str(e.value) == f"{label} must be an integer, got {value!r} ({kind})"


def test_incorrect_schedule_is_not_exported() -> None:
    half = Schedule("bad", 2, 1, None, (Phase("p", (0, 1), ((Transfer(0, 1, 0, Op.REDUCE),),)),))
    with pytest.raises(VerificationError, match="final state: rank 0"):
        xml_of(half)  # it never gets a Proof, and the exporter takes nothing else
    with pytest.raises(TypeError, match="prove the schedule first"):
        msccl.lower(half)  # type: ignore[arg-type]


def test_dependency_target_limit() -> None:
    with pytest.raises(MscclExportError) as e:
        xml_of(synthesize("stragglar", 17), instances=8)
    assert str(e.value) == (
        "gpu 16 needs 136 thread blocks that others wait on, but dependency targets must have ids <= 127: "
        "use fewer instances or a smaller N"
    )
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(("n", "instances"), [(44, 3), (4, 43), (33, 4), (65, 2), (42, 3)])
def test_stragglar_past_128_waited_on_blocks_is_refused_early_only_where_the_lowering_refuses(
    n: int, instances: int
) -> None:
    """The command refuses ``N x instances > 128`` before making the schedule (it refused only
    ``(N - 1) x instances``, so 65 GPUs with 2 instances took seconds of lowering to refuse); the
    lowering, which needs N x instances for N >= 3 and N + 1 for some (42 x 3: 129), refuses those
    and a few more."""
    early = n * instances > 128
    if early:
        with pytest.raises(
            MscclExportError, match=r"^StragglAR over \d+ GPUs with \d+ instances needs at least"
        ):
            check_request(n, n - 1, instances, "stragglar")
    else:
        check_request(n, n - 1, instances, "stragglar")
    with pytest.raises(MscclExportError):
        xml_of(synthesize("stragglar", n), instances=instances)


def test_the_largest_files_are_bounded_before_the_lowering() -> None:
    """Ring's file at N = 256 took 2 minutes to lower and prove, and grows as N^3."""
    with pytest.raises(MscclExportError, match=r"^129 GPUs: stragglar writes MSCCL XML for at most 128 "):
        xml_of(synthesize("ring", 129))
    with pytest.raises(MscclExportError, match=r"^8 GPUs x 2100 chunks x 1 instance: .* at most 16,384"):
        xml_of(synthesize("stragglar", 8, chunks=2100))
    check_request(128, 128)  # Ring at N = 128, the largest


def test_channel_limit() -> None:
    with pytest.raises(MscclExportError) as e:
        xml_of(synthesize("rhd", 2), instances=33)  # one FIFO per instance, each on its own channel
    assert str(e.value) == (
        "needs at least 33 channels, the executor allows 32: use fewer instances or a smaller N"
    )
    with pytest.raises(MscclExportError) as e:  # the count the file's channels came to
        msccl_threadblocks.number([], set(), {}, 2, 33)
    assert str(e.value) == "needs 33 channels, the executor allows 32: use fewer instances or a smaller N"


def test_parser_limits(monkeypatch: pytest.MonkeyPatch) -> None:
    """The executor's per-rank parser limits, lowered here so that a small file reaches them: those
    a split can only bring nearer are refused on the first assignment ("at least"), the rest once
    the file is laid out (StragglAR's gpu 0 has no nops at N = 8: its bound is its count)."""
    monkeypatch.setattr(msccl_threadblocks, "MAX_NODES", 40)
    with pytest.raises(MscclExportError) as e:
        xml_of(synthesize("stragglar", 8))
    assert str(e.value) == (
        "gpu 0's part of the file has at least 47 XML elements (algo, gpus, its tbs and steps), the "
        "executor's parser holds 39: use fewer instances or a smaller N"
    )
    monkeypatch.setattr(msccl_threadblocks, "MAX_NODES", 28)  # halving/doubling's nops pass it
    with pytest.raises(MscclExportError) as e:
        xml_of(synthesize("rhd", 8))
    assert str(e.value) == (
        "gpu 0's part of the file has 28 XML elements (algo, gpus, its tbs and steps), the executor's "
        "parser holds 27: use fewer instances or a smaller N"
    )
    monkeypatch.setattr(msccl_threadblocks, "MAX_NODES", 4096)
    monkeypatch.setattr(msccl_threadblocks, "MAX_TBS", 10)
    with pytest.raises(
        MscclExportError, match=r"^gpu 0 needs at least 11 thread blocks, the executor allows 10: use fewer"
    ):
        xml_of(synthesize("stragglar", 8))
    monkeypatch.setattr(msccl_threadblocks, "MAX_TBS", 4)  # Direct's copies back take a local TB
    with pytest.raises(MscclExportError, match=r"^gpu 0 needs 5 thread blocks, the executor allows 4: use"):
        xml_of(synthesize("direct", 3))


def test_limits_no_split_can_lower_are_refused_before_the_splits() -> None:
    """StragglAR over 4 GPUs with 4096 chunks has one step per operation past the parser's limit on
    the first assignment: refused then (it took 100 s of splits, and was then refused on its
    channels), while 1024 chunks, which fit, still lower."""
    with pytest.raises(MscclExportError, match=r"^gpu 0's part of the file has at least 13665 XML elements"):
        xml_of(synthesize("stragglar", 4, chunks=4096))
    with pytest.raises(MscclExportError, match=r"^gpu 0's part of the file has at least 6838 XML elements"):
        xml_of(synthesize("stragglar", 4, chunks=2048))


def test_release_files(tmp_path: Path) -> None:
    bundle = schedule_files("stragglar", 6, proto="LL")
    assert sorted(bundle.files) == [
        "json/stragglar-n6-s5.json",
        "msccl/stragglar-n6-s5-ll.xml",
        "mscclpp/stragglar-n6-s5-mscclpp.json",
    ]
    assert (bundle.rounds, bundle.lower_bound, bundle.proto) == (7, 7, "LL")
    assert bundle.proofs[0].startswith("proved: allreduce over 6 ranks")
    assert bundle.proofs[1].startswith("proved: stragglar-n6-s5-ll:")
    assert bundle.proofs[2].startswith("proved: stragglar-n6-s5: in-place allreduce over 6 GPUs")
    paths = write_schedule_files(tmp_path / "out", bundle)
    assert [str(p.relative_to(tmp_path / "out")) for p in paths] == sorted(bundle.files)
    assert schedule_files("stragglar", 6, proto="LL") == bundle
    for path in paths:
        assert path.read_text() == bundle.files[str(path.relative_to(tmp_path / "out"))]


@pytest.mark.parametrize(
    ("algorithm", "n"), [("stragglar", 32), ("stragglar", 64), ("ring", 64), ("direct", 48)]
)
def test_large_files_are_proved(algorithm: str, n: int) -> None:
    assert msccl.prove(xml_of(synthesize(algorithm, n))).gpus == n


@pytest.mark.slow
@pytest.mark.parametrize(
    ("algorithm", "n", "instances"), [("stragglar", 128, 1), ("stragglar", 64, 2), ("ring", 128, 1)]
)
def test_largest_files_are_proved(algorithm: str, n: int, instances: int) -> None:
    assert msccl.prove(xml_of(synthesize(algorithm, n), instances=instances)).gpus == n
