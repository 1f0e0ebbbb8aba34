"""The schedule IR: the facts derived from it (hidden phases, exposed rounds, the round bound) and
its fingerprint."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from stragglar.errors import ArgumentError, InputError
from stragglar.formats import schedule_json
from stragglar.schedule import Op, Phase, Schedule, Transfer, relabel_ranks, round_lower_bound
from stragglar.synth import ALGORITHMS, synthesize


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_hidden_phases_and_exposed_rounds(algorithm: str) -> None:
    s = synthesize(algorithm, 8)
    if s.straggler is None:  # Ring and RHD wait for whoever is late: nothing is hidden
        assert s.hidden_phases == 0 and s.exposed_rounds == s.num_rounds
    else:
        assert s.hidden_phases == 1 and s.straggler not in s.phases[0].ranks
        assert s.exposed_rounds == s.num_rounds - len(s.phases[0].rounds)
    if algorithm == "stragglar":
        assert s.exposed_rounds == round_lower_bound(8) == 9


def test_a_phase_without_the_straggler_after_it_joined_is_exposed() -> None:
    t = Transfer(0, 1, 0)
    s = Schedule(
        "x", 3, 1, 2, (Phase("a", (0, 1), ((t,),)), Phase("b", (0, 1, 2), ()), Phase("c", (0, 1), ((t,),)))
    )
    assert (s.hidden_phases, s.exposed_rounds, s.num_rounds) == (1, 1, 2)


def test_round_lower_bound_refuses_fewer_than_two_gpus() -> None:
    with pytest.raises(InputError, match="at least 2 GPUs"):
        round_lower_bound(1)


def test_fingerprint_follows_equality_and_ignores_metadata() -> None:
    a, b = synthesize("stragglar", 12), synthesize("stragglar", 12)
    assert a is not b and a == b and a.fingerprint == b.fingerprint
    assert replace(a, metadata={"note": "other"}).fingerprint == a.fingerprint
    first = a.phases[-1].rounds[-1]
    t = first[-1]
    changed = (*first[:-1], Transfer(t.src, t.dst, t.chunk, Op.REDUCE if t.op is Op.COPY else Op.COPY))
    other = replace(
        a, phases=(*a.phases[:-1], replace(a.phases[-1], rounds=(*a.phases[-1].rounds[:-1], changed)))
    )
    assert other != a and other.fingerprint != a.fingerprint
    assert replace(a, straggler=0).fingerprint != a.fingerprint
    assert synthesize("stragglar", 12, straggler=3).fingerprint != a.fingerprint


def test_fingerprint_is_the_same_in_another_process() -> None:
    code = "from stragglar.synth import synthesize; print(synthesize('stragglar', 9).fingerprint)"
    env = {**os.environ, "PYTHONHASHSEED": "123"}  # a different str hash must not matter
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert other.stdout.strip() == synthesize("stragglar", 9).fingerprint


def test_fingerprint_of_a_malformed_schedule_still_tells_transfers_apart() -> None:
    huge = Schedule("x", 2, 1, None, (Phase("p", (0, 1), ((Transfer(0, 1 << 70, 0),),)),))
    other = Schedule("x", 2, 1, None, (Phase("p", (0, 1), ((Transfer(0, 1 << 71, 0),),)),))
    assert huge.fingerprint != other.fingerprint


def test_a_relabelling_holds_plain_ints_whatever_the_mapping_was_made_of() -> None:
    """A NumPy mapping gave the same schedule another fingerprint (ranks that built the mapping
    differently failed as mismatched), and ``dumps`` refused its ranks."""
    np = pytest.importorskip("numpy")
    schedule = synthesize("stragglar", 4)
    plain, numpy = relabel_ranks(schedule, [1, 0, 2, 3]), relabel_ranks(schedule, np.array([1, 0, 2, 3]))
    assert numpy == plain and numpy.fingerprint == plain.fingerprint
    assert schedule_json.dumps(numpy) == schedule_json.dumps(plain)


@pytest.mark.parametrize(
    ("mapping", "error", "message"),
    [
        ([True, False, 2, 3], ArgumentError, r"^a rank of mapping must be an integer, got True \(bool\)$"),
        ([1.0, 0, 2, 3], ArgumentError, r"^a rank of mapping must be an integer, got 1\.0 \(float\)$"),
        (None, ArgumentError, r"^mapping must be a sequence of ranks, got NoneType$"),
        ("0123", ArgumentError, r"^mapping must be a sequence of ranks, got str$"),
        ([0, 0, 1, 2], InputError, r"^mapping must be a permutation of 0\.\.3$"),
    ],
)
def test_a_relabelling_refuses_what_is_not_a_permutation_of_ranks(
    mapping: object, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        relabel_ranks(synthesize("stragglar", 4), mapping)  # type: ignore[arg-type]


def test_numpy_integers_in_a_schedule_are_plain_ints(tmp_path: Path) -> None:
    """A header or phase of NumPy integers was proved, then refused by the writer, and
    fingerprinted apart from its equal."""
    import numpy as np

    from stragglar.verify import prove

    ref = synthesize("stragglar", 4)
    phases = tuple(replace(p, ranks=tuple(np.int64(r) for r in p.ranks)) for p in ref.phases)
    s = Schedule(ref.algorithm, np.int64(4), np.int32(3), np.int64(3), phases)
    assert all(type(x) is int for x in (s.num_ranks, s.num_chunks, s.straggler))
    assert all(type(r) is int for p in s.phases for r in p.ranks)
    assert s == ref and s.fingerprint == ref.fingerprint
    prove(s)
    schedule_json.write(s, tmp_path / "s.json")
    assert schedule_json.read(tmp_path / "s.json") == ref
    with pytest.raises((ArgumentError, InputError)):
        Schedule(ref.algorithm, True, 3, 3, ref.phases)
