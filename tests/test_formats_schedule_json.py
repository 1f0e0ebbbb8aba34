"""The version-1 JSON format: round trips, determinism, files, and the shipped JSON Schema (bad
documents and their precise errors: ``tests/test_formats_schedule_json_errors.py``)."""

from __future__ import annotations

import copy
import gc
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schedule_documents import SCHEDULES, SCHEMA, VALIDATOR, at, ring2, same, stragglar4, valid_doc

import stragglar.formats
from stragglar.errors import ArgumentError, InputError
from stragglar.formats.schedule_json import (
    MAX_INDENT,
    ScheduleFormatError,
    dumps,
    from_document,
    loads,
    parse,
    pieces,
    read,
    to_document,
    write,
)
from stragglar.schedule import Op, Phase, Schedule, Transfer
from stragglar.synth import synthesize

# ---------------------------------------------------------------------------- the shipped JSON Schema


def test_schema_is_a_valid_draft_2020_12_schema() -> None:
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert "num_chunks" in SCHEMA["description"]  # it says what it cannot express


# ---------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: s.algorithm)
def test_round_trip_through_text_and_document(schedule: Schedule) -> None:
    assert same(loads(dumps(schedule)), schedule)
    assert same(loads(dumps(schedule, indent=2)), schedule)
    assert same(from_document(to_document(schedule)), schedule)


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: s.algorithm)
def test_schema_accepts_every_valid_document(schedule: Schedule) -> None:
    assert VALIDATOR.is_valid(to_document(schedule))
    assert VALIDATOR.is_valid(json.loads(dumps(schedule)))


