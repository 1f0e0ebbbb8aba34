"""The registry of artifact formats: every format round-trips through its own tools, its suffixes
and options are what the command line uses, and the two provers report in one vocabulary."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from click.testing import CliRunner

from stragglar import msccl, mscclpp
from stragglar.artifacts import FORMATS, MSCCL, MSCCLPP, ArtifactFormat, ExportOptions, format_of
from stragglar.cli import cli
from stragglar.commands.proofs import proved_artifact, read_artifact
from stragglar.commands.schedules import SUFFIXES, output_format
from stragglar.errors import ArgumentError, IncorrectError, InputError
from stragglar.formats import schedule_json as json_format
from stragglar.proof_tier import ProofRow, format_row
from stragglar.synth import synthesize
from stragglar.verify import Proof, prove
from stragglar.verify.report import ArtifactProof

EXPORT_OPTIONS = tuple(option.name for option in dataclasses.fields(ExportOptions))
# One value other than the default for each export option, as the API and as the command line take it.
SET: dict[str, Any] = {
    "name": "x4",
    "proto": "LL",
    "instances": 2,
    "min_bytes": 16,
    "max_bytes": 1 << 20,
    "max_threadblocks": 64,
}
FLAGS = {
    "name": ["--name", "x4"],
    "proto": ["--proto", "LL"],
    "instances": ["--instances", "2"],
    "min_bytes": ["--min-bytes", "16"],
    "max_bytes": ["--max-bytes", "1MiB"],
    "max_threadblocks": ["--max-threadblocks", "64"],
}
PROOF = prove(synthesize("stragglar", 4))


def without_first_put(text: str) -> str:
    """The plan with its first put removed: a GPU waits for data nobody sends."""
    plan = json.loads(text)
    ops = plan["gpus"][0]["threadblocks"][0]["ops"]
    ops.remove(next(op for op in ops if op["name"] == "put"))
    return json.dumps(plan)


def no_json() -> object:
    raise AssertionError("a format that needs no JSON asked for it")


def recognised(text: str) -> ArtifactFormat[Any] | None:
    return format_of(text, lambda: json_format.parse(text))


def test_the_registry_lists_msccl_then_mscclpp_by_name() -> None:
    assert list(FORMATS) == ["msccl", "mscclpp"]
    assert (FORMATS["msccl"], FORMATS["mscclpp"]) == (MSCCL, MSCCLPP)
    assert all(name == fmt.name for name, fmt in FORMATS.items())


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS)
def test_every_format_round_trips(fmt: ArtifactFormat[Any]) -> None:
    """Lowered, the text is recognised as the format, read, proved, described and (where the
    executor picks files by size) sized, by the text or by what ``read`` made of it alike."""
    text = fmt.lower(PROOF)
    assert recognised(text) is fmt
    document = fmt.read(text)
    proof = fmt.prove(document)
    assert isinstance(proof, ArtifactProof)
    assert (proof.gpus, proof.chunks) == (4, 3) and proof.threadblocks >= 4 and proof.seconds >= 0
    assert proof.summary == fmt.prove(text).summary
    assert proof.summary.startswith(f"proved: {proof.name}: in-place allreduce over 4 GPUs, 3 chunks")
    assert proof.brief in proof.summary and proof.details
    assert fmt.describe(document) == fmt.describe(text)
    assert fmt.describe(text).startswith(proof.name)
    if fmt.size_rule is not None:
        assert fmt.size_rule(document) == fmt.size_rule(text)
        assert fmt.size_rule(document).decide(16 * 3).used


@pytest.mark.parametrize("package", [msccl, mscclpp], ids=["msccl", "mscclpp"])
def test_both_packages_offer_the_same_verbs_in_the_same_shape(package: ModuleType) -> None:
    """``lower(proof, options=None)``, then ``read``, ``prove`` and ``describe`` of a ``source``,
    the text or what ``read`` made of it (more options keyword-only): the registry's tools are
    the packages' own."""
    assert {"lower", "read", "prove", "describe"} <= set(package.__all__)
    lower = inspect.signature(package.lower).parameters
    assert list(lower) == ["proof", "options"] and lower["options"].default is None
    for verb in ("read", "prove", "describe"):
        first, *more = inspect.signature(getattr(package, verb)).parameters.values()
        assert first.name == "source" and first.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, verb
        assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in more), verb
    lowered = package.lower(PROOF)
    text = lowered if isinstance(lowered, str) else lowered.text
    document = package.read(text)
    assert package.read(document) is document
    assert package.prove(document).summary == package.prove(text).summary
    assert package.describe(document) == package.describe(text)
    fmt = FORMATS[package.__name__.rsplit(".", 1)[-1]]
    assert (fmt.read, fmt.prove, fmt.describe) == (package.read, package.prove, package.describe)
    assert fmt.lower(PROOF) == text


