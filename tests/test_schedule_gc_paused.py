"""The phases that pause the cyclic collector (``stragglar.schedule.gc_paused``) hand it back as
they found it, on success and on error, whether the caller had it on or off."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stragglar import msccl, mscclpp
from stragglar.errors import InputError
from stragglar.model.predict import generated_profile
from stragglar.mscclpp.document import plan_document
from stragglar.schedule import gc_paused
from stragglar.synth import synthesize
from stragglar.verify import prove

PROOF = prove(synthesize("stragglar", 4))
XML = msccl.lower(PROOF)
PLAN = mscclpp.lower(PROOF).text

# (name, what succeeds, what fails inside the pause, what it raises)
CALLS: list[tuple[str, Callable[[], Any], Callable[[], Any] | None, type[Exception] | None]] = [
    ("mscclpp.prove", lambda: mscclpp.prove(PLAN), lambda: mscclpp.prove("{"), mscclpp.PlanFormatError),
    ("plan_document", lambda: plan_document(PLAN), lambda: plan_document("{"), mscclpp.PlanFormatError),
    ("msccl.prove", lambda: msccl.prove(XML), lambda: msccl.prove("<algo"), msccl.MscclFormatError),
    ("msccl.lower", lambda: msccl.lower(PROOF), None, None),
    ("mscclpp.lower", lambda: mscclpp.lower(PROOF), None, None),
    ("profile", lambda: generated_profile("ring", 4), lambda: generated_profile("ring", 1), InputError),
]


@pytest.fixture(params=[True, False], ids=["gc-on", "gc-off"])
def collector(request: pytest.FixtureRequest) -> Iterator[bool]:
    was = gc.isenabled()
    gc.enable() if request.param else gc.disable()
    try:
        yield request.param
    finally:
        gc.enable() if was else gc.disable()


def test_gc_paused_restores_the_collector(collector: bool) -> None:
    with gc_paused():
        assert not gc.isenabled()
    assert gc.isenabled() is collector
    with pytest.raises(KeyError), gc_paused():
        raise KeyError("x")
    assert gc.isenabled() is collector


@pytest.mark.parametrize(("name", "works", "fails", "error"), CALLS, ids=[c[0] for c in CALLS])
def test_each_paused_phase_restores_the_collector(
    collector: bool,
    name: str,
    works: Callable[[], Any],
    fails: Callable[[], Any] | None,
    error: type[Exception] | None,
) -> None:
    works()
    assert gc.isenabled() is collector, name
    if fails is not None:
        assert error is not None
        with pytest.raises(error):
            fails()
        assert gc.isenabled() is collector, name