def test_round_trip_through_a_file(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    write(stragglar4(), path)
    assert path.read_text(encoding="utf-8") == dumps(stragglar4()) + "\n"
    assert same(read(path), stragglar4())
    assert same(read(str(path)), stragglar4())


def test_document_layout_is_the_public_interface() -> None:
    assert to_document(ring2()) == {
        "format": "stragglar-schedule",
        "version": 1,
        "collective": "allreduce",
        "algorithm": "ring",
        "num_ranks": 2,
        "num_chunks": 1,
        "straggler": None,
        "phases": [
            {"name": "ring", "ranks": [0, 1], "rounds": [[{"src": 1, "dst": 0, "chunk": 0, "op": "copy"}]]}
        ],
        "metadata": {},
    }
    assert list(to_document(ring2())) == [
        "format",
        "version",
        "collective",
        "algorithm",
        "num_ranks",
        "num_chunks",
        "straggler",
        "phases",
        "metadata",
    ]


def test_dumps_is_compact_by_default_and_indents_on_request() -> None:
    compact = dumps(ring2())
    assert compact.startswith('{"format":"stragglar-schedule","version":1,')
    assert "\n" not in compact and ", " not in compact
    pretty = dumps(ring2(), indent=2)
    assert pretty.startswith('{\n  "format": "stragglar-schedule",\n')
    assert json.loads(pretty) == json.loads(compact)


@pytest.mark.parametrize(("indent", "said"), [(True, "True"), ("  ", "'  '"), (1.5, "1.5")])
def test_dumps_refuses_an_indent_that_is_not_a_count_of_spaces(indent: object, said: str) -> None:
    """json.dumps would indent by 1 for True and by the string itself for a string."""
    with pytest.raises(
        ArgumentError, match=rf"^indent must be None or a count of spaces, got {re.escape(said)}$"
    ):
        dumps(ring2(), indent=indent)  # type: ignore[arg-type]
    assert dumps(ring2(), indent=0).startswith('{\n"format": "stragglar-schedule",\n')


@pytest.mark.parametrize(
    ("indent", "said"), [(-1, "-1"), (MAX_INDENT + 1, "17"), (10**9, "1000000000"), (10**30, "1" + "0" * 30)]
)
def test_dumps_refuses_an_indent_out_of_bounds_before_it_builds_anything(indent: int, said: str) -> None:
    """10**9 spaces a level built gigabytes of text (a MemoryError, or minutes), 10**30 was
    json's OverflowError."""
    with pytest.raises(
        InputError, match=f"^indent (must be from 0 to {MAX_INDENT} spaces|must fit in 64 bits), got {said}"
    ):
        dumps(ring2(), indent=indent)


def test_dumps_takes_any_integral_indent_up_to_the_bound() -> None:
    assert dumps(ring2(), indent=np.int64(2)) == dumps(ring2(), indent=2)
    assert json.loads(dumps(ring2(), indent=MAX_INDENT)) == json.loads(dumps(ring2()))


@pytest.mark.parametrize("path", [None, 3, b"s.json"])
def test_read_refuses_what_is_not_a_path(path: object) -> None:
    with pytest.raises(ArgumentError, match=rf"^read needs a file's path, got {type(path).__name__}$"):
        read(path)  # type: ignore[arg-type]


def waits() -> Schedule:
    """Phases without rounds (first, between and last) and idle rounds: text between two rounds."""
    busy = Phase("busy", (0, 1, 2), ((), (Transfer(0, 1, 0, Op.REDUCE),), (), (Transfer(1, 0, 1),)))
    return Schedule("wait ✓", 3, 2, None, (Phase("a", (), ()), busy, Phase("b", (0, 1), ()), busy))


@pytest.mark.parametrize(
    "schedule", [*SCHEDULES, waits(), synthesize("stragglar", 9)], ids=lambda s: s.algorithm
)
def test_pieces_are_the_compact_text_one_a_round(schedule: Schedule) -> None:
    """The commands format a schedule in pieces so that a bar can move between them (one
    json.dumps of N = 1024's held the GIL for 1.9 s): the text is one json.dumps's of the
    document, byte for byte, and the pieces count the rounds."""
    parts = list(pieces(schedule))
    document = json.dumps(to_document(schedule), separators=(",", ":"), ensure_ascii=False)
    assert "".join(parts) == dumps(schedule) == document
    assert len(parts) == max(1, schedule.num_rounds) and all(parts)


def test_dumps_is_deterministic() -> None:
    text = dumps(stragglar4())
    assert dumps(stragglar4()) == text
    assert dumps(loads(text)) == text
    assert dumps(stragglar4(), indent=2) == dumps(stragglar4(), indent=2)


def test_metadata_key_order_does_not_change_the_text() -> None:
    def with_meta(meta: dict[str, Any]) -> Schedule:
        return Schedule("ring", 2, 1, None, (), metadata=meta)

    a = dumps(with_meta({"b": 1, "a": {"y": 2, "x": 3}}))
    b = dumps(with_meta({"a": {"x": 3, "y": 2}, "b": 1}))
    assert a == b
    assert a.endswith('"metadata":{"a":{"x":3,"y":2},"b":1}}')


def test_metadata_tuples_come_back_as_lists() -> None:
    s = Schedule("ring", 2, 1, None, (), metadata={"shape": (2, 3), "nested": [(1,)]})
    assert loads(dumps(s)).metadata == {"shape": [2, 3], "nested": [[1]]}


def test_loads_gives_plain_ops_and_tuples() -> None:
    s = loads(dumps(stragglar4()))
    t = s.phases[1].rounds[0][1]
    assert t == Transfer(0, 3, 1, Op.COPY) and t.op is Op.COPY
    assert isinstance(s.phases[0].ranks, tuple) and isinstance(s.phases[0].rounds[0], tuple)


def test_a_parse_shares_the_integers_and_ops_of_its_transfers() -> None:
    """The decoder makes an int for every number past 256 and a str for every value: 251 of the
    411 MiB that N = 1024's parse took beside its text, before they were shared."""
    a, b = parse(
        '[{"src": 300, "dst": 1000, "chunk": 4000, "op": "reduce"}, {"src": 300, "dst": 1000, '
        '"chunk": 4000, "op": "reduce"}]'
    )
    assert a == b == (300, 1000, 4000, "reduce")
    assert all(x is y for x, y in zip(a, b, strict=True))


def test_from_document_consumes_the_rounds_only_when_asked() -> None:
    doc = to_document(stragglar4())
    original = copy.deepcopy(doc)
    assert from_document(doc) == stragglar4() and doc == original  # a caller's document stays as it was
    assert from_document(doc, consume=True) == stragglar4()
    assert [p["rounds"] for p in doc["phases"]] == [[None] * len(p.rounds) for p in stragglar4().phases]


@pytest.mark.parametrize("enabled", [True, False])
def test_loading_restores_the_garbage_collector(enabled: bool) -> None:
    text = dumps(stragglar4())
    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        loads(text)
        assert gc.isenabled() is enabled
        with pytest.raises(ScheduleFormatError):
            loads(text.replace('"chunk":2', '"chunk":7'))
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


def test_package_reexports_the_native_format() -> None:
    assert stragglar.formats.ScheduleFormatError is ScheduleFormatError
    assert stragglar.formats.read is read and stragglar.formats.write is write


# ---------------------------------------------------------------------------- files


def test_metadata_is_optional_and_absent_means_empty() -> None:
    doc = to_document(synthesize("ring", 3))
    del doc["metadata"]
    assert from_document(doc) == synthesize("ring", 3) and from_document(doc).metadata == {}


# ---------------------------------------------------------------------------- ops written


def test_plain_string_ops_are_written_as_ops() -> None:
    plain = Schedule("ring", 2, 1, None, (Phase("p", (0, 1), ((Transfer(0, 1, 0, "reduce"),),)),))  # type: ignore[arg-type]
    assert loads(dumps(plain)).phases[0].rounds[0][0].op is Op.REDUCE


# ---------------------------------------------------------------------------- properties

JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
)
JSON_VALUES = st.recursive(
    JSON_LEAVES,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3)
    ),
    max_leaves=8,
)


