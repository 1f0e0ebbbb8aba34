"""One parse of a plan's text for its three readers: the prover, the size rule and the summary."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from stragglar.mscclpp import PlanDocument, PlanFormatError, describe, prove, read, size_rule, summarize

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