def warned(old: str, new: str) -> Any:
    """The warning an old name gives when called: stragglar's ``old`` deprecated, ``new`` to use."""
    return pytest.warns(
        DeprecationWarning, match=rf"^stragglar\.{re.escape(old)} is deprecated: use stragglar\.{new}$"
    )


def test_the_older_names_do_what_the_verbs_do_and_warn_naming_them() -> None:
    xml, plan = msccl.lower(PROOF), mscclpp.lower(PROOF).text
    with warned("msccl.prove_msccl", r"msccl\.prove"):
        assert msccl.prove_msccl(xml).summary == msccl.prove(xml).summary
    with warned("msccl.describe_msccl", r"msccl\.describe"):
        assert msccl.describe_msccl(xml) == msccl.describe(xml)
    with warned("mscclpp.prove_plan", r"mscclpp\.prove"):
        assert mscclpp.prove_plan(plan).summary == mscclpp.prove(plan).summary
    with warned("mscclpp.plan_document", r"mscclpp\.read"):
        assert mscclpp.plan_document(plan).root == mscclpp.read(plan).root
    options: dict[str, Any] = {
        "name": "x",
        "proto": "LL",
        "instances": 2,
        "min_bytes": 16,
        "max_bytes": 1 << 20,
    }
    with warned("msccl.to_msccl_xml", r"msccl\.lower\(proof, XmlOptions\(\*\*options\)\)"):
        assert msccl.to_msccl_xml(PROOF, **options) == msccl.lower(PROOF, msccl.XmlOptions(**options))


def test_a_json_schedule_is_no_artifact_and_xml_is_not_parsed_as_json() -> None:
    assert recognised(json_format.dumps(PROOF.schedule)) is None
    assert format_of(MSCCL.lower(PROOF), no_json) is MSCCL


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS)
def test_suffixes_map_back_to_the_format(fmt: ArtifactFormat[Any]) -> None:
    for suffix in fmt.suffixes:
        assert fmt.name in SUFFIXES[suffix]
        assert output_format(Path(f"out{suffix}"), fmt.name, "text", ("json", "text", *FORMATS)) == fmt.name
    assert fmt.file_name(PROOF.schedule, ExportOptions()).endswith(fmt.suffixes[0])


def test_a_suffix_names_the_format_that_writes_it_by_default() -> None:
    assert output_format(Path("x.xml"), None, "text", ("json", "text", *FORMATS)) == "msccl"
    assert output_format(Path("x.json"), None, "text", ("json", "text", *FORMATS)) == "json"


def test_every_export_option_shapes_some_format() -> None:
    assert set().union(*(fmt.options for fmt in FORMATS.values())) == set(EXPORT_OPTIONS)
    assert set(SET) == set(FLAGS) == set(EXPORT_OPTIONS)


@pytest.mark.parametrize("option", EXPORT_OPTIONS)
@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS)
def test_lower_takes_its_options_and_refuses_the_others(fmt: ArtifactFormat[Any], option: str) -> None:
    options = ExportOptions(**{option: SET[option]})
    if option in fmt.options:  # it changes the text, but for a bound the text is within
        assert (fmt.lower(PROOF, options) != fmt.lower(PROOF)) == (option != "max_threadblocks")
    else:
        with pytest.raises(InputError, match=re.escape(f"{option} does not shape {fmt.title}: it shapes ")):
            fmt.lower(PROOF, options)


