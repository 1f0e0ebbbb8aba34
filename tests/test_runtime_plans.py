"""Plans are compiled once per schedule and bound once per rank and buffer size."""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Hashable

from stragglar.runtime import plan_for
from stragglar.runtime.plans import cached, emptied
from stragglar.synth import synthesize
from stragglar.verify import prove


def test_plans_are_cached_by_fingerprint_not_by_object() -> None:
    first = plan_for(prove(synthesize("stragglar", 10)), 3, 999)
    again = plan_for(prove(synthesize("stragglar", 10)), 3, 999)  # an equal schedule, a new object
    assert again is first
    assert plan_for(prove(synthesize("stragglar", 10)), 4, 999) is not first


def test_a_cache_emptied_beside_a_lookup_never_fails_the_lookup() -> None:
    """A device state cache emptied as its group goes (``states.forget``) beside a call looking
    its state up: a plain ``clear`` between the lookup's find and move failed it with KeyError
    (about one run in one, with the interpreter switching threads every microsecond)."""
    cache: OrderedDict[Hashable, object] = OrderedDict()
    errors: list[str] = []
    done = threading.Event()

    def look() -> None:
        try:
            for _ in range(20_000):
                cached(cache, "setup", object, 4)
        except Exception as e:  # handed to the test
            errors.append(repr(e))
        finally:
            done.set()

    def empty() -> None:
        while not done.is_set():
            emptied(cache)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=look), threading.Thread(target=empty)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