@st.composite
def schedules(draw: st.DrawFn) -> Schedule:
    n = draw(st.integers(2, 6))
    c = draw(st.integers(1, 4))

    def transfer(src: int, other: int, chunk: int, op: Op) -> Transfer:
        return Transfer(src, other if other < src else other + 1, chunk, op)

    transfers = st.builds(
        transfer,
        st.integers(0, n - 1),
        st.integers(0, max(n - 2, 0)),
        st.integers(0, c - 1),
        st.sampled_from(Op),
    )
    rounds = st.lists(st.lists(transfers, max_size=4 if n > 1 else 0).map(tuple), max_size=3).map(tuple)
    phase = st.builds(
        Phase, st.text(max_size=8), st.lists(st.integers(0, n - 1), unique=True).map(tuple), rounds
    )
    return Schedule(
        draw(st.text(min_size=1, max_size=8)),
        n,
        c,
        draw(st.none() | st.integers(0, n - 1)),
        tuple(draw(st.lists(phase, max_size=3))),
        metadata=draw(st.dictionaries(st.text(max_size=6), JSON_VALUES, max_size=4)),
    )


@settings(deadline=None)
@given(schedules())
def test_property_round_trip_and_determinism(schedule: Schedule) -> None:
    text = dumps(schedule)
    back = loads(text)
    assert same(back, schedule)
    assert dumps(back) == text
    assert same(loads(dumps(schedule, indent=1)), schedule)
    assert VALIDATOR.is_valid(json.loads(text))


