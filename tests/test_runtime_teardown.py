"""Teardown: what stragglar registered runs before torch destroys a group, once, bounded by nothing
it can break (stragglar.runtime.teardown)."""

from __future__ import annotations

import gc
from dataclasses import dataclass, field
from typing import Any, cast

import pytest

pytest.importorskip("torch")

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from stragglar.runtime import teardown


class Owner:
    """Something that holds work on groups (a hook's state, say)."""


@dataclass
class Torch:
    """What the stand-in destroy_process_group was called with, and what graphs were released."""

    destroyed: list[Any] = field(default_factory=list)
    released: list[Any] = field(default_factory=list)


@pytest.fixture
def torch_(monkeypatch: pytest.MonkeyPatch) -> Torch:
    """torch's destroy_process_group replaced by one that records its group, the graphs' release
    recorded, and no finishers left from other tests; all restored afterwards."""
    seen = Torch()

    def destroy_process_group(group: Any = None) -> None:
        seen.destroyed.append(group)

    def release(group: Any) -> int:
        seen.released.append(group)
        return 0

    monkeypatch.setattr(c10d, "destroy_process_group", destroy_process_group)
    monkeypatch.setattr(dist, "destroy_process_group", destroy_process_group)
    monkeypatch.setattr(teardown, "_finishers", [])
    monkeypatch.setattr(teardown, "release", release)
    return seen


def test_install_wraps_both_names_once(torch_: Torch) -> None:
    original = c10d.destroy_process_group
    teardown.install()
    wrapper = c10d.destroy_process_group
    assert wrapper is not original and dist.destroy_process_group is wrapper
    assert wrapper.__wrapped__ is original  # type: ignore[attr-defined]
    teardown.install()
    assert c10d.destroy_process_group is wrapper and dist.destroy_process_group is wrapper
    dist.destroy_process_group()
    assert torch_.destroyed == [None]


def test_work_runs_before_its_group_or_all_groups_go_and_only_once(torch_: Torch) -> None:
    mine, other, third = (cast(Any, object()) for _ in range(3))
    owner = Owner()
    order: list[str] = []
    teardown.before_destroy(owner, (mine,), lambda o: order.append(f"finished {o is owner}"))

    dist.destroy_process_group(other)  # not a group the work is on
    assert order == [] and torch_.destroyed == [other] and torch_.released == [other]

    dist.destroy_process_group(group=mine)
    assert order == ["finished True"] and torch_.destroyed == [other, mine]

    teardown.before_destroy(owner, (third,), lambda o: order.append("again"))
    dist.destroy_process_group()  # every group: the work still registered runs, once
    dist.destroy_process_group()
    assert order == ["finished True", "again"]
    assert torch_.released[-2:] == [None, None]  # the graphs go before every destroy


def test_a_dead_owner_s_work_never_runs(torch_: Torch) -> None:
    owner = Owner()
    ran: list[object] = []
    teardown.before_destroy(owner, (), ran.append)
    del owner
    gc.collect()
    dist.destroy_process_group()
    assert ran == [] and torch_.destroyed == [None]


def test_a_failure_is_a_warning_and_the_group_still_goes(torch_: Torch) -> None:
    owner = Owner()

    def fail(_: object) -> None:
        raise RuntimeError("the peer is gone")

    ran: list[object] = []
    teardown.before_destroy(owner, (), fail)
    teardown.before_destroy(owner, (), ran.append)
    with pytest.warns(
        RuntimeWarning, match="could not finish its work before the process group went: the peer"
    ):
        dist.destroy_process_group()
    assert ran == [owner] and torch_.destroyed == [None]
