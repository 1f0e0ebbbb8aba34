"""Plans are compiled once per schedule and bound once per rank and buffer size."""

from __future__ import annotations

from stragglar.runtime import plan_for
from stragglar.synth import synthesize
from stragglar.verify import prove


def test_plans_are_cached_by_fingerprint_not_by_object() -> None:
    first = plan_for(prove(synthesize("stragglar", 10)), 3, 999)
    again = plan_for(prove(synthesize("stragglar", 10)), 3, 999)  # an equal schedule, a new object
    assert again is first
    assert plan_for(prove(synthesize("stragglar", 10)), 4, 999) is not first
