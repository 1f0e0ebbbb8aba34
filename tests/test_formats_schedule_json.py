"""The version-1 JSON format: round trips, determinism, precise errors, and the shipped JSON Schema."""

from __future__ import annotations

import copy
import gc
import importlib.resources
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import stragglar.formats
from stragglar.formats.schedule_json import (
    ScheduleFormatError,
    dumps,
    from_document,
    loads,
    read,
    to_document,
    write,
)
from stragglar.schedule import Op, Phase, Schedule, Transfer
from stragglar.synth import synthesize

C, R = Op.COPY, Op.REDUCE

# ---------------------------------------------------------------------------- hand-built schedules


def _stragglar4() -> Schedule:
    """4 ranks, 3 chunks, straggler 3: a hidden phase without it, then one with it."""
    hidden = Phase(
        "reduce-scatter",
        (0, 1, 2),
        (
            (Transfer(0, 1, 0, R), Transfer(1, 2, 1, R), Transfer(2, 0, 2, R)),
            (Transfer(1, 0, 2, R), Transfer(2, 1, 0, R)),
        ),
    )
    exposed = Phase(
        "allreduce",
        (3, 0, 1, 2),
        (
            (Transfer(3, 0, 0, R), Transfer(0, 3, 1, C), Transfer(1, 2, 2, C)),
            (),
            (Transfer(2, 3, 2, C), Transfer(3, 1, 0, C)),
        ),
    )
    metadata = {
        "generator": "hand-built",
        "params": {"n": 4, "hidden": True, "weights": [0.5, -1.25e-3]},
        "note": None,
        "name": "ñ ✓",
    }
    return Schedule("stragglar", 4, 3, 3, (hidden, exposed), metadata=metadata)


def _ring2() -> Schedule:
    return Schedule("ring", 2, 1, None, (Phase("ring", (0, 1), ((Transfer(1, 0, 0, C),),)),))


def _lonely() -> Schedule:
    """One rank, no phases, empty metadata: the smallest valid schedule."""
    return Schedule("direct", 1, 1, None, ())


SCHEDULES = [_stragglar4(), _ring2(), _lonely()]


def _same(a: Schedule, b: Schedule) -> bool:
    """Equal including metadata (which ``Schedule.__eq__`` ignores) and op types."""
    ops_a = [type(t.op) for _, _, t in a.transfers()]
    ops_b = [type(t.op) for _, _, t in b.transfers()]
    return a == b and dict(a.metadata) == dict(b.metadata) and ops_a == ops_b


# ---------------------------------------------------------------------------- the shipped JSON Schema


def _schema() -> dict[str, Any]:
    resource = importlib.resources.files("stragglar.formats").joinpath("schedule.schema.json")
    schema: dict[str, Any] = json.loads(resource.read_text(encoding="utf-8"))
    return schema


