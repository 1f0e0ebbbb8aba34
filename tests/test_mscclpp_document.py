"""One parse of a plan's text for its three readers: the prover, the size rule and the summary."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stragglar.mscclpp import PlanDocument, PlanFormatError, describe, prove, read, size_rule, summarize
from stragglar.mscclpp.document import _in_pieces

RING = (Path(__file__).parent / "fixtures" / "mscclpp" / "ring_ok.json").read_text()
READERS: dict[str, Callable[[str], object]] = {
    "prove": prove,
    "size_rule": size_rule,
    "summarize": summarize,
    "describe": describe,
}


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nope", "not JSON: Expecting value at line 1 column 1"),
        ('{"name": "x', "not JSON: Unterminated string starting at line 1 column 10"),
        ('{"name": ' + "7" * 5000 + "}", "not JSON: a number has 5000 digits; at most 4300 are read"),
        ("[" * 100_000, "not JSON: nested too deeply"),
        ('{"name": "\\udc00"}', "not valid Unicode: the string '\\\\udc00' has half of a surrogate pair"),
        ("[1, 2]", "not an MSCCL++ execution plan: the top level must be an object"),
        ('"plan"', "not an MSCCL++ execution plan: the top level must be an object"),
    ],
)
def test_every_reader_refuses_bad_text_in_the_same_words(reader: str, text: str, message: str) -> None:
    with pytest.raises(PlanFormatError) as info:
        READERS[reader](text)
    assert str(info.value) == message


def test_the_readers_take_the_document_in_place_of_the_text() -> None:
    document = read(RING)
    assert isinstance(document, PlanDocument) and read(document) is document
    assert size_rule(document) == size_rule(RING)
    assert summarize(document) == summarize(RING)
    assert describe(document) == describe(RING) == str(summarize(RING))
    assert prove(document).summary == prove(RING).summary


@pytest.mark.parametrize(
    "text",
    [
        '{"a": [1, 2 , 3 ], "a": {"b": []}, "c": [], "d": [[]]}\n',
        '{ "gpus" : [ {"id": 0} , {"id": 1} ] }',
        "{}",
        "[1]",
        '{"a": [1,]}',
        '{"a": 1,}',
        '{"a" 1}',
        '{"a": [1 2]}',
        '{"a": [1]} x',
        "\ufeff{}",
        '{"a": [NaN, 1e400, -0]}',
        '{"a": [' + "[" * 100_000 + "]" * 100_000 + "]}",
    ],
)
def test_the_plan_parsed_in_pieces_is_json_s_own(text: str) -> None:
    """The same value as json.loads (a key given twice keeps its first place and its last value),
    and the same error where the text is not JSON."""

    def parsed(parse: Any) -> tuple[str, str]:
        try:
            value = parse(text)
        except (ValueError, RecursionError) as exc:
            return type(exc).__name__, str(exc)
        return "value", json.dumps(value, allow_nan=True)

    assert parsed(_in_pieces) == parsed(json.loads)


def test_a_plan_parsed_in_pieces_is_the_plan_json_loads_gives() -> None:
    """A plan as stragglar writes it (and a foreign one) is the same document either way."""
    assert _in_pieces(RING) == json.loads(RING)
    from stragglar.artifacts import FORMATS, ExportOptions
    from stragglar.synth import synthesize
    from stragglar.verify import prove as prove_schedule

    text = FORMATS["mscclpp"].lower(prove_schedule(synthesize("stragglar", 6, chunks=8)), ExportOptions())
    assert _in_pieces(text) == json.loads(text)