@pytest.mark.parametrize("option", EXPORT_OPTIONS)
@pytest.mark.parametrize("output", ["json", "text", *FORMATS])
def test_the_command_refuses_exactly_the_options_that_do_not_shape_its_output(
    output: str, option: str
) -> None:
    result = CliRunner().invoke(cli, ["synth", "--gpus", "4", "--format", output, *FLAGS[option]])
    takes = output in FORMATS and option in FORMATS[output].options
    if takes:
        assert result.exit_code == 0, result.output
    else:
        shaped = " and ".join(f.title for f in FORMATS.values() if option in f.options)
        assert result.exit_code == 2
        assert result.stderr == f"Error: {FLAGS[option][0]} does not apply: it shapes {shaped} output only\n"


def test_export_options_default_to_each_formats_own_defaults() -> None:
    assert MSCCL.lower(PROOF, ExportOptions()) == MSCCL.lower(PROOF)
    assert json.loads(MSCCLPP.lower(PROOF))["max_message_size"] > 0


@pytest.mark.parametrize(
    ("fmt", "text", "error", "message"),
    [
        (
            MSCCL,
            "<algo/>",
            InputError,
            "f.xml is not valid MSCCL XML: line 1: <algo> lacks attributes name, proto, coll,",
        ),
        (
            MSCCLPP,
            "[1]",
            InputError,
            "f.json is not a plan stragglar can prove: not an MSCCL++ execution plan",
        ),
        (MSCCLPP, '{"gpus": 2}', InputError, "f.json is not a plan stragglar can prove: plan: missing key"),
    ],
)
def test_a_file_the_prover_cannot_read_is_bad_input_in_the_formats_words(
    fmt: ArtifactFormat[Any], text: str, error: type[Exception], message: str
) -> None:
    name = f"f{fmt.suffixes[0]}"
    with pytest.raises(error) as info:
        proved_artifact(fmt, text, name)
    assert str(info.value).startswith(message)
    if fmt.read is not MSCCL.read:
        with pytest.raises(error) as read_info:
            proved_artifact(fmt, read_artifact(fmt, text, name), name)
        assert str(read_info.value) == str(info.value)


@pytest.mark.parametrize(
    ("fmt", "spoil"),
    [
        (MSCCL, lambda text: text.replace('type="rrc"', 'type="r"', 1)),
        (MSCCLPP, without_first_put),
    ],
    ids=FORMATS,
)
def test_a_wrong_artifact_is_incorrect_whatever_its_format(
    fmt: ArtifactFormat[Any], spoil: Callable[[str], str]
) -> None:
    text = spoil(fmt.lower(PROOF))
    assert text != fmt.lower(PROOF)
    with pytest.raises(IncorrectError, match=r"^f is not a correct AllReduce: "):
        proved_artifact(fmt, text, "f")


@pytest.mark.parametrize("fmt", FORMATS.values(), ids=FORMATS)
def test_a_proof_is_a_row_of_the_proof_tier(fmt: ArtifactFormat[Any]) -> None:
    proof = fmt.prove(fmt.lower(PROOF))
    row = ProofRow.for_artifact(proof, fmt.name, "f")
    assert (row.algorithm, row.num_ranks, row.method, row.seconds) == (proof.name, 4, fmt.name, proof.seconds)
    assert format_row(row).split()[2:4] == ["-", "-"]


def test_the_artifact_proof_is_a_contract_not_a_proof() -> None:
    with pytest.raises(TypeError, match="abstract"):
        ArtifactProof("x", 2, 1, 2, 0.0)  # type: ignore[abstract]
    assert not isinstance(MSCCL.prove(MSCCL.lower(PROOF)), Proof)