SCHEMA = _schema()
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def test_schema_is_a_valid_draft_2020_12_schema() -> None:
    assert SCHEMA["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    assert "num_chunks" in SCHEMA["description"]  # it says what it cannot express


# ---------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: s.algorithm)
def test_round_trip_through_text_and_document(schedule: Schedule) -> None:
    assert _same(loads(dumps(schedule)), schedule)
    assert _same(loads(dumps(schedule, indent=2)), schedule)
    assert _same(from_document(to_document(schedule)), schedule)


@pytest.mark.parametrize("schedule", SCHEDULES, ids=lambda s: s.algorithm)
def test_schema_accepts_every_valid_document(schedule: Schedule) -> None:
    assert VALIDATOR.is_valid(to_document(schedule))
    assert VALIDATOR.is_valid(json.loads(dumps(schedule)))


def test_round_trip_through_a_file(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    write(_stragglar4(), path)
    assert path.read_text(encoding="utf-8") == dumps(_stragglar4()) + "\n"
    assert _same(read(path), _stragglar4())
    assert _same(read(str(path)), _stragglar4())


def test_document_layout_is_the_public_interface() -> None:
    assert to_document(_ring2()) == {
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
    assert list(to_document(_ring2())) == [
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
    compact = dumps(_ring2())
    assert compact.startswith('{"format":"stragglar-schedule","version":1,')
    assert "\n" not in compact and ", " not in compact
    pretty = dumps(_ring2(), indent=2)
    assert pretty.startswith('{\n  "format": "stragglar-schedule",\n')
    assert json.loads(pretty) == json.loads(compact)


def test_dumps_is_deterministic() -> None:
    text = dumps(_stragglar4())
    assert dumps(_stragglar4()) == text
    assert dumps(loads(text)) == text
    assert dumps(_stragglar4(), indent=2) == dumps(_stragglar4(), indent=2)


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
    s = loads(dumps(_stragglar4()))
    t = s.phases[1].rounds[0][1]
    assert t == Transfer(0, 3, 1, Op.COPY) and t.op is Op.COPY
    assert isinstance(s.phases[0].ranks, tuple) and isinstance(s.phases[0].rounds[0], tuple)


@pytest.mark.parametrize("enabled", [True, False])
def test_loading_restores_the_garbage_collector(enabled: bool) -> None:
    text = dumps(_stragglar4())
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


# ---------------------------------------------------------------------------- bad documents

Mutation = Callable[[dict[str, Any]], None]


def _at(doc: Any, path: tuple[str | int, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


def _set(*path: str | int, value: Any) -> Mutation:
    def mutate(doc: dict[str, Any]) -> None:
        _at(doc, path[:-1])[path[-1]] = value

    return mutate


def _del(*path: str | int) -> Mutation:
    def mutate(doc: dict[str, Any]) -> None:
        del _at(doc, path[:-1])[path[-1]]

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
    (_set("num_ranks", value="4"), 'num_ranks: expected an integer >= 1, got "4"', True),
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
    (_set("num_ranks", value=0), "num_ranks: expected an integer >= 1, got 0", True),
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
    (_set("version", value=2), "version: unsupported version 2 (this stragglar reads version 1)", True),
    (_set("version", value="1"), 'version: expected an integer, got "1"', True),
    (_set("format", value="msccl"), 'format: expected "stragglar-schedule", got "msccl"', True),
    (_set("collective", value="allgather"), 'collective: expected "allreduce", got "allgather"', True),
]


def _valid_doc() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(dumps(_stragglar4()))
    return doc


def _bad(mutate: Mutation) -> dict[str, Any]:
    doc = _valid_doc()
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
    doc = _valid_doc()
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
    doc = _valid_doc()
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
    ],
    ids=["empty", "unterminated", "trailing", "nan", "infinity", "deep"],
)
def test_not_json(text: str, message: str) -> None:
    with pytest.raises(ScheduleFormatError) as excinfo:
        loads(text)
    assert _message(excinfo) == message


def test_truncated_text() -> None:
    text = dumps(_stragglar4())
    for cut in (1, len(text) // 2, len(text) - 1):
        with pytest.raises(ScheduleFormatError) as excinfo:
            loads(text[:cut])
        assert re.fullmatch(r"not JSON: .+ at line 1 column \d+", _message(excinfo))


# ---------------------------------------------------------------------------- files


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    with pytest.raises(ScheduleFormatError) as excinfo:
        read(path)
    assert _message(excinfo) == f"file not found: {path}"


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(ScheduleFormatError) as excinfo:
        read(tmp_path)
    assert _message(excinfo) == f"{tmp_path} is not a regular file (stragglar reads schedules from files)"


def test_metadata_is_optional_and_absent_means_empty() -> None:
    doc = to_document(synthesize("ring", 3))
    del doc["metadata"]
    assert from_document(doc) == synthesize("ring", 3) and from_document(doc).metadata == {}


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


# ------------------------------------------------------------------ schedules that cannot be written


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
    with pytest.raises(ScheduleFormatError) as excinfo:
        dumps(schedule)
    assert _message(excinfo) == message


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
    n = draw(st.integers(1, 6))
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
    assert _same(back, schedule)
    assert dumps(back) == text
    assert _same(loads(dumps(schedule, indent=1)), schedule)
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
    doc = _valid_doc()
    path = data.draw(st.sampled_from(_paths(doc)))
    if isinstance(path[-1], str) and data.draw(st.booleans()):
        del _at(doc, path[:-1])[path[-1]]
    else:
        _at(doc, path[:-1])[path[-1]] = data.draw(
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


def test_the_deprecated_module_name_still_imports_the_format() -> None:
    """``stragglar.formats.json`` was this module's name (a standard library's, imported beside it):
    code written against it still runs."""
    import stragglar.formats.json as old  # type: ignore[import-not-found, unused-ignore]

    from stragglar.formats import schedule_json

    assert old is schedule_json and old.write is write
