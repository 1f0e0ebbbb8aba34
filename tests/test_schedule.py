"""The core layer: facts derived from the IR, the fingerprint, atomic writes, errors and exit codes."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from stragglar.errors import IncorrectError, InputError, RunError, StragglarError
from stragglar.files import write_text
from stragglar.runtime import plan_for
from stragglar.schedule import Op, Phase, Schedule, Transfer, round_lower_bound
from stragglar.synth import ALGORITHMS, synthesize
from stragglar.verify import prove


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


def test_plans_are_cached_by_fingerprint_not_by_object() -> None:
    first = plan_for(prove(synthesize("stragglar", 10)), 3, 999)
    again = plan_for(prove(synthesize("stragglar", 10)), 3, 999)  # an equal schedule, a new object
    assert again is first
    assert plan_for(prove(synthesize("stragglar", 10)), 4, 999) is not first


def test_write_text_replaces_the_file_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "keep.json"
    write_text(path, "good\n")
    path.chmod(0o640)
    write_text(path, "better\n")
    assert path.read_text() == "better\n" and path.stat().st_mode & 0o777 == 0o640

    def full_disk(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_text(path, "lost\n")
    with pytest.raises(OSError, match="No space left"):
        write_text(tmp_path / "new.xml", "lost\n")
    assert path.read_text() == "better\n"  # the old file is untouched ...
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.json"]  # ... and nothing partial is left


def test_each_error_kind_has_its_exit_code() -> None:
    assert [e.exit_code for e in (StragglarError(), InputError(), IncorrectError(), RunError())] == [
        1,
        2,
        1,
        1,
    ]
    assert isinstance(InputError("x"), ValueError) and isinstance(RunError("x"), RuntimeError)


def test_write_text_through_a_link_replaces_its_target_and_keeps_the_link(tmp_path: Path) -> None:
    target, link = tmp_path / "v3.json", tmp_path / "latest.json"
    target.write_text("old\n")
    link.symlink_to(target.name)
    write_text(link, "new\n")
    assert link.is_symlink() and os.readlink(link) == target.name  # the link is still a link ...
    assert target.read_text() == "new\n"  # ... and its target has the new text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["latest.json", "v3.json"]
    dangling = tmp_path / "gone.json"
    dangling.symlink_to(tmp_path / "missing" / "x.json")
    with pytest.raises(InputError, match="symbolic link to a missing file"):
        write_text(dangling, "lost\n")
    assert dangling.is_symlink() and not (tmp_path / "missing").exists()