def never(*args: object, **kwargs: object) -> None:
    raise AssertionError(f"work was done before the refusal: {args}")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (  # the simplest reason first: N itself, as for every algorithm
            ["--gpus", "256", "-o", "x.xml"],
            "256 GPUs: stragglar writes MSCCL XML for at most 128 (StragglAR stops there, and a file's "
            "lowering and proof grow as N^3)",
        ),
        (["--gpus", "2048", "--chunks", "2048", "-o", "x.xml"], "2048 GPUs: stragglar writes MSCCL XML for"),
        (["--gpus", "2048", "--chunks", "auto", "-o", "x.xml"], "2048 GPUs: stragglar writes MSCCL XML for"),
        (
            ["--gpus", "256", "-a", "ring", "-o", "x.xml"],
            "256 GPUs: stragglar writes MSCCL XML for at most 128",
        ),
        (
            ["--gpus", "64", "--instances", "4", "-o", "x.xml"],
            "StragglAR over 64 GPUs with 4 instances needs at least 256 thread blocks that others wait on",
        ),
        (
            ["--gpus", "8", "--chunks", "4096", "-o", "x.xml"],
            "8 GPUs x 4096 chunks x 1 instance: stragglar writes MSCCL XML of at most 16,384 (GPU, chunk)",
        ),
        (["--gpus", "128", "-a", "ring", "--instances", "2", "-o", "x.xml"], "128 GPUs x 128 chunks x 2"),
        (
            ["--gpus", "400", "--format", "mscclpp", "-o", "p.json"],
            "400 GPUs: stragglar writes MSCCL++ plans",
        ),
        (
            ["--gpus", "1000", "--format", "mscclpp"],
            "1000 GPUs: stragglar writes MSCCL++ plans for at most 192",
        ),
        (
            ["--gpus", "64", "--instances", "8", "--format", "mscclpp"],
            "StragglAR over 64 GPUs needs at least 16 thread blocks per GPU and instance (about 0.27 N), "
            "128 with 8 instances, more than the 108 one GPU runs at once",
        ),
        (
            ["--gpus", "16", "--max-threadblocks", "3", "--format", "mscclpp"],
            "use fewer GPUs (at most 15), or raise max_threadblocks",
        ),
        (["--gpus", "100", "--chunks", "400", "--format", "mscclpp"], "100 GPUs x 400 chunks x 1 instance"),
    ],
)
def test_synth_refuses_what_a_format_cannot_hold_before_making_the_schedule(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, args: list[str], message: str
) -> None:
    """256 GPUs to MSCCL XML were refused after 40-84 s of synthesis and lowering, 400 GPUs to an
    MSCCL++ plan ran out of memory after 166 s: each format's limits in N, chunks and the options
    are now checked before any schedule is made or any chunk count priced."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("stragglar.commands.schedules.generate", never)
    monkeypatch.setattr("stragglar.model.chunks.best_chunks", never)
    result = CliRunner().invoke(cli, ["synth", *args])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("Error: ") and message in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert not list(tmp_path.iterdir())


def test_chunks_auto_picks_a_count_the_format_takes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """At N = 100 the model's fastest power of two is 256 chunks, more (GPU, chunk) cells than MSCCL
    XML is written for: auto picks among the counts the file may have (128), not one it refuses."""
    assert MSCCL.max_chunks(100, ExportOptions()) == 163
    assert MSCCLPP.max_chunks(96, ExportOptions(instances=4)) == 96
    monkeypatch.chdir(tmp_path)
    lowered: list[int] = []

    class Chosen(Exception):
        """The first count auto asks the format to lower: the choice is all we need."""

    def lowering(proof: Proof, options: object = None) -> str:
        lowered.append(proof.num_chunks)
        raise Chosen

    monkeypatch.setattr("stragglar.msccl.lower", lowering)
    result = CliRunner().invoke(cli, ["synth", "--gpus", "100", "--chunks", "auto", "-o", "x.xml"])
    assert isinstance(result.exception, Chosen) and lowered == [128]


@pytest.mark.parametrize("fmt", [MSCCL, MSCCLPP])
def test_a_format_refuses_what_is_not_its_options_or_a_rank_count(fmt: ArtifactFormat[Any]) -> None:
    """A dict of options raised an AttributeError from inside (MSCCL XML's); 0 GPUs divided by zero."""
    proof = prove(synthesize("stragglar", 4))
    with pytest.raises(ArgumentError, match=r"^options must be a stragglar.artifacts.ExportOptions, got \{"):
        fmt.lower(proof, {"instances": 2})  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"^num_ranks must be at least 1, got 0$"):
        fmt.max_chunks(0, ExportOptions())
    assert fmt.max_chunks(4, ExportOptions()) == fmt.max_cells // 4


def test_the_older_names_pickle_as_themselves() -> None:
    """``functools.wraps`` gave each the new function's place, where pickle found another object."""
    import pickle

    from stragglar import verify

    for old in (
        verify.check,
        msccl.prove_msccl,
        msccl.to_msccl_xml,
        mscclpp.plan_document,
        mscclpp.prove_plan,
    ):
        assert pickle.loads(pickle.dumps(old)) is old