def _paths(doc: Any, prefix: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    paths = [prefix] if prefix else []
    for key, value in items:
        paths += _paths(value, (*prefix, key))
    return paths


def _render(path: tuple[str | int, ...]) -> str:
    return "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in path).lstrip(".")


def _within(message: str, path: tuple[str | int, ...]) -> bool:
    place = _render(path)
    return message.startswith(place) and message[len(place)] in ".[:"


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_property_any_mutation_is_accepted_or_named_precisely(data: st.DataObject) -> None:
    doc = valid_doc()
    path = data.draw(st.sampled_from(_paths(doc)))
    if isinstance(path[-1], str) and data.draw(st.booleans()):
        del at(doc, path[:-1])[path[-1]]
    else:
        at(doc, path[:-1])[path[-1]] = data.draw(
            JSON_VALUES | st.integers(-1, 4) | st.sampled_from(["copy", "reduce"])
        )
    original = copy.deepcopy(doc)
    try:
        schedule = from_document(doc)
    except ScheduleFormatError as e:
        message = str(e)
        assert "\n" not in message
        if path[0] not in ("num_ranks", "num_chunks"):  # those move the bounds of other fields
            assert _within(message, path if len(path) == 1 else path[:-1]), (path, message)
    else:
        assert VALIDATOR.is_valid(doc)  # the schema accepts whatever the reader accepts
        assert to_document(schedule) == {"metadata": {}, **doc}  # metadata may be left out
    assert doc == original  # reading never changes the document


def test_transfer_objects_in_any_key_order_read_alike() -> None:
    """The reader keeps transfer objects written in the usual key order compactly; other orders,
    mixed in one round, must read the same."""
    doc = to_document(synthesize("ring", 3))
    first = doc["phases"][0]["rounds"][0][0]
    doc["phases"][0]["rounds"][0][0] = {
        "op": first["op"],
        "chunk": first["chunk"],
        "dst": first["dst"],
        "src": first["src"],
    }
    assert loads(json.dumps(doc)) == synthesize("ring", 3)
    doc["metadata"] = {"example": {"src": 0, "dst": 1, "chunk": 2, "op": "copy"}}
    assert loads(json.dumps(doc)).metadata == {"example": {"chunk": 2, "dst": 1, "op": "copy", "src": 0}}
    doc["phases"][0]["rounds"][0][1] = {"src": 0, "dst": 0, "chunk": 1, "op": "copy"}
    with pytest.raises(
        ScheduleFormatError, match=r"phases\[0\]\.rounds\[0\]\[1\]\.dst: expected a rank other than src"
    ):
        loads(json.dumps(doc))


def test_the_deprecated_module_name_still_imports_the_format_and_warns() -> None:
    """``stragglar.formats.json`` was this module's name (a standard library's, imported beside it):
    code written against it still runs, and each name it takes from it says what to import."""
    import stragglar.formats.json as old  # type: ignore[import-not-found, unused-ignore]

    said = r"^stragglar\.formats\.json\.write is deprecated: use stragglar\.formats\.schedule_json\.write$"
    with pytest.warns(DeprecationWarning, match=said):
        assert old.write is write
    with pytest.warns(DeprecationWarning):
        from stragglar.formats.json import read as old_read  # type: ignore[import-not-found, unused-ignore]
    assert old_read is read
    from stragglar.formats import schedule_json

    assert old.__spec__ is schedule_json.__spec__ and "read" in dir(old)  # as the import system asks


def test_bytes_are_read_as_utf8_as_json_loads_reads_them() -> None:
    """``loads(b"...")`` raised "cannot use a string pattern on a bytes-like object"."""
    schedule = synthesize("stragglar", 5)
    text = dumps(schedule)
    assert loads(text.encode()) == schedule
    assert loads(b"\xef\xbb\xbf" + text.encode()) == schedule  # a byte order mark
    with pytest.raises(ScheduleFormatError, match=r"^not UTF-8 text: byte 1$"):
        loads(b"[\xff]")


@pytest.mark.parametrize(
    ("op", "said"),
    [
        ("y" * 100_000, 'got "' + "y" * 80 + '..." (100,000 characters)'),
        ("y" * 80, 'got "' + "y" * 80 + '"'),
        (10**100, "got " + "1" + "0" * 79 + "... (101 characters)"),
    ],
)
def test_a_long_bad_value_is_quoted_to_80_characters_and_the_rest_counted(op: object, said: str) -> None:
    """As every message echoes what a file holds: it was cut at 37 characters, uncounted."""
    doc = valid_doc()
    doc["phases"][0]["rounds"][0][0]["op"] = op
    with pytest.raises(ScheduleFormatError) as caught:
        loads(json.dumps(doc))
    assert str(caught.value).endswith(said), str(caught.value)
