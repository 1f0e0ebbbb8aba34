"""Bad JSON schedule documents and files, each refused with a one-line error that names the exact
place (``phases[0].rounds[2][1].chunk: ...``), and what of it the JSON Schema can express."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from cli_results import one_error, run
from schedule_documents import VALIDATOR, Mutation, at, stragglar4, valid_doc

from stragglar.formats.schedule_json import (
    MAX_IDLE_ROUNDS,
    ScheduleFormatError,
    dumps,
    from_document,
    loads,
    read,
    to_document,
)
from stragglar.schedule import Phase, Schedule, Transfer
from stragglar.synth import synthesize


def _set(*path: str | int, value: Any) -> Mutation:
    def mutate(doc: dict[str, Any]) -> None:
        at(doc, path[:-1])[path[-1]] = value

    return mutate


def _del(*path: str | int) -> Mutation:
    def mutate(doc: dict[str, Any]) -> None:
        del at(doc, path[:-1])[path[-1]]

    return mutate


T0 = ("phases", 0, "rounds", 1, 0)  # Transfer(1, 0, 2, REDUCE) in the hidden phase
T1 = ("phases", 1, "rounds", 2, 1)  # Transfer(3, 1, 0, COPY) in the exposed phase


# (mutation, exact message, whether JSON Schema can express the rule)
BAD_DOCUMENTS: list[tuple[Mutation, str, bool]] = [
    # missing and unknown keys
    (_del("num_chunks"), "num_chunks: missing required key", True),
    (_del("format"), "format: missing required key", True),
    (_del("phases", 1, "rounds"), "phases[1].rounds: missing required key", True),
    (_del(*T1, "op"), "phases[1].rounds[2][1].op: missing required key", True),
    (
        _set("extra", value=1),
        "extra: unknown key (allowed: format, version, collective, algorithm, "
        "num_ranks, num_chunks, straggler, phases, metadata)",
        True,
    ),
    (
        _set("phases", 0, "color", value="red"),
        "phases[0].color: unknown key (allowed: name, ranks, rounds)",
        True,
    ),
    (
        _set(*T0, "size", value=8),
        "phases[0].rounds[1][0].size: unknown key (allowed: src, dst, chunk, op)",
        True,
    ),
    (
        _set(*T0, "the key", value=8),
        'phases[0].rounds[1][0]["the key"]: unknown key (allowed: src, dst, chunk, op)',
        True,
    ),
    # wrong types
    (_set("num_ranks", value="4"), 'num_ranks: expected an integer >= 2, got "4"', True),
    (_set("phases", value={}), "phases: expected an array, got an object", True),
    (_set("phases", 1, value=[]), "phases[1]: expected an object, got an array", True),
    (_set("phases", 1, "rounds", 0, value=None), "phases[1].rounds[0]: expected an array, got null", True),
    (_set(*T1, value=5), "phases[1].rounds[2][1]: expected an object, got 5", True),
    (_set("phases", 0, "name", value=3), "phases[0].name: expected a string, got 3", True),
    (_set("phases", 0, "ranks", value="012"), 'phases[0].ranks: expected an array, got "012"', True),
    (_set("algorithm", value=""), 'algorithm: expected a non-empty string, got ""', True),
    (_set("algorithm", value=["ring"]), "algorithm: expected a non-empty string, got an array", True),
    (_set("metadata", value=[1]), "metadata: expected an object, got an array", True),
    (
        _set(*T0, "chunk", value=1.5),
        "phases[0].rounds[1][0].chunk: expected an integer in [0, 3), got 1.5",
        True,
    ),
    (
        _set(*T0, "chunk", value=1.0),
        "phases[0].rounds[1][0].chunk: expected an integer in [0, 3), got 1.0",
        False,
    ),
    # a bool is not an int
    (
        _set(*T0, "src", value=True),
        "phases[0].rounds[1][0].src: expected an integer in [0, 4), got true",
        True,
    ),
    (
        _set(*T1, "chunk", value=False),
        "phases[1].rounds[2][1].chunk: expected an integer in [0, 3), got false",
        True,
    ),
    (_set("num_chunks", value=True), "num_chunks: expected an integer >= 1, got true", True),
    (_set("straggler", value=False), "straggler: expected an integer in [0, 4), got false", True),
    (
        _set("phases", 0, "ranks", 0, value=False),
        "phases[0].ranks[0]: expected an integer in [0, 4), got false",
        True,
    ),
    (_set("version", value=True), "version: expected an integer, got true", True),
    # out of range
    (
        _set(*T0, "chunk", value=9),
        "phases[0].rounds[1][0].chunk: expected an integer in [0, 3), got 9",
        False,
    ),
    (
        _set(*T0, "chunk", value=-1),
        "phases[0].rounds[1][0].chunk: expected an integer in [0, 3), got -1",
        True,
    ),
    (_set(*T1, "src", value=4), "phases[1].rounds[2][1].src: expected an integer in [0, 4), got 4", False),
    (_set(*T1, "dst", value=-2), "phases[1].rounds[2][1].dst: expected an integer in [0, 4), got -2", True),
    (_set(*T1, "dst", value=3), "phases[1].rounds[2][1].dst: expected a rank other than src, got 3", False),
    (_set("straggler", value=4), "straggler: expected an integer in [0, 4), got 4", False),
    (_set("straggler", value=-1), "straggler: expected an integer in [0, 4), got -1", True),
    (_set("num_ranks", value=0), "num_ranks: expected an integer >= 2, got 0", True),
    # one rank: nothing to reduce; it was proved and exported to an XML of ngpus="1"
    (_set("num_ranks", value=1), "num_ranks: expected an integer >= 2, got 1", True),
    (_set("num_chunks", value=-3), "num_chunks: expected an integer >= 1, got -3", True),
    (
        _set("num_chunks", value=2),
        "phases[0].rounds[0][2].chunk: expected an integer in [0, 2), got 2",
        False,
    ),
    (
        _set("phases", 1, "ranks", 2, value=7),
        "phases[1].ranks[2]: expected an integer in [0, 4), got 7",
        False,
    ),
    (_set("phases", 1, "ranks", 3, value=3), "phases[1].ranks[3]: duplicate rank 3", True),
    # op, format tag, version, collective
    (_set(*T0, "op", value="sum"), 'phases[0].rounds[1][0].op: expected "copy" or "reduce", got "sum"', True),
    (
        _set(*T0, "op", value="COPY"),
        'phases[0].rounds[1][0].op: expected "copy" or "reduce", got "COPY"',
        True,
    ),
    (_set(*T0, "op", value=1), 'phases[0].rounds[1][0].op: expected "copy" or "reduce", got 1', True),
    # the parser shares the ints and ops of well-typed transfers: the others reach the checks as read
    (_set(*T0, "op", value=[]), 'phases[0].rounds[1][0].op: expected "copy" or "reduce", got an array', True),
    (
        _set(*T0, "chunk", value=2**70),
        f"phases[0].rounds[1][0].chunk: expected an integer in [0, 3), got {2**70}",
        False,
    ),
    (_set("version", value=2), "version: unsupported version 2 (this stragglar reads version 1)", True),
    (_set("version", value="1"), 'version: expected an integer, got "1"', True),
    (_set("format", value="msccl"), 'format: expected "stragglar-schedule", got "msccl"', True),
    (_set("collective", value="allgather"), 'collective: expected "allreduce", got "allgather"', True),
]


def _bad(mutate: Mutation) -> dict[str, Any]:
    doc = valid_doc()
    mutate(doc)
    return doc


def _message(excinfo: pytest.ExceptionInfo[ScheduleFormatError]) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    assert isinstance(excinfo.value, ValueError)
    return message


@pytest.mark.parametrize(
    ("mutate", "message", "expressible"), BAD_DOCUMENTS, ids=[m for _, m, _ in BAD_DOCUMENTS]
)
def test_bad_document_names_the_exact_place(mutate: Mutation, message: str, expressible: bool) -> None:
    doc = _bad(mutate)
    with pytest.raises(ScheduleFormatError) as excinfo:
        from_document(doc)
    assert _message(excinfo) == message
    with pytest.raises(ScheduleFormatError) as excinfo:
        loads(json.dumps(doc))
    assert _message(excinfo) == message


@pytest.mark.parametrize(
    ("mutate", "message", "expressible"), BAD_DOCUMENTS, ids=[m for _, m, _ in BAD_DOCUMENTS]
)
def test_schema_rejects_what_it_can_express(mutate: Mutation, message: str, expressible: bool) -> None:
    assert VALIDATOR.is_valid(_bad(mutate)) is not expressible


def test_version_is_checked_before_the_rest_of_the_document() -> None:
    doc = {"format": "stragglar-schedule", "version": 2, "ranks": 8}
    with pytest.raises(ScheduleFormatError) as excinfo:
        from_document(doc)
    assert _message(excinfo) == "version: unsupported version 2 (this stragglar reads version 1)"
    assert not VALIDATOR.is_valid(doc)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ([], "document: expected an object, got an array"),
        ("x", 'document: expected an object, got "x"'),
        ({"version": 1}, "format: missing required key"),
        ({"format": "stragglar-schedule"}, "version: missing required key"),
    ],
)
def test_bad_top_level(doc: object, message: str) -> None:
    with pytest.raises(ScheduleFormatError) as excinfo:
        from_document(doc)
    assert _message(excinfo) == message
    assert not VALIDATOR.is_valid(doc)


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ({"x": float("nan")}, "metadata.x: expected a finite number, got nan"),
        ({"a b": {"c": [1, {2}]}}, 'metadata["a b"].c[1]: expected a JSON value, got a Python set'),
        ({"ok": [{3: "x"}]}, "metadata.ok[0][3]: object keys must be strings"),
    ],
)
def test_metadata_must_be_json(metadata: dict[Any, Any], message: str) -> None:
    doc = valid_doc()
    doc["metadata"] = metadata
    with pytest.raises(ScheduleFormatError) as excinfo:
        from_document(doc)
    assert _message(excinfo) == message
    with pytest.raises(ScheduleFormatError) as excinfo:
        dumps(Schedule("ring", 2, 1, None, (), metadata=metadata))
    assert _message(excinfo) == message


def test_deeply_nested_metadata_is_an_error() -> None:
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    doc = valid_doc()
    doc["metadata"] = {"deep": deep}
    with pytest.raises(ScheduleFormatError) as excinfo:
        from_document(doc)
    assert _message(excinfo) == "metadata: nested too deeply"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "not JSON: Expecting value at line 1 column 1"),
        (
            '{"format": "stragglar-schedule",\n "version": 1',
            "not JSON: Expecting ',' delimiter at line 2 column 14",
        ),
        ('{"format": "stragglar-schedule"} x', "not JSON: Extra data at line 1 column 34"),
        ('{"metadata": NaN}', "not JSON: NaN is not a JSON value"),
        ('{"metadata": -Infinity}', "not JSON: -Infinity is not a JSON value"),
        ("[" * 100_000, "not JSON: nested too deeply"),
        ('{"metadata": ' + "9" * 5000 + "}", "not JSON: a number has 5000 digits; at most 4300 are read"),
    ],
    ids=["empty", "unterminated", "trailing", "nan", "infinity", "deep", "digits"],
)
def test_not_json(text: str, message: str) -> None:
    with pytest.raises(ScheduleFormatError) as excinfo:
        loads(text)
    assert _message(excinfo) == message


def test_a_document_of_more_objects_than_any_schedule_is_refused_before_parsing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """99 MB of ``{}`` in metadata took 4.8 GB and a minute to parse: the objects and arrays are
    counted first (here against 1,000 instead of 16,777,216)."""
    monkeypatch.setattr("stragglar.formats.schedule_json.MAX_CONTAINERS", 1_000)
    doc = json.loads(dumps(stragglar4()))
    loads(dumps(stragglar4()))  # the schedule itself is well within
    doc["metadata"] = {"junk": [{}] * 2_000}
    with pytest.raises(ScheduleFormatError) as excinfo:
        loads(json.dumps(doc))
    assert _message(excinfo).endswith(
        "objects and arrays (or braces and brackets in its strings): stragglar reads JSON documents of at "
        "most 1,000"
    )


def test_truncated_text() -> None:
    text = dumps(stragglar4())
    for cut in (1, len(text) // 2, len(text) - 1):
        with pytest.raises(ScheduleFormatError) as excinfo:
            loads(text[:cut])
        assert re.fullmatch(r"not JSON: .+ at line 1 column \d+", _message(excinfo))


def test_a_byte_order_mark_before_the_document_is_read_past(tmp_path: Path) -> None:
    """Some editors write one; Python's parser refused it with advice for programmers
    ("decode using utf-8-sig")."""
    path = tmp_path / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + dumps(stragglar4()).encode())
    assert read(path) == stragglar4()


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    with pytest.raises(ScheduleFormatError) as excinfo:
        read(path)
    assert _message(excinfo) == f"file not found: {path}"


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ScheduleFormatError) as excinfo:
        read(tmp_path)
    assert _message(excinfo) == f"{tmp_path} is not a regular file (stragglar reads schedules from files)"


def test_a_repeated_key_is_refused() -> None:
    text = dumps(synthesize("ring", 2)).replace('"chunk":0', '"chunk":0,"chunk":1', 1)
    with pytest.raises(ScheduleFormatError, match='key "chunk" appears twice in one object'):
        loads(text)


def test_sizes_past_the_limits_are_refused_before_any_phase_is_read() -> None:
    doc = to_document(synthesize("ring", 2))
    doc["num_chunks"], doc["phases"] = 3_000_000_000, "never looked at"
    with pytest.raises(
        ScheduleFormatError, match="num_chunks: 3000000000 chunks: stragglar handles at most 65536"
    ):
        from_document(doc)
    doc["num_ranks"], doc["num_chunks"] = 5000, 1
    with pytest.raises(ScheduleFormatError, match="num_ranks: 5000 ranks: stragglar handles at most 2048"):
        from_document(doc)


def test_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_bytes(b'{"format": "\xff"}')
    with pytest.raises(ScheduleFormatError) as excinfo:
        read(path)
    assert _message(excinfo) == f"{path}: not UTF-8 text: byte 12"


def test_errors_in_a_file_start_with_its_name(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text(json.dumps(_bad(_set(*T0, "chunk", value=9))), encoding="utf-8")
    with pytest.raises(ScheduleFormatError) as excinfo:
        read(path)
    assert _message(excinfo) == f"{path}: phases[0].rounds[1][0].chunk: expected an integer in [0, 3), got 9"
    path.write_text("{", encoding="utf-8")
    with pytest.raises(ScheduleFormatError) as excinfo:
        read(path)
    assert (
        _message(excinfo)
        == f"{path}: not JSON: Expecting property name enclosed in double quotes at line 1 column 2"
    )


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        (
            Schedule("ring", 2, 1, None, (Phase("p", (0, 1), ((Transfer(0, 1, 1),),)),)),
            "phases[0].rounds[0][0].chunk: expected an integer in [0, 1), got 1",
        ),
        (
            Schedule("ring", 2, 1, None, (Phase("p", (0, 1), ((), (Transfer(0, 1, 0, "sum"),))),)),  # type: ignore[arg-type]
            'phases[0].rounds[1][0].op: expected "copy" or "reduce", got "sum"',
        ),
        (Schedule("ring", 2, 1, 2, ()), "straggler: expected an integer in [0, 2), got 2"),
        (Schedule("ring", 2, 1, None, (Phase("p", (0, 0), ()),)), "phases[0].ranks[1]: duplicate rank 0"),
        (Schedule("", 2, 1, None, ()), 'algorithm: expected a non-empty string, got ""'),
        (
            Schedule("ring", 2, 1, None, (), collective="allgather"),
            'collective: expected "allreduce", got "allgather"',
        ),
    ],
)
def test_invalid_schedule_cannot_be_dumped(schedule: Schedule, message: str) -> None:
    for write in (dumps, to_document):  # the text is made in pieces, checked as the document is
        with pytest.raises(ScheduleFormatError) as excinfo:
            write(schedule)
        assert _message(excinfo) == message


def idle_rounds(count: int) -> dict[str, Any]:
    """The document of a 4-rank ring declared over 2048 ranks and 2048 chunks, its first phase
    followed by ``count`` idle rounds (the 8 MB file that kept verify busy for 13 seconds had
    2,000,000)."""
    doc = to_document(synthesize("ring", 4))
    doc["num_ranks"] = doc["num_chunks"] = 2048
    doc["phases"][0]["rounds"] += [[] for _ in range(count)]
    return doc


def idle_past(path: str) -> str:
    """The message for the idle round at ``path``, one past the limit."""
    return f"{path}: idle round 65,537 (no transfer): stragglar reads schedules of at most 65,536 idle rounds"


def test_idle_rounds_are_read_up_to_the_limit_in_all_phases() -> None:
    doc = idle_rounds(MAX_IDLE_ROUNDS - 1)
    doc["phases"][1]["rounds"].insert(2, [])
    schedule = from_document(doc)
    assert sum(not r for p in schedule.phases for r in p.rounds) == MAX_IDLE_ROUNDS
    assert loads(dumps(schedule)) == schedule
    doc["phases"][1]["rounds"].append([])
    with pytest.raises(ScheduleFormatError) as excinfo:
        from_document(doc)
    assert _message(excinfo) == idle_past(f"phases[1].rounds[{len(doc['phases'][1]['rounds']) - 1}]")


def test_idle_rounds_past_the_limit_stop_the_reading_there(tmp_path: Path) -> None:
    """Refused at the first idle round past the limit: what follows is not read (here a transfer out
    of range, which would be the error were it read), and the CLI says so in one line, exit 2."""
    doc = idle_rounds(2_000_000)
    doc["phases"][0]["rounds"].append([{"src": 0, "dst": 1, "chunk": 5000, "op": "copy"}])
    message = idle_past(f"phases[0].rounds[{3 + MAX_IDLE_ROUNDS}]")  # after the ring's 3 rounds
    with pytest.raises(ScheduleFormatError) as excinfo:
        from_document(doc)
    assert _message(excinfo) == message
    path = tmp_path / "idle.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    assert one_error(run("verify", str(path)), 2) == f"Error: {path}: {message}"


def test_a_schedule_past_the_idle_limit_cannot_be_dumped() -> None:
    """What the reader refuses the writer does not write."""
    schedule = Schedule("ring", 2, 1, None, (Phase("wait", (0, 1), ((),) * (MAX_IDLE_ROUNDS + 1)),))
    with pytest.raises(ScheduleFormatError) as excinfo:
        dumps(schedule)
    assert _message(excinfo) == idle_past(f"phases[0].rounds[{MAX_IDLE_ROUNDS}]")
