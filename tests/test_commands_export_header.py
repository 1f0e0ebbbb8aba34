"""``export`` refuses a schedule too large for the format by the sizes its header declares, before
the phases are parsed (:func:`stragglar.formats.schedule_json.header`), with the message and exit
code of the refusal after the whole file is read; a header that does not tell the sizes leaves the
file to be read whole, and its errors are the whole reading's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_results import one_error, run

from stragglar.formats import schedule_json
from stragglar.formats.schedule_json import Header, header
from stragglar.synth import synthesize

TOO_MANY = "Error: 256 GPUs: stragglar writes MSCCL XML for at most 128"
HEAD = (
    '{"format": "stragglar-schedule", "version": 1, "collective": "allreduce", "algorithm": "ring", '
    '"num_ranks": 256, "num_chunks": 256, "straggler": null, '
)


def export_xml(path: Path) -> str:
    return one_error(run("export", str(path), "-o", str(path.with_suffix(".xml"))), 2)


def test_a_header_too_large_is_refused_before_the_phases_are_parsed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 1024-GPU file took 4.6 s and 773 MB to refuse: it was parsed and built first."""
    path = tmp_path / "big.json"
    schedule_json.write(synthesize("ring", 256), path)

    def never(text: object) -> None:
        raise AssertionError("parsed before the refusal")

    monkeypatch.setattr(schedule_json, "parse", never)
    assert export_xml(path).startswith(TOO_MANY)


def test_phases_that_are_not_json_are_not_read_after_a_header_too_large(tmp_path: Path) -> None:
    """No phases would make 256 GPUs fit: the refusal says what to change, as it does for good ones."""
    path = tmp_path / "big.json"
    path.write_text(HEAD + '"phases": [[{"src": oops', encoding="utf-8")
    assert export_xml(path).startswith(TOO_MANY)


@pytest.mark.parametrize(
    ("head", "message"),
    [
        (HEAD.replace("256,", '"256",', 1), "not JSON"),  # a bad header: the reading names the first error
        (HEAD.replace('"version": 1', '"version": 2'), "not JSON"),
        (HEAD + '"num_ranks": 4, ', "not JSON"),  # a key twice
        ('{"phases": [], ' + HEAD[1:], "not JSON"),  # the sizes after the phases
    ],
)
def test_a_header_that_does_not_tell_the_sizes_leaves_the_errors_to_the_whole_reading(
    tmp_path: Path, head: str, message: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(head + '"phases": [oops', encoding="utf-8")
    assert f"{path}: {message}" in export_xml(path)


def test_sizes_after_the_phases_are_refused_once_the_file_is_read(tmp_path: Path) -> None:
    document = schedule_json.to_document(synthesize("ring", 256))
    path = tmp_path / "big.json"
    path.write_text(json.dumps({"phases": document.pop("phases"), **document}), encoding="utf-8")
    assert header(path.read_text(encoding="utf-8")) is None
    assert export_xml(path).startswith(TOO_MANY)


def test_header_reads_the_keys_before_the_first_array_or_object() -> None:
    assert header(" \n" + HEAD.replace(", ", ",\r\n\t") + '"phases": [oops') == Header(256, 256, None)
    assert header(HEAD.replace('"straggler": null', '"straggler": 3') + '"metadata": {"phases": 1}}') == (
        Header(256, 256, 3)
    )


@pytest.mark.parametrize(
    "text",
    [
        "",
        "[]",
        "<algo/>",
        '{"gpus": []}',
        HEAD + '"bogus',  # a key that does not end
        HEAD.replace("null", "NaN"),
        HEAD.replace("null", "1" * 5000),  # past Python's digits
        HEAD.replace("256,", "256.0,", 1),
        HEAD.replace("256,", "4096,", 1),  # past stragglar's limit: the reading names it
        HEAD.replace('"allreduce"', '"allgather"'),
        HEAD.replace('"ring"', '""'),
        HEAD.replace('"format": "stragglar-schedule", ', ""),
        HEAD.replace(', "straggler": null', ""),
        HEAD.replace('"straggler": null', '"straggler": 256'),
        HEAD.replace('"straggler": null, ', '"straggler": []'),
        HEAD.replace('"algorithm"', '"bogus"'),  # an unknown key before the sizes ends the header
        HEAD.replace('"version": 1', '"version" 1'),
        HEAD.replace('"collective": "allreduce", ', ""),  # every header key, not the sizes alone
        HEAD + '"bogus": 1, ',  # an unknown key after the sizes
        HEAD.replace('"ring"', '"\\ud800"'),  # an escape: parse()'s own checks name half a surrogate
    ],
)
def test_header_is_none_where_the_keys_before_the_phases_do_not_tell_good_sizes(text: str) -> None:
    assert header(text + '"phases": []}') is None


@pytest.mark.parametrize(
    ("head", "message"),
    [
        (HEAD.replace('"ring"', '"\\ud800"'), "not valid Unicode: the string '\\\\ud800' has half of a"),
        (HEAD.replace('"collective": "allreduce", ', ""), "collective: missing required key"),
        (HEAD + '"bogus": 1, ', "bogus: unknown key"),
    ],
)
def test_a_header_the_whole_reading_refuses_is_refused_as_it_refuses_it(
    tmp_path: Path, head: str, message: str
) -> None:
    """Its sizes too large were refused first (an export's review): a header that the reading
    would refuse is the reading's to name, whatever its sizes."""
    path = tmp_path / "bad.json"
    path.write_text(head + '"phases": []}', encoding="utf-8")
    assert message in export_xml(path)
